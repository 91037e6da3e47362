"""A benchmark policy whose completions end at varied lengths, made by arranging a random model's weights.

A random-init model almost never samples its EOS token (about 1 / vocabulary per step), so every
completion runs to ``max_completion_length``: unlike real RL work, where most completions end early
and a tail reaches the limit. Here the same weights get a constant EOS probability per step:

- channel 0 of the residual stream is made a constant ``c``: every token's embedding has ``c`` there
  and no layer writes to it (row 0 of every ``o_proj`` and ``down_proj`` is zeroed), so after the
  final RMSNorm it is a near-constant ``h_0`` at every position of every sequence;
- the EOS row of the (tied) output embedding becomes ``a`` at channel 0 and 0 elsewhere, so
  ``logit_eos = a * h_0``; every other token's logit gains the same ``c * h_0`` (cancels in the
  softmax).

``a`` is solved so that ``p(EOS) = hazard`` per step: ``a * h_0 = log(hazard / (1 - hazard)) +
logsumexp(other logits)``, measured on sampled text. With a constant hazard ``h`` the lengths are
geometric: median ``ln 2 / h``, and ``(1 - h)^T`` of the completions reach the limit ``T``.
``hazard_for(T, reach)`` picks ``h`` for a share ``reach`` at the limit (0.12 at T = 128: median
~42 tokens, a third of the limit). The result is a model folder that rloo and TRL load alike: the
arrangement is in the weights, the same for both.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import torch


def hazard_for(max_len: int, reach: float) -> float:
    """The per-step end probability ``h`` with ``(1 - h)^max_len = reach``."""
    return 1.0 - reach ** (1.0 / max_len)


@torch.no_grad()
def _constant_channel(model: Any, value: float) -> None:
    model.get_input_embeddings().weight[:, 0] = value
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight[0, :] = 0.0
        layer.mlp.down_proj.weight[0, :] = 0.0


@torch.no_grad()
def _head_statistics(model: Any, eos: int, input_ids: torch.Tensor) -> tuple[float, float]:
    """Mean ``h_0`` and mean logsumexp of the non-EOS logits over every position of ``input_ids``."""
    seen: dict[str, torch.Tensor] = {}
    head = model.get_output_embeddings()
    handle = head.register_forward_pre_hook(lambda m, args: seen.setdefault("h", args[0]))
    logits = model(input_ids=input_ids).logits.float()
    handle.remove()
    logits[..., eos] = -torch.inf
    return float(seen["h"][..., 0].mean()), float(torch.logsumexp(logits, dim=-1).mean())


def arrange_model(model: Any, eos: int, vocab_size: int, hazard: float, channel_value: float = 1.0) -> Any:
    """Give ``model`` (in place, on its device) the constant EOS hazard of the module docstring; returns it."""
    _constant_channel(model, channel_value)
    with torch.no_grad():
        model.get_output_embeddings().weight[eos] = 0.0
        generator = torch.Generator().manual_seed(0)
        text = torch.randint(eos + 1, vocab_size, (4, 128), generator=generator).to(model.device)
        h0, lse = _head_statistics(model, eos, text)
        model.get_output_embeddings().weight[eos, 0] = (math.log(hazard / (1 - hazard)) + lse) / h0
    return model


def arrange(source: Path, target: Path, hazard: float, channel_value: float = 1.0) -> Path:
    """Save ``source``'s model and tokenizer to ``target`` with the constant EOS hazard (module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    arrange_model(model, tokenizer.eos_token_id, len(tokenizer), hazard, channel_value)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def length_distribution(model_dir: Path, prompts: list[str], k: int, max_len: int) -> dict[str, Any]:
    """Completion lengths sampled by rloo's sampler (temperature 1) for ``prompts`` x ``k``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.generation.rollout import generate_rollouts
    from rloo.generation.sampling import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    with torch.no_grad():
        out = generate_rollouts(
            model,
            ids,
            list(range(len(ids))),
            num_generations=k,
            max_new_tokens=max_len,
            params=SamplingParams(),
            eos_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
            sampling_seed=1,
        )
    lengths = sorted(int(x) for x in out.completion_mask.sum(dim=1))
    deciles = statistics.quantiles(lengths, n=10)
    return {
        "samples": len(lengths),
        "mean": statistics.fmean(lengths),
        "median": statistics.median(lengths),
        "p10": deciles[0],
        "p90": deciles[-1],
        "at_limit": sum(1 for x in lengths if x >= max_len) / len(lengths),
        "max_completion_length": max_len,
    }
