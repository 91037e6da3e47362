"""``GRPOConfig``: ``RLOOConfig`` with TRL 1.16's ``GRPOConfig`` defaults, so a GRPO script runs
with its imports changed (``from rloo import GRPOConfig, GRPOTrainer``).

It is the same config with two other defaults, ``num_generations=8`` (TRL's GRPOConfig's; RLOOConfig's is
TRL's RLOOConfig's 2) and ``preset='trl_grpo'``: group mean/std advantages
(``scale_rewards='group'``), per-token ratio, ``loss_type='dapo'`` (``token_mean``), ``beta=0``.
GRPO's own names (``loss_type``, ``scale_rewards``, ``importance_sampling_level``) are accepted by
both classes (:mod:`rloo.config.trl.grpo_names`). What differs from TRL's GRPO is listed in
docs/migrating-from-trl.md: no CISPO/SAPO/GSPO-style objectives, and
with ``beta > 0`` the KL term is not multiplied by the ratio (TRL's ``use_bias_correction_kl``).

``AsyncGRPOConfig``: ``GRPOConfig`` with TRL 1.16 ``AsyncGRPOConfig``'s asynchronous defaults (its trainer is
``trl.experimental.async_grpo.AsyncGRPOTrainer``): each batch sampled with weights up to ``max_staleness=4``
optimizer steps old (TRL's default), by one rollout worker process that samples while the trainer steps (TRL's
samples on a vLLM server, which rloo's asynchronous generation does not use: ``use_vllm`` with ``max_staleness``
is refused). Its other fields are translated or refused (:mod:`rloo.config.trl.elsewhere`).
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


@dataclass
class AsyncGRPOConfig(GRPOConfig):
    """``GRPOConfig`` with TRL 1.16 AsyncGRPOConfig's asynchronous defaults; every field is ``RLOOConfig``'s."""

    max_staleness: int = option(
        4,
        "Sample each generation batch with the weights of this many optimizer steps before the ones it trains, "
        ">= 0 (AsyncGRPOConfig's default is TRL 1.16 AsyncGRPOConfig's: 4; 0: the synchronous loop). The lag is "
        "corrected with the vllm_importance_sampling_* weights.",
        trl="max_staleness",
    )
    rollout_workers: int = option(
        1,
        "Worker processes, each with its own copy of the policy, sampling shares of each batch while the trainer "
        "steps (AsyncGRPOConfig's default: 1; TRL samples on a vLLM server instead); 0: in this process.",
    )
