"""Sampling on vLLM (``use_vllm=True``): the sampler rloo calls (:mod:`.sampler`), the client of a
``rloo vllm-serve`` server (:mod:`.client`), the server itself, run in vLLM's environment (:mod:`.server`),
and an engine in the training process (:mod:`.colocate`). Nothing here imports vLLM at import time."""
