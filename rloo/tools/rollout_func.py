"""``rollout_func`` (TRL GRPO's contract): the user samples the batch; rloo scores and trains on it.

``rollout_func(prompts, trainer)`` gets this process's P prompts of the batch (raw dataset prompts, each
once) and the trainer, and returns a dict with, per completion (K per prompt, a prompt's consecutive, P*K in
all):

- ``prompt_ids``: the prompt's token ids; ``completion_ids``: the completion's (an episode's, for a
  multi-turn one), ending in EOS unless a limit cut it;
- ``logprobs``: the sampler's log-prob of each completion token (the sampling distribution's, used for the
  off-policy mask; the ratio and the KL use rloo's own forward);
- optionally ``env_mask``: 1 on the tokens the model sampled, 0 on tokens inserted between its turns
  (tool results, observations), which are then context only, as ``tools=`` inserts them;
- any other key: a per-completion column passed to the reward functions under that name.

A completion whose last token is not an EOS is counted truncated (TRL's rule). Everything after (rewards,
advantages, the loss, metrics, checkpoints) is the same as for rloo's own sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rloo.algo.masks import completion_mask_from_lengths
from rloo.generation.rollout import Rollout, left_pad

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def bind_rollout_func(rollout_func: Any, trainer: Any) -> Callable[[list[Any]], dict[str, Any]] | None:
    """``prompts -> rollout_func(prompts, trainer)``, or None without one."""
    if rollout_func is None:
        return None
    if not callable(rollout_func):
        raise ValueError(f"RLOOTrainer(rollout_func={rollout_func!r}) is invalid: give a function (prompts, trainer)")
    if getattr(trainer.args, "use_vllm", False):
        raise ValueError(
            "RLOOTrainer(rollout_func=...) with use_vllm=True is not built yet: rloo would not send the policy's "
            "weights to the engine your rollout_func samples on, so it would sample the initial policy; sample "
            "with the trainer's model in the rollout_func, or use tools=/environment_factory= with use_vllm"
        )
    return lambda prompts: rollout_func(prompts, trainer)


def custom_rollout(
    output: Any,
    num_prompts: int,
    k: int,
    group_ids: Sequence[int],
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    device: torch.device,
) -> tuple[Rollout, dict[str, list[Any]]]:
    """The :class:`Rollout` of a ``rollout_func``'s ``output`` and its extra per-completion columns; a
    ``ValueError`` naming the key and what is expected for anything else."""
    if not isinstance(output, dict):
        raise ValueError(f"rollout_func returned {type(output).__name__}; return a dict with {list(REQUIRED)}")
    missing = [key for key in REQUIRED if key not in output]
    if missing:
        raise ValueError(f"rollout_func must return keys {missing} in its output dict (it returned {sorted(output)})")
    n = num_prompts * k
    for key, values in output.items():
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
            raise ValueError(
                f"rollout_func's {key!r} has {len(values) if isinstance(values, Sequence) else type(values).__name__} "
                f"entries; give one per completion: {num_prompts} prompts x num_generations={k} = {n}"
            )
    completions = [list(map(int, ids)) for ids in output["completion_ids"]]
    logprobs, masks = output["logprobs"], output.get("env_mask")
    width = max(1, max(len(ids) for ids in completions))
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    sampled = torch.zeros((n, width))
    tool_mask = None if masks is None else torch.zeros((n, width))
    for row, completion in enumerate(completions):
        length = len(completion)
        ids[row, :length] = torch.tensor(completion, dtype=torch.long)
        row_logprobs = logprobs[row]
        if row_logprobs is not None:
            if len(row_logprobs) != length:
                raise ValueError(f"rollout_func's logprobs[{row}] has {len(row_logprobs)} values for {length} tokens")
            sampled[row, :length] = torch.tensor([float(v) for v in row_logprobs])
        if tool_mask is not None:
            assert masks is not None
            if len(masks[row]) != length:
                raise ValueError(f"rollout_func's env_mask[{row}] has {len(masks[row])} values for {length} tokens")
            tool_mask[row, :length] = torch.tensor([float(v) for v in masks[row]])
    mask = completion_mask_from_lengths(torch.tensor([len(c) for c in completions]), width)
    prompts, prompt_mask = left_pad([list(p) for p in output["prompt_ids"]], pad_token_id, device)
    eos = set(eos_token_ids)
    rollout = Rollout(
        prompt_ids=prompts,
        prompt_mask=prompt_mask,
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        truncated=torch.tensor([not c or c[-1] not in eos for c in completions], device=device),
        sampling_logprobs=(sampled * mask).to(device),
        group_ids=torch.tensor(list(group_ids), device=device).repeat_interleave(k),
        tool_mask=None if tool_mask is None else tool_mask.to(device),
    )
    extra = {key: list(values) for key, values in output.items() if key not in (*REQUIRED, "env_mask")}
    return rollout, extra
