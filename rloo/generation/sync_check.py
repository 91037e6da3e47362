"""The weight-sync check: a sampler that holds its own copy of the policy (vLLM, a rollout worker) is sent the
trainer's weights, and a sync that silently failed would train on another policy's samples (verl#7495,
OpenRLHF#1349). So after a sync both sides score the same probe tokens, and a gap beyond the engine's
tolerance stops the run with the fix.

One check, each engine its own tolerance (:class:`ProbeTolerance`): two float32 forwards of the same weights on
two devices agree to ~1e-5 nats (a rollout worker), another engine's kernels to ~1e-2 (vLLM), and bf16/fp16
rounding alone reaches ~0.016 (BENCHMARKS.md); a sync that did not take differs by nats once the policy moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ProbeTolerance:
    """The most (nats) an engine's and the trainer's log-probs of the probe may differ after a good sync: when
    the trainer computes in float32 (``full``), and in bf16/fp16 (``half``: half weights or autocast)."""

    full: float
    half: float

    def at(self, half_precision: bool) -> float:
        return self.half if half_precision else self.full


@torch.no_grad()
def probe_logprobs(model: nn.Module, ids: Tensor, start: int) -> Tensor:
    """``log p(ids[t] | ids[:t])`` under ``model`` for ``t >= start`` (``ids``: ``(T,)`` on the model's device):
    ``(T - start,)`` float32 on the CPU, no gradient."""
    logits = model(input_ids=ids[None], use_cache=False).logits[0, start - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[start:, None])[:, 0].cpu()


def check_weight_sync(ours: Tensor, theirs: Tensor, tolerance: float, refusal: str) -> float:
    """The largest gap (nats) between two scorings of the probe; beyond ``tolerance`` a ``RuntimeError`` with
    ``refusal``, formatted with ``gap`` and ``tolerance`` (what went wrong and the fix)."""
    gap = float((ours - theirs).abs().max())
    if not gap <= tolerance:  # NaN too
        raise RuntimeError(refusal.format(gap=gap, tolerance=tolerance))
    return gap
