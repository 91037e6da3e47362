"""Phases 1-2 of the step: where rollouts come from. ``source.py``: the ``RolloutSource`` protocol and the
in-process sources (synchronous, pipelined); ``workers.py``: the source sampled by worker processes;
``versions.py``: which policy weights sample which batch; ``build.py``: the run's source from its config;
``dynamic_sampling.py``: batches refilled with groups that have a signal; ``groups.py``: the whole-group
operations they use."""
