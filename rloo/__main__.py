"""``python -m rloo``: the ``rloo`` command line (works under ``torchrun`` / ``accelerate launch``)."""

from rloo.cli import main

main()
