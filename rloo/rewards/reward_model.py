"""Reward models: a sequence-classification model with one label, as a reward function.

:class:`RewardModelScorer` wraps ``AutoModelForSequenceClassification`` so that it is called
like any TRL-style reward function and returns ``logits[:, 0]`` per completion.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rloo.offline import hub_or_cache


class RewardModelScorer:
    """A sequence-classification reward model as a TRL-style reward function.

    Scores ``prompt + completion`` and returns ``logits[:, 0]``. Conversational samples are
    rendered with the tokenizer's chat template (prompt messages + completion messages), or
    their contents joined by newlines when it has none. As in TRL, texts are tokenized with
    ``add_special_tokens=False`` by default and right padding.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        batch_size: int | None = None,
        add_special_tokens: bool = False,
    ) -> None:
        if isinstance(model, str | os.PathLike):
            model, tokenizer = _load_reward_model(os.fspath(model), tokenizer)
        if tokenizer is None:
            raise ValueError("a reward model instance needs its tokenizer: pass `tokenizer=`")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        self.model = model
        self.model.requires_grad_(False)
        torch.nn.Module.eval(self.model)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.add_special_tokens = add_special_tokens
        _ensure_pad_token(self.model, self.tokenizer)
        name = str(getattr(self.model.config, "_name_or_path", "") or "").rstrip("/\\")
        self.__name__ = os.path.basename(name) or type(self.model).__name__

    def to(self, device: str | torch.device) -> RewardModelScorer:
        torch.nn.Module.to(self.model, device)
        return self

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """The strings the reward model scores, one per completion."""
        return [self._text(p, c) for p, c in zip(prompts, completions, strict=True)]

    def _text(self, prompt: Any, completion: Any) -> str:
        if isinstance(prompt, str):
            return prompt + str(completion)
        messages = [*prompt, *completion]
        if getattr(self.tokenizer, "chat_template", None) is None:
            return "\n".join(m["content"] for m in messages)
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False))

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        step = self.batch_size or max(len(texts), 1)
        scores: list[float] = []
        for start in range(0, len(texts), step):
            scores.extend(self._score(texts[start : start + step]))
        return scores

    def _score(self, texts: list[str]) -> list[float]:
        inputs = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            padding_side="right",
            add_special_tokens=self.add_special_tokens,
        ).to(self.model.device)
        with torch.inference_mode():
            logits = self.model(**inputs).logits
        return [float(x) for x in logits[:, 0].float().tolist()]


def _load_reward_model(
    path: str, tokenizer: PreTrainedTokenizerBase | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    with hub_or_cache(path):  # no network: the cache, at once (not ~80 s of retries)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, trust_remote_code=False)
        return model, tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)


def _ensure_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Batched scoring needs a pad token; fall back to EOS, as TRL does."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the reward tokenizer has neither a pad token nor an eos token; set `pad_token`")
        tokenizer.pad_token = tokenizer.eos_token
    # Sequence classification finds each row's last token from config.pad_token_id.
    model.config.pad_token_id = tokenizer.pad_token_id


def reward_model(path_or_model: Any, tokenizer: Any = None, batch_size: int | None = None) -> RewardModelScorer:
    """A sequence-classification reward model as a reward function (:class:`RewardModelScorer`).

    ``path_or_model`` is a local folder, hub id or ``PreTrainedModel``; ``tokenizer`` a
    tokenizer or a path to load one from (default: the model's folder).
    """
    if isinstance(tokenizer, str | os.PathLike):
        with hub_or_cache(tokenizer):
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer))
    return RewardModelScorer(path_or_model, tokenizer, batch_size=batch_size)
