"""``python -m rloo.config``: print the README's table of RLOOConfig fields (paste it between
the ``config-fields`` markers; ``tests/config/test_docs.py`` checks they match)."""

from rloo.config.docs import fields_markdown

print(fields_markdown())
