"""The one generate -> score pipeline (rloo.pipeline): EOS ids, weights, group ids, modes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rloo.generation.sampling import SamplingParams
from rloo.pipeline import RolloutSettings, eos_token_ids, generate_and_score
from rloo.rewards.calling import RewardFunctions
from tests.helpers.models import always_one

PROMPTS = ["hello world", "ab", "x = 1 + 2?"]
GREEDY = RolloutSettings(1, 6, SamplingParams(top_k=1))


class ExtraEos:
    """A tokenizer whose ``eos_token_id`` is a list: its own EOS and one more id."""

    def __init__(self, tokenizer: Any, extra: int) -> None:
        self._tokenizer, self.eos_token_id = tokenizer, [tokenizer.eos_token_id, extra]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)


def length_of(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [float(len(ids)) for ids in completion_ids]


def test_eos_token_ids_accepts_an_int_or_a_list_and_rejects_none(char_tokenizer: Any) -> None:
    assert eos_token_ids(char_tokenizer) == [char_tokenizer.eos_token_id]
    assert eos_token_ids(ExtraEos(char_tokenizer, 7)) == [char_tokenizer.eos_token_id, 7]

    class NoEos:
        eos_token_id = None

    with pytest.raises(ValueError, match="the tokenizer has no eos_token"):
        eos_token_ids(NoEos())


def test_every_eos_id_ends_a_completion(peaked_model: Any, char_tokenizer: Any) -> None:
    rewards = RewardFunctions([length_of])
    plain = generate_and_score(peaked_model, char_tokenizer, PROMPTS, {}, rewards, GREEDY)
    first = int(plain.rollout.completion_ids[0, 0])
    assert first != char_tokenizer.eos_token_id and plain.rollout.completion_mask[0].sum() > 1
    stopped = generate_and_score(peaked_model, ExtraEos(char_tokenizer, first), PROMPTS, {}, rewards, GREEDY)
    assert stopped.rollout.completion_mask[0].sum() == 1 and not stopped.rollout.truncated[0]
    assert stopped.rewards.rewards[0] == 1.0  # the completion ends at the extra EOS, counted


def test_scores_are_combined_with_the_weights_everywhere(peaked_model: Any, char_tokenizer: Any) -> None:
    rewards = RewardFunctions(
        [always_one, always_one, lambda completions, **kw: [None] * len(completions)], [2.0, 0.5, 9.0]
    )
    scored = generate_and_score(peaked_model, char_tokenizer, PROMPTS, {}, rewards, RolloutSettings(2, 3))
    assert scored.rewards.scores.values.shape == (6, 3)
    torch.testing.assert_close(scored.rewards.rewards, torch.full((6,), 2.5))
    assert scored.rewards.scorable.all()
    with pytest.raises(ValueError, match="reward_weights has 1 entries but there are 2 reward functions"):
        RewardFunctions([always_one, always_one], [1.0])


def test_group_ids_columns_and_the_model_mode(peaked_model: Any, char_tokenizer: Any) -> None:
    seen: dict[str, Any] = {}

    def spy(prompts: list[str], label: list[str], **kwargs: Any) -> list[float]:
        seen.update(prompts=prompts, label=label)
        return [0.0] * len(prompts)

    peaked_model.train()
    scored = generate_and_score(
        peaked_model,
        char_tokenizer,
        PROMPTS[:2],
        {"label": ["a", "b"]},
        RewardFunctions([spy]),
        RolloutSettings(3, 2),
        group_ids=[7, 9],
    )
    assert peaked_model.training  # put back in the mode it was in
    peaked_model.eval()
    assert scored.rollout.group_ids.tolist() == [7, 7, 7, 9, 9, 9]
    assert seen == {"prompts": [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3, "label": ["a"] * 3 + ["b"] * 3}
    assert len(scored.completion_texts) == 6 and scored.prompts == PROMPTS[:2]
