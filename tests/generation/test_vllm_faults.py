"""The vLLM server under faults (issue 42): unreachable at the start, killed or restarted mid-run, slower than its
timeout, answering malformed or truncated output. Each against :mod:`tests.helpers.fake_vllm`, a server in a
thread of this process that answers the protocol for real (a copy of the model samples and scores), so the
weight-sync probe passes only where the weights really arrived."""

from __future__ import annotations

import socket
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.sampling import SamplingParams
from rloo.generation.vllm import client as vllm_client
from rloo.generation.vllm.client import MalformedAnswer, ServerLost, ServerTimeout, VLLMClient
from rloo.generation.vllm.sampler import RECONNECTS, VLLMSampler
from tests.helpers.fake_vllm import FakeVLLM
from tests.helpers.launch import free_port
from tests.helpers.models import make_model, make_tokenizer

PROMPTS = [[3, 4, 5], [6, 7], [8]]
KWARGS: dict[str, Any] = {
    "num_generations": 2,
    "max_new_tokens": 3,
    "eos_token_ids": [1],
    "pad_token_id": 0,
    "params": SamplingParams(),
    "sampling_seed": 7,
}


@pytest.fixture
def model() -> Any:
    return make_model(make_tokenizer())


def moved(model: Any) -> Any:
    """``model`` after a step of training: other weights than the server started with."""
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
    return model


def sample(sampler: VLLMSampler, model: Any, step: int) -> Any:
    return sampler(model, PROMPTS, [0, 1, 2], step=step, **KWARGS)


# ---------------------------------------------------------------------- unreachable at the start
def test_no_server_at_the_start_is_said_at_once_and_fails_within_the_timeout() -> None:
    client = VLLMClient(f"http://127.0.0.1:{free_port()}", timeout=5)
    told: list[str] = []
    start = time.monotonic()
    with pytest.raises(ServerLost, match=r"no vLLM server answered .* within 1 s .* start one with `rloo vllm-serve"):
        client.check_server(total_timeout=1.0, interval=0.1, notify=told.append)
    assert time.monotonic() - start < 30  # seconds, not vllm_server_timeout's default 240
    assert len(told) == 1 and "waiting up to 1 s (vllm_server_timeout)" in told[0], told


def test_a_host_name_that_does_not_resolve_fails_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_such_host(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)  # no DNS query leaves this machine
    start = time.monotonic()
    with pytest.raises(ServerLost, match=r"cannot be reached .*Name or service not known"):
        VLLMClient("http://vllm-host.invalid:8000").check_server(total_timeout=120.0)
    assert time.monotonic() - start < 30


