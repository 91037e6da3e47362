"""Completions out: the KV-cached sampler, logits processors, and log-probs of completions."""
