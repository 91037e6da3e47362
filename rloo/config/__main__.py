"""``python -m rloo.config``: print the README's table of RLOOConfig fields (paste it between
the ``config-fields`` markers; ``tests/test_config_docs.py`` checks they match)."""

from rloo.config.docs import fields_markdown

print(fields_markdown())
