"""rloo against a real vLLM server (``rloo vllm-serve`` from ``.venv-vllm``, the CPU build), on a tiny model.

Greedy equality with rloo's sampler and transformers' ``generate``, seeded reproducibility, the server's
log-probs against a forward, a weight sync that changes vLLM's output as the same weights change ours, the
probe that catches a sync that did not take, and a short training run through the server.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.vllm_client import VLLMClient, vllm_python
from rloo.generation.vllm_sampler import VLLMSampler
from rloo.generation.vllm_server import READY
from rloo.tiny import build_char_tokenizer, save_tiny_model
from tests.helpers.launch import free_port

pytestmark = pytest.mark.vllm
PROMPTS = [[5, 6, 7, 8, 9], [20, 21, 22], [30, 31, 32, 33]]
EOS = 2  # the tiny tokenizer's </s>


def _python() -> str:
    try:
        return vllm_python()
    except ValueError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # vLLM's CPU attention needs a head dimension of at least 32
    return save_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny", hidden_size=64, num_heads=2, max_positions=256)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    python = _python()
    port = free_port()
    command = [python, "-m", "rloo.generation.vllm_server", "--model", str(model_dir), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--dtype", "float32", "--max_model_len", "256", "--log_level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    deadline = time.monotonic() + 240
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line)
        if READY in line:
            break
    else:
        process.kill()
    if not any(READY in line for line in lines):
        process.kill()
        pytest.fail("rloo vllm-serve did not start:\n" + "".join(lines[-40:]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def load(model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def test_greedy_tokens_equal_rloos_sampler_and_generate(server: str, model_dir: Path) -> None:
    model = load(model_dir)
    served = VLLMClient(server).generate(PROMPTS, n=2, max_tokens=12, temperature=0.0)
    ours = generate_rollouts(
        model,
        PROMPTS,
        [0, 1, 2],
        num_generations=2,
        max_new_tokens=12,
        params=SamplingParams(temperature=0.0),
        eos_token_ids=[EOS],
        pad_token_id=0,
    )
    for row, ids in enumerate(served.completion_ids):
        assert until_eos(ids) == ours.completion_id_lists()[row]
        prompt = torch.tensor([PROMPTS[row // 2]])
        generated = model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=EOS, pad_token_id=0)
        assert until_eos(ids) == generated[0, prompt.shape[1] :].tolist()[: len(until_eos(ids))]


def test_seeded_samples_repeat_and_differ_by_seed(server: str) -> None:
    client = VLLMClient(server)
    first = client.generate(PROMPTS, n=3, max_tokens=10, seeds=[1, 100, 200]).completion_ids
    again = client.generate(PROMPTS, n=3, max_tokens=10, seeds=[1, 100, 200]).completion_ids
    other = client.generate(PROMPTS, n=3, max_tokens=10, seeds=[7, 107, 207]).completion_ids
    assert first == again
    assert first != other
    assert len({tuple(ids) for ids in first}) > 1  # a group's samples are not copies of one another


def test_logprobs_are_a_forwards_at_temperature_one(server: str, model_dir: Path) -> None:
    model = load(model_dir)
    served = VLLMClient(server).generate(PROMPTS[:1], n=2, max_tokens=8, temperature=0.7, seeds=[3])
    for ids, logprobs in zip(served.completion_ids, served.logprobs, strict=True):
        full = torch.tensor([PROMPTS[0] + ids])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0, len(PROMPTS[0]) - 1 : -1]
        ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(logprobs), ours, atol=1e-4, rtol=0)


def perturbed(model_dir: Path, seed: int) -> Any:
    model = load(model_dir)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.5, generator=g)
    return model


def test_a_sync_changes_vllms_output_as_the_weights_change_ours(server: str, model_dir: Path) -> None:
    sampler = VLLMSampler(server, timeout=60)
    model = perturbed(model_dir, seed=1)
    greedy = SamplingParams(temperature=0.0)
    kwargs: dict[str, Any] = {"num_generations": 1, "max_new_tokens": 10, "eos_token_ids": [EOS], "pad_token_id": 0}
    served = sampler(model, PROMPTS, [0, 1, 2], params=greedy, step=1, **kwargs)
    ours = generate_rollouts(model, PROMPTS, [0, 1, 2], params=greedy, **kwargs)
    assert served.completion_id_lists() == ours.completion_id_lists()
    assert sampler.last_gap is not None and sampler.last_gap < 1e-3
    # the probe catches weights that did not reach the server
    sampler.synced = (id(model), 2)  # as if step 2 had been sent
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    with pytest.raises(RuntimeError, match="disagree with the policy's after the sync"):
        sampler.check(model)
    sampler.sync(model, 3)  # a real sync mends it
    assert sampler.last_gap < 1e-3
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)  # the server back to the folder's weights


def test_training_through_the_server(server: str, model_dir: Path, tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer()
    args = RLOOConfig(
        output_dir=str(tmp_path / "run"),
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=server,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        save_steps=1000,
        report_to=[],
        seed=0,
    )
    sevens = tokenizer.convert_tokens_to_ids("7")
    trainer = RLOOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completion_ids, **_: [sum(t == sevens for t in ids) / 8 for ids in completion_ids],
        args=args,
        train_dataset=[{"prompt": f"{a}+{b}="} for a in range(5) for b in range(5)],
        processing_class=tokenizer,
    )
    trainer.train()
    sampler = trainer.rollout_settings.engine
    assert isinstance(sampler, VLLMSampler)
    # the weights of every step but the last were sent and checked against the probe
    assert sampler.synced is not None and sampler.synced[1] == 2
    assert sampler.last_gap is not None and sampler.last_gap < 1e-3
    assert len([e for e in trainer.state.log_history if "reward" in e]) == 3
