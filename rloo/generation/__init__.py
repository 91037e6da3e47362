"""Completions out: the KV-cached sampler, logits processors, log-probs of completions, vLLM (server, client)."""
