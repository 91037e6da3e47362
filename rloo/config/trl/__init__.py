"""TRL compatibility: the names, keywords and classes a TRL script or tutorial writes that ``RLOOConfig``
translates, refuses with the reason, or passes through to transformers.

- :mod:`.legacy`: older TRL names (``kl_coef``, ``rloo_k``, ...), accepted or refused saying what to set;
  the trainer arguments rloo cannot honour.
- :mod:`.grpo_names`: GRPO's ``loss_type``, ``scale_rewards``, ``importance_sampling_level`` as rloo's knobs.
- :mod:`.elsewhere`: TRL and transformers fields rloo does not have, each with what rloo does instead.
- :mod:`.passthrough`: the keyword mappings passed to transformers (``model_init_kwargs``,
  ``generation_kwargs``), made recordable in ``config.yaml``.
- :mod:`.grpo_config`: ``GRPOConfig``, ``RLOOConfig`` with TRL's GRPO defaults.
- :mod:`.defaults`: the defaults that differ from TRL's on purpose, each with its reason (the migration docs'
  table, the start-up line), and TRL's spellings of a default rloo reads as its own.
"""
