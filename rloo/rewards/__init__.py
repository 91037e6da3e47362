"""Scores: built-in reward functions, reward models, running completions' code in a sandbox,
calling and checking reward functions, and the one resolver that turns names, paths and
callables into reward functions."""
