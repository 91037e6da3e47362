"""Older TRL names of ``RLOOConfig`` fields: accepted where the meaning is unchanged, refused
with the fix where it is not.

TRL's RLOOTrainer before 0.22 (the PPO-style one) named several settings differently. TRL
0.22-0.24 still took them (``_DEPRECATED_PARAMS`` and ``_REMOVED_PARAMS`` in
``trl/trainer/rloo_config.py`` at v0.22.0), and tutorials still write them. A renamed field's
value goes to today's field with a one-line ``FutureWarning``; ``config.yaml`` records only
today's name. Where we depart from TRL 0.22:

- One setting given under both names with different values is an error (TRL let the old
  name win).
- Names whose TRL mapping changes what they do are refused, naming what to set:
  ``num_mini_batches`` counted optimizer steps per batch, ``steps_per_generation`` counts
  micro-batches (equal only when gradient_accumulation_steps is 1); ``normalize_reward``
  whitened rewards, not advantages; ``total_episodes`` counted completions, not steps.
- Names TRL dropped, which it warned about and then ignored, are refused too: a field that
  is accepted must do what it says.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from rloo.config.trl.defaults import as_rloo_spelling
from rloo.config.trl.elsewhere import ELSEWHERE
from rloo.config.trl.grpo_names import translate_grpo_names
from rloo.config.trl.passthrough import lift_dtype, lift_generation_fields

# older TRL name -> today's field, same meaning (TRL v0.22.0 _DEPRECATED_PARAMS)
RENAMED: dict[str, str] = {
    "rloo_k": "num_generations",
    "kl_coef": "beta",
    "cliprange": "epsilon",
    "num_ppo_epochs": "num_iterations",
    "response_length": "max_completion_length",
    "exp_name": "run_name",  # TRL 0.22 renamed it
    "use_transformers_paged": "use_transformers_continuous_batching",  # TRL 1.2 deprecated it
}

# older TRL name -> what to do instead (the rest of TRL v0.22.0's deprecated and removed names)
REFUSED: dict[str, str] = {
    "num_mini_batches": "it counted optimizer steps per batch; set steps_per_generation = num_mini_batches x "
    "gradient_accumulation_steps (micro-batches per generation batch)",
    "normalize_reward": "rloo does not whiten rewards; normalize_advantages=True whitens the advantages, "
    "which TRL 0.22 mapped it to",
    "total_episodes": "it counted completions; set max_steps (optimizer steps) or num_train_epochs",
    "token_level_kl": "TRL 0.22 dropped it (the KL is per sequence); kl_placement puts it in the reward or the loss",
    "dataset_num_proc": "TRL 0.22 dropped it (it was unused); delete it",
    "local_rollout_forward_batch_size": "TRL 0.22 dropped it; rloo splits forward passes by max_logits_memory_mb",
    "num_sample_generations": "TRL 0.22 dropped it; log_completions=True writes completions every logging_steps",
    "stop_token": "TRL 0.22 dropped it; completions end at the tokenizer's EOS token",
    "stop_token_id": "TRL 0.22 dropped it; completions end at the tokenizer's EOS token",
    "missing_eos_penalty": "TRL 0.22 dropped it; write a reward function that checks completion_ids for the EOS "
    "token, or set mask_truncated_completions=True",
}


# today's TRL fields for engines rloo does not have: refused with the reason, never ignored
UNSUPPORTED: dict[str, str] = {
    "hub_token": "a token would be written to config.yaml; set HF_TOKEN or run `hf auth login` instead",
}


def refusal_reason(name: str) -> str | None:
    """Why rloo refuses a TRL name that is no field (an older TRL name, an engine it does not have), or None."""
    return REFUSED.get(name) or unsupported_reason(name)


def unsupported_reason(name: str) -> str | None:
    """Why rloo refuses TRL field ``name`` (the generation engines rloo does not have, and the
    fields of TRL and transformers rloo has no equal for: :data:`rloo.config.trl.elsewhere.ELSEWHERE`), or None."""
    return UNSUPPORTED.get(name) or ELSEWHERE.get(name)


def accept_older_names(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``RLOOConfig`` keywords with each older TRL name replaced by today's, one warning per name used.

    ``generation_kwargs`` keys with a field of their own move to it (:func:`lift_generation_fields`), TRL
    AsyncGRPOConfig's ``dtype`` to ``model_init_kwargs`` (:func:`lift_dtype`),
    GRPO's names (``loss_type``, ``scale_rewards``) to rloo's knobs (:mod:`rloo.config.trl.grpo_names`), and
    TRL's spelling of a default to rloo's (``pad_to_multiple_of='auto'``: :mod:`rloo.config.trl.defaults`).
    Raises ``ValueError`` for a refused name, and for an older and a current name of one field
    given different values (naming both). Called by the constructor and by ``replace``;
    ``stacklevel=3`` points the warning at the caller of either.
    """
    out = dict(kwargs)
    for old in kwargs:
        if old in REFUSED:
            raise ValueError(f"RLOOConfig({old}=...) is an older TRL name rloo does not accept: {REFUSED[old]}")
        reason = unsupported_reason(old)
        if reason is not None:
            raise ValueError(f"RLOOConfig({old}=...) is a TRL setting rloo does not support: {reason}")
        if old not in RENAMED:
            continue
        new, value = RENAMED[old], out.pop(old)
        if new in out and out[new] != value:
            raise ValueError(
                f"RLOOConfig got {old}={value!r} and {new}={out[new]!r}: {old} is TRL's older name for {new}; "
                f"give only {new}"
            )
        out[new] = value
        warnings.warn(
            f"RLOOConfig({old}=...) is TRL's older name for {new}; write {new}={value!r} (config.yaml records {new})",
            FutureWarning,
            stacklevel=3,
        )
    return as_rloo_spelling(lift_dtype(lift_generation_fields(translate_grpo_names(out))))


