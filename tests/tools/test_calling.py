"""Running tool calls (:mod:`rloo.tools.calling`): answers, failures answered as errors, timeouts, order and
concurrency. Concurrency is proven with barriers (a sequential run would break them), never with timings."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rloo.tools.calling import ToolAnswer, Toolbox, run_tool_calls


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return a + b


def echo(value: Any) -> Any:
    """Return its argument.

    Args:
        value: Anything.
    """
    return value


def explode(reason: str) -> str:
    """Raise.

    Args:
        reason: The error message.
    """
    raise RuntimeError(reason)


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("cannot print me")


def unprintable() -> Unprintable:
    """Return a value whose str() raises."""
    return Unprintable()


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A call in TRL's shape."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def answer(name: str, content: str) -> ToolAnswer:
    return ToolAnswer({"role": "tool", "name": name, "content": content}, failed=False)


def error(name: str, message: str) -> ToolAnswer:
    return ToolAnswer({"role": "tool", "name": name, "content": str({"error": message})}, failed=True)


def run_one(tools: list[Callable[..., Any]], request: dict[str, Any], timeout: float | None = 10.0) -> ToolAnswer:
    """The answer to one call in a batch of one job."""
    [[only]] = run_tool_calls([(Toolbox(tools), [request])], timeout)
    return only


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An event a hanging tool waits on; set after the test so its daemon thread ends."""
    event = threading.Event()
    yield event
    event.set()


# ---------------------------------------------------------------------------- answers


def test_a_sync_tool_is_answered_with_its_result_as_text() -> None:
    assert run_one([multiply], call("multiply", a=3, b=4)) == answer("multiply", "12")


def test_an_async_tool_is_awaited() -> None:
    assert run_one([add], call("add", a=3, b=4)) == answer("add", "7")


@pytest.mark.parametrize(
    ("value", "content"),
    [(12, "12"), ({"x": 1}, "{'x': 1}"), (None, "None"), ([1, "a"], "[1, 'a']"), ("text", "text")],
)
def test_a_result_that_is_not_a_string_is_answered_with_its_str(value: Any, content: str) -> None:
    assert run_one([echo], call("echo", value=value)) == answer("echo", content)


def test_a_call_without_arguments_calls_the_tool_with_none() -> None:
    def now() -> str:
        """The time."""
        return "noon"

    assert run_one([now], {"type": "function", "function": {"name": "now"}}) == answer("now", "noon")
    assert run_one([now], {"function": {"name": "now", "arguments": None}}) == answer("now", "noon")


# ---------------------------------------------------------------------------- failures


def test_an_unknown_tool_is_answered_with_an_error() -> None:
    got = run_one([multiply], call("nope", a=1))
    assert got == error("nope", "Tool nope not found.")
    assert got.message["content"] == "{'error': 'Tool nope not found.'}"


def test_arguments_the_tool_does_not_take_are_answered_with_the_type_error() -> None:
    unexpected = run_one([multiply], call("multiply", a=3, c=4))
    missing = run_one([multiply], call("multiply", a=3))
    assert unexpected == error("multiply", "multiply() got an unexpected keyword argument 'c'")
    assert missing == error("multiply", "multiply() missing 1 required positional argument: 'b'")


def test_wrong_arguments_to_an_async_tool_are_answered_with_the_type_error() -> None:
    assert run_one([add], call("add", a=3)) == error("add", "add() missing 1 required positional argument: 'b'")


def test_a_tool_that_raises_is_answered_with_its_message() -> None:
    assert run_one([explode], call("explode", reason="disk full")) == error("explode", "disk full")


def test_an_exception_without_a_message_is_answered_with_its_type_name() -> None:
    def fail() -> None:
        """Fail silently."""
        raise LookupError

    assert run_one([fail], call("fail")) == error("fail", "LookupError")


def test_an_async_tool_that_raises_is_answered_with_its_message() -> None:
    async def boom() -> None:
        """Raise later."""
        raise ValueError("async boom")

    assert run_one([boom], call("boom")) == error("boom", "async boom")


