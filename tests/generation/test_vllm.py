"""rloo against a real vLLM server (``rloo vllm-serve`` from ``.venv-vllm``, the CPU build), on a tiny model.

Greedy equality with rloo's sampler and transformers' ``generate``, seeded reproducibility, the server's
log-probs against a forward, a weight sync that changes vLLM's output as the same weights change ours, the
probe that catches a sync that did not take, and a short training run through the server.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.vllm.client import VLLMClient, vllm_python
from rloo.generation.vllm.sampler import VLLMSampler
from rloo.report import metric_names as names
from rloo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model
from tests.helpers.launch import assert_ok, free_port, torchrun, write_run_file
from tests.helpers.models import dataset, frac7, make_tokenizer
from tests.helpers.processes import child_env
from tests.helpers.serving import vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.system]
PROMPTS = [[5, 6, 7, 8, 9], [20, 21, 22], [30, 31, 32, 33]]
EOS = 2  # the tiny tokenizer's </s>


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # vLLM's CPU attention needs a head dimension of at least 32
    return save_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny", hidden_size=64, num_heads=2, max_positions=256)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    with vllm_server(model_dir) as url:
        yield url


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_a_forwards_at_the_sampling_temperature(server: str, model_dir: Path, temperature: float) -> None:
    """vLLM's log-probs of its tokens are log_softmax(logits / T), the distribution rloo scores, at any T (its
    default raw log-probs are at T = 1 whatever the request's); under top_p they are the truncated one's."""
    model = load(model_dir)
    client = VLLMClient(server)
    served = client.generate(PROMPTS[:1], n=2, max_tokens=8, temperature=temperature, seeds=[3])
    for ids, logprobs in zip(served.completion_ids, served.logprobs, strict=True):
        full = torch.tensor([PROMPTS[0] + ids])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0, len(PROMPTS[0]) - 1 : -1]
        ours = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(logprobs), ours, atol=1e-4, rtol=0)
    truncated = client.generate(PROMPTS[:1], n=2, max_tokens=8, temperature=temperature, top_p=0.5, seeds=[3])
    for ids, logprobs in zip(truncated.completion_ids, truncated.logprobs, strict=True):
        full = torch.tensor([PROMPTS[0] + ids])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0, len(PROMPTS[0]) - 1 : -1]
        ours = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert bool((torch.tensor(logprobs) >= ours - 1e-4).all())  # renormalized over the nucleus: never lower


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
    sampler.sync(model, 2)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    with pytest.raises(RuntimeError, match="disagree with the policy's after the sync"):
        sampler.check(model)
    sampler.sync(model, 3)  # a real sync mends it
    assert sampler.last_gap < 1e-3
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)  # the server back to the folder's weights


def train_through(server: str, model_dir: Path, out: Path, resume: bool = False, **overrides: Any) -> RLOOTrainer:
    tokenizer = build_char_tokenizer()
    values: dict[str, Any] = {
        "output_dir": str(out),
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": server,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 8,
        "max_steps": 3,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "save_steps": 1000,
        "report_to": [],
        "seed": 0,
    }
    peft_config = overrides.pop("peft_config", None)
    values.update(overrides)
    sevens = tokenizer.convert_tokens_to_ids("7")
    trainer = RLOOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completion_ids, **_: [sum(t == sevens for t in ids) / 8 for ids in completion_ids],
        args=RLOOConfig(**values),
        train_dataset=[{"prompt": f"{a}+{b}="} for a in range(5) for b in range(5)],
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=resume or None)
    return trainer


def test_training_through_the_server(server: str, model_dir: Path, tmp_path: Path) -> None:
    trainer = train_through(server, model_dir, tmp_path / "run")
    sampler = trainer.rollout_settings.engine
    assert isinstance(sampler, VLLMSampler)
    # the weights of every step but the last were sent and checked against the probe
    assert sampler.synced_step == 2
    assert sampler.last_gap is not None and sampler.last_gap < 1e-3
    logs = [e for e in trainer.state.log_history if "reward" in e]
    assert len(logs) == 3
    # the same weights in two engines: vLLM's log-probs of the sampled tokens are the trainer's, float32
    assert all(0 <= e[names.ENGINE_GAP_MAX] < 1e-3 for e in logs), logs
    assert all(e[names.ENGINE_GAP_MEAN] <= e[names.ENGINE_GAP_MAX] for e in logs)


def test_a_lora_policy_reaches_the_server_merged(server: str, model_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = train_through(server, model_dir, tmp_path / "lora", peft_config=lora, learning_rate=5e-2)
    sampler = trainer.rollout_settings.engine
    assert sampler.synced_step == 2
    assert sampler.last_gap is not None and sampler.last_gap < 1e-3  # the merged adapters, as the policy
    adapters = [p for n, p in trainer.unwrapped_model.named_parameters() if "lora_B" in n]
    assert any(float(p.abs().max()) > 0 for p in adapters)  # the adapters trained: the probe compared a change
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)


def test_a_lora_policy_reaches_a_lora_server_as_its_adapter(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rloo vllm-serve --enable_lora true``: each sync sends the adapter alone (vLLM applies it as a LoRA
    adapter), never the merged weights, and the probe finds the server's log-probs the policy's."""
    from peft import LoraConfig

    sent: dict[str, list[int]] = {"adapter": [], "weights": []}
    load_adapter, update_weights = VLLMClient.load_adapter, VLLMClient.update_weights

    def adapter(client: VLLMClient, weights: dict[str, torch.Tensor], config: dict[str, Any]) -> int:
        sent["adapter"].append(sum(t.numel() * t.element_size() for t in weights.values()))
        return load_adapter(client, weights, config)

    def merged(client: VLLMClient, named: Any) -> int:
        tensors = list(named)
        sent["weights"].append(sum(t.numel() * t.element_size() for _, t in tensors))
        return update_weights(client, tensors)

    monkeypatch.setattr(VLLMClient, "load_adapter", adapter)
    monkeypatch.setattr(VLLMClient, "update_weights", merged)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    with vllm_server(model_dir, "--enable_lora", "true", "--max_lora_rank", "8") as url:
        trainer = train_through(url, model_dir, tmp_path / "lora", peft_config=lora, learning_rate=5e-2)
        sampler = trainer.rollout_settings.engine
        assert sampler.synced_step == 2 and len(sent["adapter"]) == 3 and not sent["weights"]
        assert sampler.last_gap is not None and sampler.last_gap < 1e-3  # the server's adapter is the policy's
        adapters = [p for n, p in trainer.unwrapped_model.named_parameters() if "lora_B" in n]
        assert any(float(p.abs().max()) > 0 for p in adapters)  # trained: the probe compared a change
        VLLMSampler(url, timeout=60).sync(load(model_dir), 0)  # a full model afterwards: its weights, no adapter
    assert len(sent["weights"]) == 1 and sent["adapter"][0] * 20 < sent["weights"][0]