def reward_funcs_or_reward_model(reward_funcs: Any, reward_model: Any) -> Any:
    """``RLOOTrainer(reward_model=...)``, the older TRL keyword (still in tutorials), as ``reward_funcs``,
    with a one-line warning; both given is an error naming both."""
    if reward_model is None:
        if reward_funcs is None:
            raise ValueError(
                "RLOOTrainer needs reward_funcs: a function, a built-in reward name, a reward model, or a list"
            )
        return reward_funcs
    if reward_funcs is not None:
        raise ValueError(
            "RLOOTrainer got reward_funcs and reward_model: reward_model is TRL's older name for reward_funcs; "
            "give only reward_funcs (a list holds several)"
        )
    warnings.warn(
        "RLOOTrainer(reward_model=...) is TRL's older name for reward_funcs; write reward_funcs=...",
        FutureWarning,
        stacklevel=3,
    )
    return reward_model


def check_trainer_arguments(optimizers: Any, tools: Any, rollout_func: Any, environment_factory: Any) -> None:
    """TRL's ``RLOOTrainer`` / ``GRPOTrainer`` arguments rloo cannot honour yet (or given wrong), refused with
    the reason and what to do; their defaults (``optimizers=(None, None)``, ``None``) are accepted, as TRL's own
    script passes them."""
    if tuple(optimizers or (None, None)) != (None, None):
        raise ValueError(
            "RLOOTrainer(optimizers=...) is not supported: rloo builds the optimizer and schedule itself (also "
            "over FSDP-sharded parameters, which an optimizer built before sharding would not hold); set "
            "RLOOConfig's optim, optim_args, learning_rate, weight_decay, lr_scheduler_type and warmup instead"
        )
    if rollout_func is not None and (tools or environment_factory is not None):
        raise ValueError(
            "RLOOTrainer got rollout_func and tools/environment_factory: a rollout_func samples the whole episode "
            "itself (call your tools there and mark their tokens with env_mask); give one or the other"
        )
    if tools is not None and (isinstance(tools, str | bytes) or not all(callable(t) for t in tools)):
        raise ValueError(f"RLOOTrainer(tools={tools!r}) is invalid: give a list of functions the model may call")
