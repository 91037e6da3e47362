"""Stop strings: a completion ends once its decoded text contains one of them (TRL's and
transformers' ``stop_strings``; vLLM calls them ``stop``). The stop string stays in the completion,
as transformers keeps it.

Ours rather than transformers' ``StopStringCriteria``: that class precomputes, from the
vocabulary, which token suffixes can end a stop string, and its vocabulary cleaning raises
``ValueError: substring not found`` on tokenizers whose tokens do not decode as prefix-free
pieces (a character-level tokenizer is one). Here each unfinished row's last few tokens are
decoded and searched, which holds for any tokenizer; it costs one ``batch_decode`` of
``max(len(stop)) + 4`` tokens per unfinished row and step, and nothing when no stop string is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

# tokens beyond the longest stop string's length that the decoded window keeps: room for
# special tokens, which decode to nothing
_SLACK = 4


class StopStrings:
    """``stop(tokens, active) -> (N,) bool``: rows whose text now contains a stop string.

    A token decodes to at least one character (special tokens, skipped, to none), so a stop
    string of c characters spans at most c tokens: the last ``c + 4`` tokens hold it. The check
    runs after every sampled token, so the first step at which a window contains a stop string
    is the step that completed it.
    """

    def __init__(self, tokenizer: Any, strings: Sequence[str]) -> None:
        if not strings or not all(isinstance(s, str) and s for s in strings):
            raise ValueError(f"stop strings must be non-empty strings, got {list(strings)!r}")
        self.tokenizer, self.strings = tokenizer, tuple(strings)
        self.window = max(len(s) for s in strings) + _SLACK

    def __call__(self, tokens: Sequence[Tensor], active: Tensor) -> Tensor:
        """``tokens``: the sampled tokens so far, one ``(N,)`` tensor per step; ``active``: ``(N,)``
        bool, the rows still generating. Returns ``(N,)`` bool, False for inactive rows."""
        stopped = torch.zeros_like(active)
        rows = active.nonzero().flatten().tolist()
        if not rows:
            return stopped
        tail = torch.stack(list(tokens[-self.window :]), dim=1)[rows]
        texts = self.tokenizer.batch_decode(tail.tolist(), skip_special_tokens=True)
        for row, text in zip(rows, texts, strict=True):
            stopped[row] = any(s in text for s in self.strings)
        return stopped
