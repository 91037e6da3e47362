"""Prompts in: loading and validating prompt datasets, rendering and tokenizing prompts,
and the resumable prompt sampler."""
