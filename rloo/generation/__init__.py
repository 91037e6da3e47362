"""Completions out: the sampling engines (rloo's KV-cached sampler and its logits processors, vLLM: server,
client, colocated), their declared contract and the engine table (:mod:`rloo.generation.engines`). The
training forward that scores completions is :mod:`rloo.forward`."""