def test_a_result_whose_str_raises_is_a_failure() -> None:
    assert run_one([unprintable], call("unprintable")) == error("unprintable", "cannot print me")


def test_a_tool_that_hangs_past_the_timeout_is_answered_with_a_timeout_error(release: threading.Event) -> None:
    def hang() -> str:
        """Wait until released."""
        release.wait()
        return "late"

    # the test is that this returns at all, with the hanging tool's thread still blocked
    got = run_one([hang], call("hang"), timeout=0.5)
    assert got == error("hang", "tool hang did not return within tool_timeout=0.5 s")
    assert "tool_timeout=0.5" in got.message["content"]


def test_an_async_tool_that_hangs_is_answered_with_a_timeout_error(release: threading.Event) -> None:
    async def stall() -> str:
        """Wait until released."""
        while not release.is_set():
            await asyncio.sleep(0.01)
        return "late"

    assert run_one([stall], call("stall"), timeout=0.5) == error(
        "stall", "tool stall did not return within tool_timeout=0.5 s"
    )


def test_a_hanging_call_does_not_hold_back_the_others_answers(release: threading.Event) -> None:
    def hang() -> str:
        """Wait until released."""
        release.wait()
        return "late"

    box = Toolbox([hang, multiply])
    answers = run_tool_calls([(box, [call("hang")]), (box, [call("multiply", a=2, b=5)])], timeout=0.5)
    assert answers == [
        [error("hang", "tool hang did not return within tool_timeout=0.5 s")],
        [answer("multiply", "10")],
    ]


def test_a_call_of_another_type_than_function_is_answered_with_an_error() -> None:
    request = {"type": "code_interpreter", "name": "python", "code": "1+1"}
    assert run_one([multiply], request) == error("python", "Unsupported tool call type: code_interpreter")


# ---------------------------------------------------------------------------- order and concurrency


def test_answers_keep_the_order_of_the_calls_and_of_the_jobs() -> None:
    box = Toolbox([multiply, add, explode])
    jobs = [
        (box, [call("multiply", a=2, b=3), call("nope"), call("add", a=1, b=1)]),
        (box, []),
        (box, [call("explode", reason="x"), call("multiply", a=5, b=5)]),
    ]
    assert run_tool_calls(jobs, timeout=10.0) == [
        [answer("multiply", "6"), error("nope", "Tool nope not found."), answer("add", "2")],
        [],
        [error("explode", "x"), answer("multiply", "25")],
    ]


def test_no_jobs_have_no_answers() -> None:
    assert run_tool_calls([], timeout=1.0) == []


@settings(max_examples=20)
@given(jobs=st.lists(st.lists(st.integers(), max_size=4), max_size=4))
def test_any_batch_of_echo_calls_is_answered_in_order(jobs: list[list[int]]) -> None:
    box = Toolbox([echo])
    answers = run_tool_calls([(box, [call("echo", value=v) for v in values]) for values in jobs], timeout=None)
    assert answers == [[answer("echo", str(v)) for v in values] for values in jobs]


def meet(barrier: threading.Barrier) -> Callable[[], str]:
    """A tool that returns only once another thread has reached ``barrier`` (it raises if none does)."""

    def rendezvous() -> str:
        """Wait for the other call."""
        barrier.wait()
        return "met"

    return rendezvous


def test_calls_of_two_jobs_run_at_the_same_time() -> None:
    box = Toolbox([meet(threading.Barrier(2, timeout=5))])
    answers = run_tool_calls([(box, [call("rendezvous")]), (box, [call("rendezvous")])], timeout=None)
    assert answers == [[answer("rendezvous", "met")], [answer("rendezvous", "met")]]


def test_two_calls_of_one_job_run_at_the_same_time() -> None:
    box = Toolbox([meet(threading.Barrier(2, timeout=5))])
    answers = run_tool_calls([(box, [call("rendezvous"), call("rendezvous")])], timeout=None)
    assert answers == [[answer("rendezvous", "met"), answer("rendezvous", "met")]]