def test_no_server_is_named_with_the_command_that_starts_one() -> None:
    client = VLLMClient(f"http://127.0.0.1:{free_port()}", timeout=5)
    with pytest.raises(ConnectionError, match=r"no vLLM server answered at .* start one with `rloo vllm-serve"):
        client.check_server(total_timeout=0.3, interval=0.1)
    with pytest.raises(ConnectionError, match=r"cannot be reached .* start it with `rloo vllm-serve --model MODEL`"):
        client.generate([[1, 2]], n=1, max_tokens=2)


ENGINE_FAILS = """
from fastapi.testclient import TestClient
from rloo.generation.vllm.server import build_app

class Failing:
    def generate(self, *args, **kwargs):
        raise RuntimeError("Unsupported CPU attention configuration: head_dim=8")

answer = TestClient(build_app(Failing(), 1)).post("/generate/", json={"prompts": [[1, 2]], "max_tokens": 2})
print(answer.status_code, answer.json()["detail"])
"""


def test_an_engine_that_fails_answers_why_not_a_bare_500() -> None:
    """vLLM's CPU attention refuses a head dimension of 8 (the kill loop's first model): the trainer's error read
    "answered 500: Internal Server Error" and nothing more; now the server answers the engine's error."""
    python = vllm_python() if _has_vllm_env() else pytest.skip("no .venv-vllm (make vllm)")
    out = subprocess.run([python, "-c", ENGINE_FAILS], env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (
        "500 the vLLM engine failed (RuntimeError: Unsupported CPU attention configuration: head_dim=8); the "
        "server's log has the traceback"
    )


def test_vllm_serve_finds_the_vllm_environment_or_says_how_to_make_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import importlib.util

    from rloo.generation.vllm import client as vllm_client

    monkeypatch.setenv("RLOO_VLLM_PYTHON", "/some/python")
    assert vllm_python() == "/some/python"
    monkeypatch.delenv("RLOO_VLLM_PYTHON")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(vllm_client, "__file__", str(tmp_path / "rloo" / "generation" / "vllm" / "client.py"))
    with pytest.raises(ValueError, match="run `make vllm` in the rloo checkout"):
        vllm_python()
    (tmp_path / ".venv-vllm" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-vllm" / "bin" / "python").write_text("")
    assert vllm_python() == str(tmp_path / ".venv-vllm" / "bin" / "python")


def test_two_training_processes_share_one_server(server: str, model_dir: Path, tmp_path: Path) -> None:
    """torchrun, 2 processes (gloo): each samples its share on the server; the first sends the weights and
    checks them, and neither samples before they are in (the logged gap of both processes' tokens is ~0)."""
    out = tmp_path / "two"
    run = write_run_file(
        tmp_path,
        out,
        model=str(model_dir),
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=server,
        max_steps=3,
        save_steps=1000,
        per_device_train_batch_size=4,
    )
    assert_ok(torchrun("-m", "rloo", "train", str(run)))
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [row[names.ENGINE_GAP_MAX] for row in logged if names.ENGINE_GAP_MAX in row]
    assert len(gaps) == 3 and max(gaps) < 1e-3, logged
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)


def test_a_resumed_run_through_the_server_equals_an_uninterrupted_one(
    server: str, model_dir: Path, tmp_path: Path
) -> None:
    """vLLM's seeds come from the run's seed and the group ids: a run resumed from step 2 samples what the
    uninterrupted run sampled, and ends at the same weights."""
    settings: dict[str, Any] = {"max_steps": 4, "lr_scheduler_type": "constant", "save_steps": 2}
    straight = train_through(server, model_dir, tmp_path / "straight", **settings)
    train_through(server, model_dir, tmp_path / "resumed", **{**settings, "max_steps": 2})
    resumed = train_through(server, model_dir, tmp_path / "resumed", resume=True, **settings)
    for (name, a), (_, b) in zip(
        straight.unwrapped_model.named_parameters(), resumed.unwrapped_model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)


def test_rloo_learns_a_trivial_task_through_the_server(tmp_path: Path) -> None:
    """Reward = share of '7' tokens (as tests/training/test_trainer.py's test, on a model vLLM's CPU kernels
    take: head dimension 32): it starts near 1/17 and rises clearly with every completion from the server."""
    tokenizer = make_tokenizer()
    folder = tmp_path / "sums"
    build_tiny_llama(len(tokenizer), hidden_size=64, num_heads=2, tokenizer=tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with vllm_server(folder) as url:
        trainer = RLOOTrainer(
            model=str(folder),
            reward_funcs=frac7,
            args=RLOOConfig(
                output_dir=str(tmp_path / "run"),
                use_vllm=True,
                vllm_mode="server",
                vllm_server_base_url=url,
                num_generations=4,
                per_device_train_batch_size=32,
                max_completion_length=6,
                learning_rate=1e-2,
                max_steps=20,
                logging_steps=1,
                beta=0.0,
                save_steps=1000,
                report_to=[],
                seed=0,
            ),
            train_dataset=dataset(),
            processing_class=tokenizer,
        )
        trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert rewards[0] < 0.2, rewards
    assert min(rewards[-5:]) > 0.4, rewards


def test_colocated_vllm_trains_in_the_training_process(tmp_path: Path) -> None:
    """vllm_mode='colocate' (TRL's default): the engine lives in the training process, which must have vLLM
    (run here with .venv-vllm's Python, where make vllm installs rloo beside it)."""
    python = vllm_python() if _has_vllm_env() else pytest.skip("no .venv-vllm (make vllm)")
    probe = subprocess.run([python, "-c", "import accelerate, peft, vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"{python} lacks rloo's dependencies (make vllm installs them): {probe.stderr[-200:]}")
    env = child_env(PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    result = subprocess.run(
        [python, "tests/helpers/colocate_run.py", str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    found = json.loads(line.removeprefix("RESULT "))
    assert found["mode"] == "colocate" and found["engine"] == "LocalEngine"
    assert found["synced_step"] == 2 and found["last_gap"] < 1e-3  # synced after each step, checked on the probe
    assert len(found["gaps"]) == 3 and max(found["gaps"]) < 1e-3


def _has_vllm_env() -> bool:
    try:
        vllm_python()
    except ValueError:
        return False
    return True


def test_colocate_without_vllm_installed_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from rloo.generation.vllm import sampler as vllm_sampler

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "vllm" else real(name))
    monkeypatch.setattr(vllm_sampler, "_COLOCATED", {})
    with pytest.raises(ValueError, match=r"vllm_mode='colocate' runs vLLM in the training process.*make vllm"):
        train_through("http://127.0.0.1:1", save_tiny_model(tmp_path / "m"), tmp_path / "run", vllm_mode="colocate")


def test_greedy_answers_name_each_prompt_once(server: str) -> None:
    """Greedy requests for n > 1 run each prompt n times (vLLM's rule); the answer still has one prompt entry
    per prompt and n completions for each, as TRL's protocol says."""
    request = {"prompts": PROMPTS, "n": 2, "max_tokens": 3, "temperature": 0.0}
    answer = VLLMClient(server)._request("/generate/", json.dumps(request).encode())
    assert answer["prompt_ids"] == PROMPTS
    assert len(answer["completion_ids"]) == 2 * len(PROMPTS)


def test_stop_strings_end_vllms_completions_as_they_end_rloos(server: str, model_dir: Path) -> None:
    """A stop string ends a completion after the token that completes it, kept in it, not truncated: the
    same completions from vLLM (its own stop, then rloo's rule over the tokens) as from rloo's sampler."""
    from rloo.generation.stopping import StopStrings

    tokenizer = build_char_tokenizer()
    model = perturbed(model_dir, seed=2)
    greedy = SamplingParams(temperature=0.0)
    kwargs: dict[str, Any] = {"num_generations": 1, "max_new_tokens": 12, "eos_token_ids": [EOS], "pad_token_id": 0}
    free = generate_rollouts(model, PROMPTS, [0, 1, 2], params=greedy, **kwargs)
    text = tokenizer.decode(free.completion_id_lists()[0], skip_special_tokens=True)
    stop = StopStrings(tokenizer, [text[2:4]])  # completed at the 4th token of the first completion, at least
    ours = generate_rollouts(model, PROMPTS, [0, 1, 2], params=greedy, stop=stop, **kwargs)
    served = VLLMSampler(server, timeout=60)(model, PROMPTS, [0, 1, 2], params=greedy, stop=stop, step=1, **kwargs)
    assert served.completion_id_lists() == ours.completion_id_lists()
    assert served.truncated.tolist() == ours.truncated.tolist()
    assert not served.truncated[0] and len(served.completion_id_lists()[0]) <= 4
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)


def test_evaluation_samples_on_the_same_engine(server: str, model_dir: Path, tmp_path: Path) -> None:
    """trainer.evaluate() draws its completions from the server too, with the policy's weights sent first."""
    trainer = train_through(server, model_dir, tmp_path / "eval", max_steps=1)
    sampler = trainer.rollout_settings.engine
    calls: list[int] = []
    original = sampler.client.generate

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(len(args[0]))
        return original(*args, **kwargs)

    sampler.client.generate = counting
    metrics = trainer.evaluate(eval_dataset=[{"prompt": f"{a}+1="} for a in range(4)])
    assert calls and sum(calls) >= 4  # the evaluation prompts went to vLLM
    assert "eval_reward" in metrics
    assert sampler.synced_step == trainer.state.global_step and sampler.last_gap < 1e-3
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)


@pytest.mark.parametrize("correction", [True, False])
def test_the_old_logprobs_are_computed_only_where_something_reads_them(
    server: str, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, correction: bool
) -> None:
    """With vLLM, beta 0 and one optimizer step per batch, rloo's own old log-probs feed only the engines'
    importance weights (and gap): without the correction, none are computed; with it, the step's one pass gives
    them (issue 40: before, a no-grad forward of their own). At temperature 0.7 too."""
    from rloo.training import experience

    calls: list[int] = []
    original = experience.no_grad_logprobs
    monkeypatch.setattr(experience, "no_grad_logprobs", lambda *a, **k: calls.append(1) or original(*a, **k))
    trainer = train_through(
        server,
        model_dir,
        tmp_path / "run",
        max_steps=1,
        beta=0.0,
        temperature=0.7,
        vllm_importance_sampling_correction=correction,
    )
    assert not calls  # no separate forward either way
    logged = [e for e in trainer.state.log_history if names.ENGINE_GAP_MAX in e]
    assert bool(logged) == correction
    if correction:  # the same weights in two float32 engines: weights of 1, nothing masked
        assert logged[0][names.ENGINE_GAP_MAX] < 1e-3
        assert logged[0][names.IS_RATIO_MEAN] == pytest.approx(1.0, abs=1e-2)
        assert logged[0][names.IS_MASKED_FRAC] == 0.0
    VLLMSampler(server, timeout=60).sync(load(model_dir), 0)


def test_image_prompts_with_vllm_are_refused_naming_the_fix(model_dir: Path) -> None:
    sampler = VLLMSampler("http://127.0.0.1:1", timeout=1)
    with pytest.raises(NotImplementedError, match="image prompts with use_vllm are not built yet: train them without"):
        sampler(
            load(model_dir),
            PROMPTS,
            [0, 1, 2],
            num_generations=1,
            max_new_tokens=2,
            params=SamplingParams(),
            eos_token_ids=[EOS],
            pad_token_id=0,
            vision=object(),
        )


def test_sleep_mode_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from rloo.generation.vllm.colocate import LocalEngine

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else real(name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = RLOOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_enable_sleep_mode=True)
    with pytest.raises(ValueError, match=r"vllm_enable_sleep_mode=True frees vLLM's GPU memory .* on a CPU remove it"):
        LocalEngine(args)


def test_tool_episodes_sample_each_turn_on_the_server(tmp_path: Path) -> None:
    """Multi-turn episodes through vLLM: each turn is a request continuing the episode's tokens; the engines'
    log-probs of the model's turns agree (the tool answers are masked out of the gap)."""
    from tests.helpers.tools import multiply, question, taught_model, tool_tokenizer

    folder = tmp_path / "taught"
    taught_model().save_pretrained(folder)
    tool_tokenizer().save_pretrained(folder)
    rows = [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5)] * 2]
    with vllm_server(folder) as url:
        args = RLOOConfig(
            output_dir=str(tmp_path / "run"),
            use_vllm=True,
            vllm_mode="server",
            vllm_server_base_url=url,
            num_generations=2,
            per_device_train_batch_size=4,
            max_completion_length=120,
            max_tool_calling_iterations=2,
            max_steps=2,
            logging_steps=1,
            report_to=[],
            seed=0,
        )
        trainer = RLOOTrainer(
            str(folder),
            lambda completions, **_: [float(c[-1]["content"] in ("12", "10")) for c in completions],
            args=args,
            train_dataset=rows,
            processing_class=tool_tokenizer(),
            tools=[multiply],
        )
        trainer.train()
    logged = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    assert len(logged) == 2 and logged[0]["tools/call_frequency"] > 0.5
    assert logged[0][names.ENGINE_GAP_MAX] < 1e-3 and logged[0][names.IS_MASKED_FRAC] == 0.0
