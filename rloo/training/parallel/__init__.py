"""Processes and transport: data-parallel collectives (``distributed.py``: ``Ranks``), FSDP2 sharding
(``fsdp.py``), the rollout worker process (``rollout_worker.py``) and the weights sent to it
(``weight_sync.py``)."""
