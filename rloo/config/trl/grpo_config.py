"""``GRPOConfig``: ``RLOOConfig`` with TRL 1.16's ``GRPOConfig`` defaults, so a GRPO script runs
with its imports changed (``from rloo import GRPOConfig, GRPOTrainer``).

It is the same config with two other defaults, ``num_generations=8`` (TRL's GRPOConfig's; RLOOConfig's is
TRL's RLOOConfig's 2) and ``preset='trl_grpo'``: group mean/std advantages
(``scale_rewards='group'``), per-token ratio, ``loss_type='dapo'`` (``token_mean``), ``beta=0``.
GRPO's own names (``loss_type``, ``scale_rewards``, ``importance_sampling_level``) are accepted by
both classes (:mod:`rloo.config.trl.grpo_names`). What differs from TRL's GRPO is listed in
docs/migrating-from-trl.md: no CISPO/SAPO/GSPO-style objectives, and
with ``beta > 0`` the KL term is not multiplied by the ratio (TRL's ``use_bias_correction_kl``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rloo.config.fields.declare import option
from rloo.config.presets import PRESETS
from rloo.config.rloo_config import RLOOConfig


@dataclass
class GRPOConfig(RLOOConfig):
    """``RLOOConfig`` with GRPO's defaults (``preset='trl_grpo'``); every field is ``RLOOConfig``'s."""

    num_generations: int = option(
        8, "Completions per prompt (K), >= 2 (GRPOConfig's default is TRL 1.16 GRPOConfig's: 8).", trl="num_generations"
    )
    preset: str = option(
        "trl_grpo",
        f"Algorithm preset filling every algorithm knob left None: one of {', '.join(PRESETS)}; GRPOConfig's "
        "default trl_grpo is the math of TRL 1.16's GRPOConfig defaults.",
    )
