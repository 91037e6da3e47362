"""DAPO's soft overlong punishment (Eq. 13 of arXiv:2503.14476), as TRL's
``get_soft_overlong_punishment``: the built-in ``soft_overlong_punishment``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

RewardFunction = Callable[..., list[float]]


def soft_overlong_punishment(
    max_completion_len: int = 1280, soft_punish_cache: int = 256
) -> Callable[..., list[float]]:
    """A reward named ``soft_overlong_punishment`` that penalizes long completions, never rewards
    short ones. With ``L = len(completion_ids)``, ``L_max = max_completion_len``, ``L_c = soft_punish_cache``::

        0                            if L <= L_max - L_c
        ((L_max - L_c) - L) / L_c    if L_max - L_c < L <= L_max   (from 0 down to -1)
        -1                           if L > L_max

    The defaults are those TRL's ``trl rloo`` script uses (1280, 256). ``L_c = 0`` is a hard limit.
    """
    if max_completion_len < 1 or not 0 <= soft_punish_cache <= max_completion_len:
        raise ValueError(
            f"soft_overlong_punishment(max_completion_len={max_completion_len}, soft_punish_cache="
            f"{soft_punish_cache}): need max_completion_len >= 1 and 0 <= soft_punish_cache <= max_completion_len"
        )
    free = max_completion_len - soft_punish_cache

    def reward(completion_ids: Sequence[Sequence[int]], **kwargs: Any) -> list[float]:
        rewards = []
        for ids in completion_ids:
            length = len(ids)
            if length <= free:
                rewards.append(0.0)
            elif length <= max_completion_len:
                rewards.append((free - length) / soft_punish_cache)
            else:
                rewards.append(-1.0)
        return rewards

    reward.__name__ = reward.__qualname__ = "soft_overlong_punishment"
    return reward
