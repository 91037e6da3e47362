"""Scores: built-in reward functions, reward models, running completions' code in a sandbox,
calling and checking reward functions, and the one resolver that turns names, paths and
callables into reward functions."""

from rloo.rewards.builtins import accuracy_reward, reasoning_accuracy_reward, think_format_reward
from rloo.rewards.overlong import soft_overlong_punishment as get_soft_overlong_punishment

# TRL's scripts import these from trl.rewards; `from rloo.rewards import ...` works the same
__all__ = ["accuracy_reward", "get_soft_overlong_punishment", "reasoning_accuracy_reward", "think_format_reward"]
