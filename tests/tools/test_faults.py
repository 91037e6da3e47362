"""Tools and environments under faults (issue 42): a ``reset`` that raises or hangs, answers of megabytes, an
episode that never ends, a tool the model cannot be told about. (A tool that raises or hangs is answered with
its error: ``tests/tools/test_calling.py``.)"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from rloo.generation.sampling import SamplingParams
from rloo.tools import episodes as episodes_module
from rloo.tools.calling import Toolbox
from rloo.tools.environments import Environments
from rloo.tools.episodes import EpisodeLimits, run_episodes
from tests.tools.test_episodes import EOS, TOK, Scripted, call_text, prompt_ids


class Broken:
    def reset(self, **row: Any) -> None:
        raise KeyError("answer")


class Stuck:
    release = threading.Event()

    def reset(self, **row: Any) -> None:
        self.release.wait(60)


def test_a_reset_that_raises_stops_naming_the_environment_the_row_and_the_error() -> None:
    environments = Environments(Broken)
    rows = [{"prompt": "2+2="}, {"prompt": "3+3="}]
    with pytest.raises(
        RuntimeError, match=r"environment Broken.reset failed for row 0 of the batch \(prompt '2\+2='\)"
    ):
        environments.reset(environments.draw(rows, 2), rows, 2)
    try:
        environments.reset(environments.draw(rows, 2), rows, 2)
    except RuntimeError as error:
        assert "KeyError: 'answer'" in str(error) and isinstance(error.__cause__, KeyError)


def test_a_reset_that_hangs_is_cut_at_tool_timeout() -> None:
    environments = Environments(Stuck)
    rows = [{"prompt": "2+2="}]
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"Stuck.reset did not return within tool_timeout=0.3 s for row 0"):
            environments.reset(environments.draw(rows, 1), rows, 1, timeout=0.3)
    finally:
        Stuck.release.set()  # the hung reset's daemon thread ends
    assert time.monotonic() - start < 30


def megabytes(a: int, b: int) -> str:
    """Multiply two integers, verbosely.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return "7" * 5_000_000


megabytes.__name__ = "multiply"  # the scripted model calls `multiply`


def run(tool: Any, max_tokens: int = 200, rounds: int | None = None, turns: int = 2) -> Any:
    sample = Scripted([call_text(3, 4), "12"], *[[call_text(3, 4)]] * turns)
    return run_episodes(
        sample,
        None,
        [prompt_ids(3, 4)],
        [0],
        num_generations=2,
        tokenizer=TOK,
        toolboxes=[Toolbox([tool])] * 2,
        limits=EpisodeLimits(rounds, max_tokens, 5.0),
        eos_token_ids=[EOS],
        params=SamplingParams(),
        pad_token_id=TOK.pad_token_id,
    )


def test_an_answer_of_megabytes_is_dropped_without_being_tokenized(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the 5 MB answer was rendered and tokenized (6 s an episode) to be dropped for want of room."""
    rendered: list[int] = []
    real = episodes_module.tool_suffix_ids

    def spy(tokenizer: Any, messages: list[dict[str, Any]], *args: Any) -> list[int]:
        rendered.append(sum(len(str(m["content"])) for m in messages))
        return real(tokenizer, messages, *args)

    monkeypatch.setattr(episodes_module, "tool_suffix_ids", spy)
    rollout, records = run(megabytes)
    assert rendered == []
    assert records[0].cut == "max_completion_length" and records[0].tool_calls == 1 and rollout.truncated[0]
    assert [m["role"] for m in records[0].messages] == ["assistant"]  # the answer is not in the episode
    assert rollout.completion_mask[0].sum() == len(TOK(call_text(3, 4), add_special_tokens=False)["input_ids"]) + 1


def counted(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


counted.__name__ = "multiply"


def test_an_episode_that_keeps_calling_tools_ends_at_the_token_budget() -> None:
    """No max_tool_calling_iterations (None): a model that calls a tool at every turn is ended by
    max_completion_length, the whole episode's budget."""
    rollout, records = run(counted, max_tokens=300, rounds=None, turns=50)
    assert records[0].cut == "max_completion_length" and rollout.truncated[0]
    assert 2 <= records[0].tool_calls < 50 and rollout.completion_mask[0].sum() <= 300


def test_an_argument_type_json_schema_cannot_express_is_refused_naming_the_tool() -> None:
    def connect(sock: socket.socket) -> str:
        """Use a socket.

        Args:
            sock: The socket.
        """
        return ""

    with pytest.raises(ValueError, match=r"tools: 'connect' cannot be described to the model"):
        Toolbox([connect])
