"""The RL math, pure torch: advantages, KL, policy losses, masks, statistics, the objective.

Modules here import nothing but ``torch``, the standard library and each other
(``tests/test_layout.py`` checks it): tensors and scalars in, tensors out.
"""
