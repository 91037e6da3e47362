"""``python -m rloo.config``: print the table of RLOOConfig fields that docs/configuration.md holds between its
``config-fields`` markers (``scripts/regen_docs.py`` writes it there; ``tests/config/test_docs.py`` checks it)."""

from rloo.config.docs import fields_markdown

print(fields_markdown())