def test_a_server_that_accepts_but_never_answers_is_retried_not_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A listening socket nobody reads from: each /health/ try is cut at HEALTH_ATTEMPT_TIMEOUT, the whole wait
    at the total timeout (before: one try waited the request timeout, 240 s by default)."""
    monkeypatch.setattr(vllm_client, "HEALTH_ATTEMPT_TIMEOUT", 0.3)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        client = VLLMClient(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=600)
        start = time.monotonic()
        with pytest.raises(ServerLost, match=r"within 1 s .*did not answer within 0.[23][0-9]* s\)"):
            client.check_server(total_timeout=1.0, interval=0.05)
        assert time.monotonic() - start < 30


# ---------------------------------------------------------------------- killed, restarted
def test_a_server_restarted_mid_batch_gets_the_weights_again_checked_before_the_batch_is_asked_again(
    model: Any,
) -> None:
    model = moved(model)
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=30)
        expected = sample(sampler, model, step=1)
        assert server.updates == 1 and server.holds(model)
        server.fail("/generate/", "restart")  # killed while answering, back at once with the weights on disk
        with pytest.warns(
            UserWarning, match=rf"closed the connection before its whole answer .*again .*reconnect 1 of {RECONNECTS}"
        ):
            again = sample(sampler, model, step=2)
        assert server.updates == 3  # sent again after the restart, and the probe passed on them
        assert server.holds(model)
        assert sampler.last_gap is not None and sampler.last_gap < 1e-4
        # the same seeds and weights: the batch is what it would have been
        assert again.completion_id_lists() == expected.completion_id_lists()


def test_a_restart_between_two_calls_of_one_step_is_noticed_by_the_servers_start_up_id(model: Any) -> None:
    """Multi-turn episodes and dynamic sampling call the sampler several times a step: a server restarted in
    between answers with another start-up id, and the weights go again before it samples."""
    model = moved(model)
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=30)
        sample(sampler, model, step=1)
        sample(sampler, model, step=1)
        assert server.updates == 1  # the same step, the same server: nothing to send
        server.restart()
        assert not server.holds(model)
        sample(sampler, model, step=1)
        assert server.updates == 2 and server.holds(model)


def test_a_server_that_stays_down_stops_the_run_naming_the_step_and_the_resume(model: Any) -> None:
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=1.0)
        sample(sampler, model, step=1)
        server.up = False
        with (
            pytest.warns(UserWarning, match="reconnect 1 of"),
            pytest.raises(ServerLost, match=r"within 1 s .*The run stopped at step 2; once the server is back, resume"),
        ):
            sample(sampler, model, step=2)


def test_a_server_that_keeps_dropping_the_batch_stops_after_the_reconnects(model: Any) -> None:
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=30)
        sample(sampler, model, step=1)
        server.fail("/generate/", *["drop"] * (RECONNECTS + 1))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(
                ServerLost, match=rf"again after {RECONNECTS} reconnects in this batch: the run stopped at step 2"
            ):
                sample(sampler, model, step=2)
        assert sum("reconnect" in str(w.message) for w in caught) == RECONNECTS


# ---------------------------------------------------------------------- slow, malformed, truncated
def test_a_server_slower_than_its_timeout_is_named_with_the_setting_to_raise(model: Any) -> None:
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=0.5)
        sample(sampler, model, step=1)
        server.fail("/generate/", "sleep:3")
        with pytest.raises(ServerTimeout, match=r"did not answer within 0.5 s \(vllm_server_timeout\): a slow server"):
            sample(sampler, model, step=1)


def _fewer(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "completion_ids": answer["completion_ids"][:-1], "logprobs": answer["logprobs"][:-1]}


def _text_tokens(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "completion_ids": [[str(t) for t in row] for row in answer["completion_ids"]]}


def _short_logprobs(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "logprobs": [row[:-1] for row in answer["logprobs"]]}


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("not_json", r"answered 28 bytes that are not JSON \(b'<html>502"),
        (lambda answer: {"error": "engine dead"}, r"with \['error'\] \(no completion_ids and logprobs\)"),
        (_fewer, r"with 5 completions and 5 rows of log-probs for 6 requested"),
        (_text_tokens, r"a value that is not a token id or a log-prob"),
        (_short_logprobs, r"with [0-9]+ log-probs for the [0-9]+ tokens of completion 0"),
    ],
    ids=["not JSON", "no fields", "too few completions", "text tokens", "too few log-probs"],
)
def test_a_malformed_answer_stops_naming_the_server_and_what_was_wrong(model: Any, fault: Any, message: str) -> None:
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=30)
        sample(sampler, model, step=1)
        server.fail("/generate/", fault)  # the batch's request (the same step: no new weights to send and probe)
        with pytest.raises(MalformedAnswer, match=message):
            sample(sampler, model, step=1)


def test_a_truncated_answer_is_asked_again_as_a_lost_connection(model: Any) -> None:
    with FakeVLLM(make_model(make_tokenizer())) as server:
        sampler = VLLMSampler(server.url, timeout=30)
        expected = sample(sampler, model, step=1)
        server.fail("/generate/", "truncate")
        with pytest.warns(UserWarning, match="closed the connection before its whole answer .*reconnect 1 of"):
            again = sample(sampler, model, step=1)
        assert again.completion_id_lists() == expected.completion_id_lists()


# ---------------------------------------------------------------------- through the trainer
def test_a_run_whose_server_goes_away_stops_naming_its_newest_checkpoint(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    with FakeVLLM(make_model(tokenizer)) as server:
        calls = {"n": 0}

        def reward(completion_ids: list[list[int]], **_: Any) -> list[float]:
            calls["n"] += 1
            if calls["n"] == 2:  # the server dies after the first step's batch
                server.up = False
            return [len(ids) / 4 for ids in completion_ids]

        args = RLOOConfig(
            output_dir=str(tmp_path / "run"),
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=server.url,
            vllm_server_timeout=1.0,
            num_generations=2,
            per_device_train_batch_size=4,
            max_completion_length=4,
            max_steps=4,
            save_steps=1,
            report_to=[],
            seed=0,
        )
        trainer = RLOOTrainer(
            model=make_model(tokenizer),
            reward_funcs=reward,
            args=args,
            train_dataset=[{"prompt": f"{a}+{a}="} for a in range(8)],
            processing_class=tokenizer,
        )
        with pytest.warns(UserWarning, match="reconnect 1 of"), pytest.raises(ServerLost) as raised:
            trainer.train()
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert f"newest checkpoint is {tmp_path / 'run' / 'checkpoint-2'}" in notes, notes
    assert "resume with trainer.train(resume_from_checkpoint=True)" in notes
