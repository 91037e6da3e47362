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
from rloo.generation.shared_prefix import full_sdpa_attention

# compact once this fraction of the decode batch has finished: each compaction copies the cache
# of the rows kept (about one decoding step's cache reads), so it waits for a real saving. The
# default of RLOOConfig.sampler_compaction (rloo.config.fields.plumbing; tests/generation/test_decoding.py checks it)
COMPACT_AT = 0.25
# on a GPU, the decode loop reads "every row finished?" (and compacts) once per this many steps: each read
# is a host sync that drains the launch queue; a read that comes late costs at most this many steps of the
# compacted batch decoding padding. On a CPU nothing runs ahead, so the loop reads every step.
CUDA_CHECK_EVERY = 8


def finished_check_every(device: torch.device) -> int:
    """Decode steps between the loop's host reads of its finished rows on ``device``."""
    return CUDA_CHECK_EVERY if device.type == "cuda" else 1


def step_draws(
    uniforms: Tensor | None, step: int, rows: Tensor, total: int, params: SamplingParams, generator: Any
) -> Tensor | None:
    """The uniforms ``(B, 1)`` of the decode batch ``rows`` at ``step``: their per-completion ones, else (rows
    compacted away) their entries of the ``(total, 1)`` draw the plain loop takes from ``generator``;
    None where the plain draw serves as is (every row still decoding, or greedy: no draw). A column, the
    shape the sampler compares with its CDF: no op a step to reshape it."""
    if uniforms is not None:  # every row still decoding: a view, no gather
        return uniforms[:, step : step + 1] if rows.numel() == total else uniforms[rows, step : step + 1]
    if params.temperature == 0 or rows.numel() == total:
        return None
    return torch.rand((total, 1), generator=generator, device=rows.device, dtype=torch.float32)[rows]


def attention_mask_kind(model: nn.Module, cache: Any, padded: bool) -> str:
    """How a decoding step hands the model its attention mask, without a host sync where it can:

    - ``"none"``: a state-space model (its own ``generate`` passes none), or an attention model whose
      prompts have no padding (the mask would be all ones: transformers then checks that on the host
      every step, ``fast_all``, to skip building it);
    - ``"4d"``: a model whose every layer attends in full through SDPA, with left-padded prompts: the
      ``(B, 1, 1, L)`` boolean mask transformers' ``sdpa_mask`` builds for one query position (the
      query is each row's last position, so the causal part is empty), passed ready-made; transformers
      returns a 4-D mask as is, skipping its host check;
    - ``"2d"``: anything else (sliding windows, another attention backend), the ``(B, L)`` mask as before.
    """
    if is_recurrent(cache):
        return "none"
    full = full_sdpa_attention(model)
    if not full:
        return "2d"
    return "4d" if padded else "none"


@dataclass
class DecodeBatch:
    """The rows a decoding step runs: ``rows`` ``(B,)`` their indices among the N rollout rows, and
    their cache, attention mask buffer ``(B, Tp + max_new)`` (prompt mask, then ones: the first
    ``length`` columns are the mask of the tokens so far; ``(B, 1, 1, Tp + max_new)`` boolean for the
    ``"4d"`` kind, so a step's mask is one slice of it), next positions ``(B, 1)``, rope deltas
    ``(B, 1)`` (a Qwen-VL prompt) or None, penalty history ``(B, H)`` and next-token logits ``(B, V)``.
    ``mask_kind``: :func:`attention_mask_kind`."""

    rows: Tensor
    total: int
    keyword: str
    mask_kind: str
    cache: Any
    attention: Tensor
    length: int
    next_position: Tensor
    rope_deltas: Tensor | None
    history: Tensor
    logits: Tensor

    @classmethod
    def start(
        cls,
        model: nn.Module,
        filled: Any,
        cache: Any,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        max_new: int,
        padded: bool,
    ) -> DecodeBatch:
        """Every row of a prefill (:class:`rloo.generation.rollout.Prefill`) whose cache is now
        ``cache``, for ``(N, Tp)`` left-padded prompts (``padded``: any row has padding) and up to
        ``max_new`` tokens each."""
        kind = attention_mask_kind(model, cache, padded)
        attention = torch.cat([prompt_mask, prompt_mask.new_ones(prompt_mask.shape[0], max_new)], dim=1)
        return cls(
            rows=torch.arange(prompt_ids.shape[0], device=prompt_ids.device),
            total=prompt_ids.shape[0],
            keyword=filled.keyword,
            mask_kind=kind,
            cache=cache,
            attention=attention.bool()[:, None, None] if kind == "4d" else attention,
            length=prompt_mask.shape[1],
            next_position=prompt_mask.sum(dim=1, keepdim=True),
            rope_deltas=filled.rope_deltas,
            # the penalty's history must skip left padding (as transformers does): fill the padding
            # with the row's last prompt token, which is penalized once either way
            history=torch.where(prompt_mask.bool(), prompt_ids, prompt_ids[:, -1:]),
            logits=filled.logits,
        )

    def own(self, values: Tensor) -> Tensor:
        """``values`` of the N rollout rows ``(N,)`` at the batch's rows ``(B,)`` (no copy while every row decodes)."""
        return values if self.rows.numel() == self.total else values[self.rows]

    def full(self, values: Tensor, fill: float) -> Tensor:
        """``values`` of the batch's rows ``(B,)`` at their rollout rows ``(N,)``, ``fill`` elsewhere."""
        if self.rows.numel() == self.total:
            return values
        out = values.new_full((self.total,), fill)
        out[self.rows] = values
        return out

    def compact(self, finished: Tensor, fraction: float, count: int) -> None:
        """Drop the batch's finished rows (``finished``: ``(N,)``; ``count`` of them among the batch's
        rows, read by the caller) once they are ``fraction`` of it."""
        if count == 0 or count < fraction * self.rows.numel():
            return
        done, size = finished[self.rows], self.rows.numel()
        # every row finished yet still decoding (lockstep with other processes, FSDP): keep one. The
        # number kept is known here, so the indices come without a host sync (nonzero_static)
        keep = torch.nonzero_static(~done if count < size else done, size=max(size - count, 1)).flatten()
        select_rows(self.cache, keep)
        self.rows = self.rows[keep]
        self.attention, self.next_position = self.attention[keep], self.next_position[keep]
        self.history, self.logits = self.history[keep], self.logits[keep]
        if self.rope_deltas is not None:
            self.rope_deltas = self.rope_deltas[keep]

    def mask(self) -> Tensor | None:
        """The attention mask of the next step's forward (:func:`attention_mask_kind`)."""
        if self.mask_kind == "none":
            return None
        return self.attention[..., : self.length]

    def advance(self, model: nn.Module, token: Tensor, record_history: bool) -> None:
        """Feed each row its token ``(B,)`` and keep the next-token logits."""
        if record_history:
            self.history = torch.cat([self.history, token.unsqueeze(1)], dim=1)
        self.length += 1
        out = model(
            input_ids=token.unsqueeze(1),
            attention_mask=self.mask(),
            position_ids=step_positions(self.next_position, self.rope_deltas),
            use_cache=True,
            **{self.keyword: self.cache},
        )
        self.cache, self.logits = out[self.keyword], out.logits[:, -1]
        self.next_position = self.next_position + 1
