"""Phases 1-2 of the step: where rollouts come from (``source.py``: ``RolloutSource``, the synchronous,
pipelined and worker sources), dynamic sampling's refilled batches (``dynamic_sampling.py``) and the
whole-group operations they use (``groups.py``)."""