def test_async_tools_of_two_jobs_run_at_the_same_time() -> None:
    barrier = threading.Barrier(2, timeout=5)

    async def gather() -> str:
        """Wait for the other call (blocking its own event loop, which is its own thread's)."""
        barrier.wait()
        return "met"

    box = Toolbox([gather])
    answers = run_tool_calls([(box, [call("gather")]), (box, [call("gather")])], timeout=None)
    assert answers == [[answer("gather", "met")], [answer("gather", "met")]]


def test_a_sequential_run_would_break_the_barrier() -> None:
    """The barrier tests' control: one call alone at a two-party barrier fails (here within 0.2 s)."""
    box = Toolbox([meet(threading.Barrier(2, timeout=0.2))])
    [[alone]] = run_tool_calls([(box, [call("rendezvous")])], timeout=None)
    assert alone == error("rendezvous", "BrokenBarrierError")


# ---------------------------------------------------------------------------- Toolbox


def test_a_toolbox_finds_its_tools_by_name_in_order() -> None:
    box = Toolbox([multiply, add])
    assert box.tools == {"multiply": multiply, "add": add}
    assert box.functions == [multiply, add]


def test_the_same_function_twice_is_one_tool() -> None:
    assert Toolbox([multiply, multiply]).functions == [multiply]


def test_two_functions_with_the_same_name_are_refused_naming_the_tool() -> None:
    def other() -> int:
        """Another multiply."""
        return 0

    other.__name__ = "multiply"
    with pytest.raises(ValueError, match="two tools are named 'multiply'"):
        Toolbox([multiply, other])


@pytest.mark.parametrize("thing", [42, "multiply"])
def test_a_tool_that_is_not_callable_is_refused_naming_it(thing: Any) -> None:
    with pytest.raises(ValueError, match=f"{thing!r} is not a function"):
        Toolbox([multiply, thing])


def test_a_bound_method_is_a_tool_named_after_the_method() -> None:
    class Counter:
        def __init__(self) -> None:
            self.count = 0

        def increment(self, by: int) -> int:
            """Increment.

            Args:
                by: The step.
            """
            self.count += by
            return self.count

    counter = Counter()
    box = Toolbox([counter.increment])
    [[first]] = run_tool_calls([(box, [call("increment", by=2)])], timeout=10.0)
    [[second]] = run_tool_calls([(box, [call("increment", by=3)])], timeout=10.0)
    assert (first, second) == (answer("increment", "2"), answer("increment", "5"))
    assert counter.count == 5


def test_the_same_bound_method_twice_is_one_tool() -> None:
    class Environment:
        def look(self) -> str:
            """Look around."""
            return "a room"

    environment = Environment()
    assert len(Toolbox([environment.look, environment.look]).functions) == 1


def test_a_tool_the_template_cannot_describe_is_refused_before_the_model_loads(tmp_path: Any) -> None:
    # it failed at the first rollout, after the model loaded, with transformers' DocstringParsingException
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.tools.calling import Toolbox

    def undocumented(a: int) -> int:
        return a

    def untyped(a):  # type: ignore[no-untyped-def]
        """Echo.

        Args:
            a: The value.
        """
        return a

    with pytest.raises(ValueError, match=r"tools: 'undocumented' cannot be described to the model .*docstring"):
        Toolbox([undocumented])
    with pytest.raises(ValueError, match=r"tools: 'untyped' cannot be described to the model .*type hint"):
        Toolbox([untyped])

    def not_a_model(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the tools were checked")

    args = RLOOConfig(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2)
    data = [{"prompt": [{"role": "user", "content": "hi"}]}]
    import rloo.training.trainer as trainer_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer_module, "prepare_policy", not_a_model)
        with pytest.raises(ValueError, match="'undocumented' cannot be described"):
            RLOOTrainer(
                "some/model",
                lambda completions, **k: [0.0] * len(completions),
                args=args,
                train_dataset=data,
                tools=[undocumented],
            )
