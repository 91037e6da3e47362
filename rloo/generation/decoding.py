"""The sampler's decode batch: the rows still decoding, and compaction (finished rows leave it).

Without compaction every row decodes until the last one ends: a finished row keeps paying a full
decoding step (attention over its whole cache, the MLPs, the LM head) to produce padding. RL
completions end at very different lengths (most early, a tail at ``max_completion_length``), so on
realistic work most of those row-steps are wasted. Here, once ``compact_at`` of the decode batch
has finished, the finished rows leave it: every per-row state (the cache's rows,
:func:`rloo.generation.kv_cache.select_rows`; the attention mask, positions, rope deltas,
repetition-penalty history and the next logits) keeps only the rows still decoding, and their
tokens and log-probs are written back at their original row indices (the stop-string check and
the outputs stay full-size). A row's computation in a forward does not depend on the other rows,
and its random draw is its own (``sampling_seed``) or its entry of the same full-batch draw as
without compaction, so the tokens and log-probs are those of the plain loop (tested across model
families). A cache :func:`rloo.generation.kv_cache.can_select_rows` does not accept (another cache
class, an unknown layer type) is never compacted: the plain loop runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rloo.generation.kv_cache import is_recurrent, select_rows
from rloo.generation.multimodal import step_positions
from rloo.generation.sampling import SamplingParams

# compact once this fraction of the decode batch has finished: each compaction copies the cache
# of the rows kept (about one decoding step's cache reads), so it waits for a real saving. The
# default of RLOOConfig.sampler_compaction (rloo.config.plumbing; tests/generation/test_decoding.py checks it)
COMPACT_AT = 0.25


def step_draws(
    uniforms: Tensor | None, step: int, rows: Tensor, total: int, params: SamplingParams, generator: Any
) -> Tensor | None:
    """The uniforms of the decode batch ``rows`` at ``step``: their per-completion ones, else (rows
    compacted away) their entries of the ``(total, 1)`` draw the plain loop takes from ``generator``;
    None where the plain draw serves as is (every row still decoding, or greedy: no draw)."""
    if uniforms is not None:
        return uniforms[rows, step]
    if params.temperature == 0 or rows.numel() == total:
        return None
    return torch.rand((total, 1), generator=generator, device=rows.device, dtype=torch.float32)[rows, 0]


@dataclass
class DecodeBatch:
    """The rows a decoding step runs: ``rows`` ``(B,)`` their indices among the N rollout rows, and
    their cache, attention mask ``(B, L)``, next positions ``(B, 1)``, rope deltas ``(B, 1)`` (a
    Qwen-VL prompt) or None, penalty history ``(B, H)`` and next-token logits ``(B, V)``."""

    rows: Tensor
    total: int
    keyword: str
    recurrent: bool
    cache: Any
    attention: Tensor
    next_position: Tensor
    rope_deltas: Tensor | None
    history: Tensor
    logits: Tensor

    @classmethod
    def start(cls, filled: Any, cache: Any, prompt_ids: Tensor, prompt_mask: Tensor) -> DecodeBatch:
        """Every row of a prefill (:class:`rloo.generation.rollout.Prefill`) whose cache is now
        ``cache``, for ``(N, Tp)`` left-padded prompts."""
        return cls(
            rows=torch.arange(prompt_ids.shape[0], device=prompt_ids.device),
            total=prompt_ids.shape[0],
            keyword=filled.keyword,
            recurrent=is_recurrent(cache),
            cache=cache,
            attention=prompt_mask,
            next_position=prompt_mask.sum(dim=1, keepdim=True),
            rope_deltas=filled.rope_deltas,
            # the penalty's history must skip left padding (as transformers does): fill the padding
            # with the row's last prompt token, which is penalized once either way
            history=torch.where(prompt_mask.bool(), prompt_ids, prompt_ids[:, -1:]),
            logits=filled.logits,
        )

    def full(self, values: Tensor, fill: float) -> Tensor:
        """``values`` of the batch's rows ``(B,)`` at their rollout rows ``(N,)``, ``fill`` elsewhere."""
        if self.rows.numel() == self.total:
            return values
        out = values.new_full((self.total,), fill)
        out[self.rows] = values
        return out

    def compact(self, finished: Tensor, fraction: float) -> None:
        """Drop the batch's finished rows (``finished``: ``(N,)``) once they are ``fraction`` of it."""
        done = finished[self.rows]
        count = int(done.sum())
        if count == 0 or count < fraction * self.rows.numel():
            return
        # every row finished yet still decoding (lockstep with other processes, FSDP): keep one
        keep = (~done).nonzero().flatten() if count < done.numel() else done.nonzero().flatten()[:1]
        select_rows(self.cache, keep)
        self.rows = self.rows[keep]
        self.attention, self.next_position = self.attention[keep], self.next_position[keep]
        self.history, self.logits = self.history[keep], self.logits[keep]
        if self.rope_deltas is not None:
            self.rope_deltas = self.rope_deltas[keep]

    def advance(self, model: nn.Module, token: Tensor, record_history: bool) -> None:
        """Feed each row its token ``(B,)`` and keep the next-token logits."""
        if record_history:
            self.history = torch.cat([self.history, token.unsqueeze(1)], dim=1)
        self.attention = torch.cat([self.attention, torch.ones_like(token).unsqueeze(1)], dim=1)
        out = model(
            input_ids=token.unsqueeze(1),
            # a state-space model's own generate decodes without a mask (it masks input positions, and
            # the whole mask would broadcast against the one new position)
            attention_mask=None if self.recurrent else self.attention,
            position_ids=step_positions(self.next_position, self.rope_deltas),
            use_cache=True,
            **{self.keyword: self.cache},
        )
        self.cache, self.logits = out[self.keyword], out.logits[:, -1]
        self.next_position = self.next_position + 1
