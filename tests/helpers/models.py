"""Tiny models and trainers the tests share (tests import helpers from here, never from each other)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rloo import RLOOConfig, RLOOTrainer
from rloo.tiny import build_char_tokenizer, build_tiny_llama

CHARS = "0123456789+= "


def tiny_reward_model(tokenizer: PreTrainedTokenizerFast, pad: bool = True) -> LlamaForSequenceClassification:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id if pad else None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForSequenceClassification(config).eval()


def make_tokenizer() -> Any:
    return build_char_tokenizer(CHARS)


def make_model(tokenizer: Any, seed: int = 0) -> Any:
    return build_tiny_llama(len(tokenizer), tokenizer=tokenizer, seed=seed)


def dataset(n: int = 40) -> list[dict[str, Any]]:
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)][:n]


def frac7(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """Share of completion tokens that are the character '7' (token id looked up once)."""
    seven = make_tokenizer().convert_tokens_to_ids("7")
    return [sum(t == seven for t in ids) / max(len(ids), 1) for ids in completion_ids]


def frac7_when_odd(prompts: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """``frac7`` for prompts whose first digit is odd, 0.0 for the others: their groups never have a signal."""
    return [r if int(str(p)[0]) % 2 else 0.0 for p, r in zip(prompts, frac7(completion_ids), strict=True)]


def config(tmp_path: Path, **overrides: Any) -> RLOOConfig:
    values: dict[str, Any] = {
        "output_dir": str(tmp_path / "run"),
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "learning_rate": 1e-2,
        "max_steps": 2,
        "logging_steps": 1,
        "save_steps": 1000,
        "seed": 0,
    }
    values.update(overrides)
    return RLOOConfig(**values)


def world_config(out: Path, world: int, completions_per_step: int, **overrides: Any) -> RLOOConfig:
    """:func:`config` of a run that 1 and ``world`` processes train alike, compared bit for bit: the
    same global batch (``completions_per_step`` over all processes), K = 2, beta 0.05, 2 steps, and
    sampler compaction off (a row decoded in another batch, as 1 and 2 processes decode, can round
    differently and, rarely, sample another token)."""
    return config(
        out,
        per_device_train_batch_size=completions_per_step // world,
        num_generations=2,
        beta=0.05,
        max_steps=2,
        sampler_compaction=None,
        **overrides,
    )


def trainer(
    tmp_path: Path, reward_funcs: Any = frac7, data: Any = None, callbacks_: Any = None, **overrides: Any
) -> RLOOTrainer:
    """A trainer of the tiny model on one-digit sums (``callbacks_``: the trainer's ``callbacks``)."""
    tok = make_tokenizer()
    return RLOOTrainer(
        model=make_model(tok),
        reward_funcs=reward_funcs,
        args=config(tmp_path, **overrides),
        train_dataset=data if data is not None else dataset(),
        processing_class=tok,
        callbacks=callbacks_,
    )


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def always_one(completions: list[Any], **kwargs: Any) -> list[float]:
    """A reward of 1.0 for every completion (importable as ``tests.helpers.models:always_one``)."""
    return [1.0] * len(completions)


def answer_metrics(eval_pred: Any) -> dict[str, float]:
    """A ``compute_metrics`` hook (importable as ``tests.helpers.models:answer_metrics``): the share of
    completions holding their row's ``answer``, how many it saw, a checksum of their order (the position
    times the length, summed) and the mean combined reward (``eval_reward`` computed from what it got)."""
    import numpy as np

    completions, answers = eval_pred.completions, eval_pred.columns["answer"]
    return {
        "answer_rate": sum(a in c for a, c in zip(answers, completions, strict=True)) / len(completions),
        "completions_seen": len(completions),
        "order_checksum": sum(i * len(c) for i, c in enumerate(completions)),
        "reward_mean": float(np.nanmean(eval_pred.rewards)),
    }


def peaked_tiny_llama(tokenizer: Any) -> Any:
    """A tiny Llama whose weights are re-drawn larger than the init, so next-token
    distributions are peaked and varied: greedy decoding differs per prompt and EOS is reachable."""
    model = build_tiny_llama(len(tokenizer), tokenizer=tokenizer).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:  # embedding (tied with lm_head) and projections; norms keep their ones
                p.normal_(0.0, 1.0 if "embed" in name else 0.3, generator=g)
    return model


def signal_after(calls: int, signum: int = 15) -> Any:
    """A reward factory: the reward function sends ``signum`` (default SIGTERM) to this process on
    its ``calls``-th call, as a scheduler would, and otherwise scores every completion 0."""
    import os

    seen = {"calls": 0}

    def signal_sender(completions: list[Any], **kwargs: Any) -> list[float]:
        seen["calls"] += 1
        if seen["calls"] == calls:
            os.kill(os.getpid(), signum)
        return [0.0] * len(completions)

    return signal_sender


def token_id_sum(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """The sum of a completion's token ids: equal rewards mean (almost surely) equal completions."""
    return [float(sum(ids)) for ids in completion_ids]


_calls = {"frac7_stopping": 0}


def frac7_stopping(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """``frac7``; when ``RLOO_TEST_SIGTERM_AT=N`` is set, the process of rank 0 also sends itself
    SIGTERM on its N-th call, as a scheduler would (importable from a run file)."""
    import os

    _calls["frac7_stopping"] += 1
    at = os.environ.get("RLOO_TEST_SIGTERM_AT")
    if at and os.environ.get("RANK", "0") == "0" and _calls["frac7_stopping"] == int(at):
        os.kill(os.getpid(), 15)
    return frac7(completion_ids)


def last_train_log(trainer: RLOOTrainer) -> dict[str, float]:
    """The last logged training metrics (``log_history[-1]`` is the end-of-training summary)."""
    return [row for row in trainer.state.log_history if "reward" in row][-1]


def next_train_batch(trainer: RLOOTrainer) -> Any:
    """Phases 1-4 of the trainer's step, outside ``train()``: its next generation batch, ready for the update."""
    scored = trainer._next_rollouts()
    return trainer._train_batch(scored, trainer.experience.logprobs(scored.rollout))


QWEN_VOCAB = 151_936  # Qwen2.5's vocabulary: one row's float32 logits of 14 tokens are 8.1 MiB


def qwen_vocab_model(vocab_size: int = QWEN_VOCAB, **config: Any) -> Any:
    """A 2-layer, 32-wide Qwen2 (GQA, tied embeddings) with Qwen2.5's vocabulary, seeded."""
    import transformers

    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            **config,
        )
    )
