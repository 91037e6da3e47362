"""The memory plan (``rloo plan``): parameter counts against real models, each term by hand, what lowers
it, the fixes it offers, device sizes, and one predicted step peak against a measured one (CPU)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from rloo import RLOOConfig
from rloo.cli.run_file import build_peft_config
from rloo.forward.fused_head import CPU_GRAD_TOKEN_TILE
from rloo.forward.lean_mlp import LEAN_VARIABLE
from rloo.training.setup.memory_plan import (
    CUDA_OVERHEAD,
    DEVICES,
    GiB,
    ModelShape,
    Workload,
    device_bytes,
    fits,
    fixes,
    head_bytes,
    plan_memory,
)

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from memory_measure import measure_step  # noqa: E402
from memory_plan import BASE, Case, llama, predict  # noqa: E402


def tiny_llama(**changes: Any) -> LlamaConfig:
    sizes = {"vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
    return LlamaConfig(**{**sizes, "num_attention_heads": 4, "num_key_value_heads": 2, **changes})


def tiny_qwen2() -> Qwen2Config:  # q, k and v projections with a bias
    return Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )


CONFIGS = {
    "llama": tiny_llama,
    "llama, tied embeddings": lambda: tiny_llama(tie_word_embeddings=True),
    "qwen2 (qkv bias)": tiny_qwen2,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shape_counts_the_parameters_of_the_real_model(name: str) -> None:
    config = CONFIGS[name]()
    shape = ModelShape.from_config(config)
    model = AutoModelForCausalLM.from_config(config)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim) == (2, 4, 2, 8)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("rank", [1, 8])
def test_lora_parameters_are_peft_trainable_parameters(name: str, rank: int) -> None:
    from peft import LoraConfig, get_peft_model

    config = CONFIGS[name]()
    shape = ModelShape.from_config(config)
    lora = LoraConfig(r=rank, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_config(config), lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape.lora_parameters(rank, ["q_proj", "v_proj"]) == trainable


# --- each term by hand, on a shape written out: H 16, I 32, 2 layers, 4 heads, 2 KV heads of 4, V 100 ---
LAYER_LINEARS = [("q_proj", 16, 16), ("k_proj", 16, 8), ("v_proj", 16, 8), ("o_proj", 16, 16)]
LAYER_LINEARS += [("gate_proj", 16, 32), ("up_proj", 16, 32), ("down_proj", 32, 16)]
SHAPE = ModelShape(
    vocab_size=100,
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    parameters=12_345,
    linears=(
        *((f"model.layers.{n}.self_attn.{name}", i, o) for n in range(2) for name, i, o in LAYER_LINEARS),
        ("lm_head", 16, 100),
    ),
)
# P 2 prompts x K 4 = N 8 rows, Tp 8, Tc 4, micro-batch 4, float32 weights
WORK = Workload(prompts=2, num_generations=4, prompt_length=8, completion_length=4, micro_batch=4, stored_logprobs=2)
N, TOKENS = 2 * 4, 8 + 4
LORA_Q_V = 2 * 8 * ((16 + 16) + (16 + 8))  # 2 layers x r 8 x (in + out) of q_proj and v_proj: 896


def test_float32_terms_by_hand() -> None:
    plan = plan_memory(SHAPE, replace(WORK, reference_copy=True))
    sampling = plan.phase("sampling").parts
    # N x (Tp + Tc) tokens x 2 layers x (K and V) x 2 KV heads x head_dim 4 x 4 bytes
    assert sampling["KV cache"] == N * TOKENS * 2 * 2 * 2 * 4 * 4 == 12_288
    assert sampling["weights"] == 12_345 * 4
    assert sampling["reference model"] == 12_345 * 4
    assert sampling["optimizer state"] == 2 * 12_345 * 4  # AdamW's two moments
    assert sampling["decode logits and sampling"] == 4 * N * 100 * 4  # 4 float32 (N, V) tensors
    training = plan.phase("training").parts
    assert training["gradients"] == 12_345 * 4
    assert training["stored log-probs"] == 2 * N * 4 * 4  # reference and old, (N, Tc) float32
    assert training["head chunk"] == 4 * 4 * 100 * 4 * 4  # micro-batch 4 x Tc 4 tokens x V x 4 bytes x 4
    assert "autocast weight copies" not in training and "gathered layer" not in training


def test_mixed_precision_halves_activations_and_adds_the_autocast_copies() -> None:
    plan = plan_memory(SHAPE, replace(WORK, mixed_precision=True))
    sampling = plan.phase("sampling").parts
    assert sampling["KV cache"] == N * TOKENS * 2 * 2 * 2 * 4 * 2  # bf16 keys and values
    assert sampling["weights"] == 12_345 * 4  # the float32 master weights stay
    assert sampling["autocast weight copies"] == 12_345 * 2
    fp32 = plan_memory(SHAPE, WORK).phase("training").parts
    assert plan.phase("training").parts["saved activations"] == fp32["saved activations"] / 2


def test_the_bf16_sampling_copy_is_planned_where_a_sampler_keeps_one(tmp_path: Path) -> None:
    # sampler_cuda_graphs and transformers' continuous batching sample through a bf16 copy of the policy under
    # bf16 autocast, kept between rollouts: every phase holds it (it was not planned)
    plan = plan_memory(SHAPE, replace(WORK, mixed_precision=True, sampling_copy=True))
    for phase in ("sampling", "log-probs", "training"):
        assert plan.phase(phase).parts["bf16 sampling copy"] == 12_345 * 2
    assert "bf16 sampling copy" not in plan_memory(SHAPE, replace(WORK, mixed_precision=True)).phase("sampling").parts

    def planned(**fields: Any) -> bool:
        args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, **fields)
        return Workload.from_config(args, 16, device_type="cuda").sampling_copy

    assert planned(bf16=True, use_transformers_continuous_batching=True)
    assert planned(bf16=True, sampler_cuda_graphs=True)
    assert not planned(bf16=True) and not planned(bf16=False, use_transformers_continuous_batching=True)
    assert not planned(bf16=True, sampler_cuda_graphs=True, model_init_kwargs={"dtype": "bfloat16"})  # bf16 weights


def test_the_fused_head_plans_its_tile_buffers_and_its_float32_gradients_by_hand() -> None:
    # every completion token in one chunk: 32 tokens at V 100 -> 12,800 bytes of float32 logits
    chunk, fused = 32 * 100 * 4, replace(WORK, fused_head=True)
    assert head_bytes(fused, 100, 16, 32, grad=False) == 2 * chunk  # the tile buffer and the exponentials'
    # the backward: one buffer, the inputs' (32, 64) and the weight's (100, 64) float32 gradients
    assert head_bytes(fused, 100, 64, 32, grad=True) == chunk + 32 * 64 * 4 + 100 * 64 * 4
    assert head_bytes(fused, 100, 16, 32, grad=True) == 2 * chunk  # the forward's buffers are the larger
    lora = replace(fused, lora_rank=8)  # a frozen head: no weight gradient
    assert head_bytes(lora, 100, 128, 32, grad=True) == chunk + 32 * 128 * 4
    mixed = replace(fused, mixed_precision=True)  # bf16 logits in the buffer, the fold on a float32 copy
    assert head_bytes(mixed, 100, 16, 32, grad=False) == 2.5 * chunk
    assert head_bytes(WORK, 100, 16, 32, grad=False) == chunk  # the chunked head's
    assert head_bytes(WORK, 100, 16, 32, grad=True) == 4 * chunk
    # WORK's micro-batch: 4 rows x 4 completion tokens
    assert plan_memory(SHAPE, fused).phase("training").parts["head chunk"] == head_bytes(fused, 100, 16, 16, True)


def test_a_cpu_fused_head_trains_on_tiles_of_at_most_its_grad_tile_tokens(tmp_path: Path) -> None:
    # 32 tokens fit the budget; a CPU's training tiles hold 8 of them, its log-prob passes' all 32
    cpu = replace(WORK, fused_head=True, grad_tile_tokens=8)
    tile = 8 * 100 * 4
    assert head_bytes(cpu, 100, 16, 32, grad=True) == max(2 * tile, tile + 32 * 16 * 4 + 100 * 16 * 4)
    assert head_bytes(cpu, 100, 16, 32, grad=False) == 2 * 32 * 100 * 4
    # a budget of 4,000 float32 logits holds the forward's two buffers of 20 tokens each
    small = replace(cpu, max_logits_mib=4_000 * 4 / 2**20)
    assert head_bytes(small, 100, 16, 32, grad=False) == 2 * 20 * 100 * 4
    args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, bf16=False)
    assert Workload.from_config(args, 16, device_type="cpu").grad_tile_tokens == CPU_GRAD_TOKEN_TILE
    assert Workload.from_config(args, 16, device_type="cuda").grad_tile_tokens is None


def test_lora_has_no_reference_copy_and_optimizer_state_of_the_adapters_only() -> None:
    plan = plan_memory(SHAPE, replace(WORK, lora_rank=8, lora_targets=("q_proj", "v_proj")))
    assert SHAPE.lora_parameters(8, ["q_proj", "v_proj"]) == LORA_Q_V
    training = plan.phase("training").parts
    assert "reference model" not in training
    assert training["optimizer state"] == 2 * LORA_Q_V * 4
    assert training["gradients"] == LORA_Q_V * 4
    assert training["weights"] == 12_345 * 4 + LORA_Q_V * 4  # the frozen base and the float32 adapters


def test_workload_from_config_copies_the_reference_only_without_lora(tmp_path: Path) -> None:
    args = RLOOConfig(output_dir=str(tmp_path), beta=0.05, bf16=True, num_generations=4)
    assert Workload.from_config(args, 16).reference_copy
    assert Workload.from_config(args, 16).mixed_precision
    lora = build_peft_config({"r": 8, "target_modules": ["q_proj", "v_proj"]})
    with_lora = Workload.from_config(args, 16, lora)
    assert not with_lora.reference_copy and with_lora.lora_rank == 8
    assert set(with_lora.lora_targets) == {"q_proj", "v_proj"}  # peft keeps them as a set
    no_kl = RLOOConfig(output_dir=str(tmp_path), beta=0.0, num_generations=4)
    assert not Workload.from_config(no_kl, 16).reference_copy


def test_unset_bf16_plans_mixed_precision_where_the_gpu_has_bf16(tmp_path: Path, monkeypatch: Any) -> None:
    """bf16=None (the default) trains under bf16 autocast on a GPU with bf16: the plan must say so too (it
    planned float32 activations there before)."""
    from rloo.training.setup import models

    args = RLOOConfig(output_dir=str(tmp_path), num_generations=4)
    assert args.bf16 is None
    monkeypatch.setattr(models, "bf16_supported", lambda: True)
    assert Workload.from_config(args, 16).mixed_precision
    monkeypatch.setattr(models, "bf16_supported", lambda: False)
    assert not Workload.from_config(args, 16).mixed_precision
    assert not Workload.from_config(
        RLOOConfig(output_dir=str(tmp_path), bf16=False, num_generations=4), 16
    ).mixed_precision


def test_two_shards_halve_weights_gradients_and_optimizer_state() -> None:
    whole = plan_memory(SHAPE, replace(WORK, reference_copy=True)).phase("training").parts
    sharded = plan_memory(SHAPE, replace(WORK, reference_copy=True, shards=2)).phase("training").parts
    for part in ("weights", "reference model", "optimizer state", "gradients"):
        assert sharded[part] == whole[part] / 2, part
    # one layer gathered at a time: the parameters outside the embedding, over 2 layers
    assert sharded["gathered layer"] == (12_345 - 100 * 16) / 2 * 4


@pytest.mark.parametrize("layers", [2, 4, 16])
def test_gradient_checkpointing_lowers_the_saved_activations(layers: int) -> None:
    shape = replace(SHAPE, num_layers=layers)
    plain = plan_memory(shape, WORK).phase("training")
    checkpointed = plan_memory(shape, replace(WORK, gradient_checkpointing=True)).phase("training")
    assert checkpointed.parts["saved activations"] < plain.parts["saved activations"]
    assert checkpointed.total < plain.total


def test_lean_mlps_save_two_widths_a_token_fewer_where_a_run_takes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = plan_memory(SHAPE, WORK).phase("training").parts["saved activations"]
    lean = plan_memory(SHAPE, replace(WORK, lean_mlp=True)).phase("training").parts["saved activations"]
    # 2 layers x 2 float32 tensors of I = 32 a token, over a micro-batch's shared prompt and completions
    tokens = 1 * 8 + 4 * 4  # WORK: its 4 rows share one prompt (8 tokens), 4 completion tokens each
    assert plain - lean == 2 * 2 * 32 * 4 * tokens
    for off in ({"gradient_checkpointing": True}, {"shards": 2}):  # a fix that takes it away plans without it
        assert plan_memory(SHAPE, replace(WORK, lean_mlp=True, **off)) == plan_memory(SHAPE, replace(WORK, **off))
    args = RLOOConfig(output_dir=str(tmp_path), num_generations=4, bf16=False)
    assert Workload.from_config(args, 16).lean_mlp
    bf16 = RLOOConfig(output_dir=str(tmp_path), num_generations=4, bf16=True)
    assert not Workload.from_config(bf16, 16).lean_mlp  # autocast
    assert not Workload.from_config(args, 16, build_peft_config({"r": 8, "target_modules": "all-linear"})).lean_mlp
    assert Workload.from_config(args, 16, build_peft_config({"r": 8, "target_modules": ["q_proj"]})).lean_mlp
    compiled = RLOOConfig(output_dir=str(tmp_path), num_generations=4, bf16=False, torch_compile=True)
    assert not Workload.from_config(compiled, 16).lean_mlp  # its graphs are traced from the modules as loaded
    monkeypatch.setenv(LEAN_VARIABLE, "0")
    assert not Workload.from_config(args, 16).lean_mlp


def test_a_smaller_micro_batch_lowers_training() -> None:
    full = plan_memory(SHAPE, WORK).phase("training")
    half = plan_memory(SHAPE, replace(WORK, micro_batch=2)).phase("training")
    assert half.parts["saved activations"] < full.parts["saved activations"]
    assert half.total < full.total


# --- fixes: each one, applied to the run as a user would, re-planned ---
FIX_SHAPE_CONFIG = tiny_llama(vocab_size=32000, hidden_size=256, intermediate_size=512, num_hidden_layers=4)
# 4 prompts x K 4 per generation batch, micro-batches of 8 rows
FIX_RUN = {"num_generations": 4, "per_device_train_batch_size": 8, "generation_batch_size": 16}
FIX_RUN["max_completion_length"] = 256
FIX_PROMPT = 512
# the fixes are planned for a float32 GPU run on any machine (its head kernel), its MLPs not lean (each kind of
# fix then fits at 95% of its peak: with lean MLPs the head chunk is most of the training phase)
ON_CUDA: dict[str, Any] = {"device_type": "cuda", "bf16_default": False}


def applied(fix: str, fields: dict[str, Any], tmp_path: Path) -> Workload:
    """The run's workload with one printed fix applied: ``field: value`` (a run-file line), ``peft: {...}``
    or ``FSDP2 over S GPUs``; the words in parentheses explain it."""
    lora, shards = None, 1
    if fix.startswith("FSDP2 over "):
        shards = int(fix.split()[2])
    else:
        ((key, value),) = yaml.safe_load(fix.split(" (")[0]).items()
        if key == "peft":
            lora = build_peft_config(value)
        else:
            fields = {**fields, key: value}
    return Workload.from_config(RLOOConfig(output_dir=str(tmp_path), **fields), FIX_PROMPT, lora, shards, **ON_CUDA)


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize("fraction", [0.95, 0.6])
def test_every_fix_fits_when_applied_to_the_run(
    fraction: float, cuda: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LEAN_VARIABLE, "0")
    shape = ModelShape.from_config(FIX_SHAPE_CONFIG)
    work = Workload.from_config(RLOOConfig(output_dir=str(tmp_path), **FIX_RUN), FIX_PROMPT, **ON_CUDA)
    plan = plan_memory(shape, work)
    capacity = fraction * plan.peak.total + (CUDA_OVERHEAD if cuda else 0.0)
    assert not fits(plan, capacity, cuda)
    found = fixes(shape, work, capacity, cuda)
    assert found
    if fraction == 0.95:  # every kind of change is offered
        kinds = {fix.split(":")[0].split(" over ")[0] for fix in found}
        assert {"gradient_checkpointing", "per_device_train_batch_size", "peft", "FSDP2"} <= kinds, found
    for fix in found:
        fields = dict(FIX_RUN)
        if fix.startswith("generation_batch_size:"):
            # the plan takes the micro-batch down with it (test_a_generation_batch_size_fix_is_a_valid_run_alone)
            completions = int(fix.split(":")[1].split()[0])
            fields["per_device_train_batch_size"] = min(fields["per_device_train_batch_size"], completions)
        assert fits(plan_memory(shape, applied(fix, fields, tmp_path)), capacity, cuda), fix


def test_no_fixes_when_it_fits() -> None:
    plan = plan_memory(SHAPE, WORK)
    assert fixes(SHAPE, WORK, plan.peak.total, cuda=False) == []


# a smaller generation batch is offered in whole micro-batches: a valid run alone
def test_a_generation_batch_size_fix_is_a_valid_run_alone(tmp_path: Path) -> None:
    run = {**FIX_RUN, "per_device_train_batch_size": 4, "generation_batch_size": 512}  # sampling is the peak
    shape = ModelShape.from_config(FIX_SHAPE_CONFIG)
    work = Workload.from_config(RLOOConfig(output_dir=str(tmp_path), **run), FIX_PROMPT)
    plan = plan_memory(shape, work)
    assert plan.peak.name == "sampling"
    capacity = 0.95 * plan.peak.total
    fix = next(f for f in fixes(shape, work, capacity, cuda=False) if f.startswith("generation_batch_size:"))
    assert fits(plan_memory(shape, applied(fix, run, tmp_path)), capacity, cuda=False)


# reported: the fewest GPUs that fit, as the largest micro-batch that fits, not every larger count
def test_fixes_offer_only_the_fewest_gpus_that_fit(tmp_path: Path) -> None:
    shape = ModelShape.from_config(FIX_SHAPE_CONFIG)
    work = Workload.from_config(RLOOConfig(output_dir=str(tmp_path), **FIX_RUN), FIX_PROMPT)
    capacity = 0.95 * plan_memory(shape, work).peak.total
    assert len([f for f in fixes(shape, work, capacity, cuda=False) if f.startswith("FSDP2")]) == 1


# --- devices ---
def test_fits_adds_the_cuda_overhead_on_a_gpu_only() -> None:
    plan = plan_memory(SHAPE, WORK)
    capacity = plan.peak.total + CUDA_OVERHEAD / 2
    assert fits(plan, capacity, cuda=False)
    assert not fits(plan, capacity, cuda=True)
    assert fits(plan, plan.peak.total + CUDA_OVERHEAD, cuda=True)


def test_device_bytes_of_names_sizes_and_cpus() -> None:
    assert device_bytes("h100") == (DEVICES["h100"] * GiB, True)
    assert device_bytes("H100 ") == (DEVICES["h100"] * GiB, True)
    assert device_bytes("24GiB") == (24 * GiB, True)
    assert device_bytes("24GB") == (24e9, True)
    assert device_bytes("cpu:64GiB") == (64 * GiB, False)


def test_an_unknown_device_names_the_choices() -> None:
    with pytest.raises(ValueError, match="h1000") as error:
        device_bytes("h1000")
    for name in DEVICES:
        assert name in str(error.value)
    assert "cpu:" in str(error.value)


# --- a measured step (benchmarks/memory_measure.py): live tensor bytes on the CPU ---
@pytest.mark.usefixtures("one_thread")
def test_predicted_step_peak_is_within_15_percent_of_the_measured_one() -> None:
    case = Case("2-layer Llama, vocabulary 2000", llama(2000), 64, {**BASE, "max_completion_length": 16})
    plan = predict(case)
    measured = measure_step(case.model, case.config, case.prompt_length, case.lora())
    assert measured.peak == pytest.approx(plan.peak.total, rel=0.15), (plan.peak.total, measured.phases)
    for name in ("sampling", "log-probs"):  # each measured phase, not only the largest
        assert measured.phases[name] == pytest.approx(plan.phase(name).total, rel=0.15), name


def test_a_config_with_per_layer_head_sizes_is_planned_by_its_layers_mean() -> None:
    # Gemma 4 keeps head_dim per layer (its full-attention layers' is larger): reading it off the config raises
    from transformers import Gemma4TextConfig

    config = Gemma4TextConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        global_head_dim=16,
        layer_types=["sliding_attention", "full_attention"] * 2,
        hidden_size_per_layer_input=8,
    )
    shape = ModelShape.from_config(config)
    # head sizes 8, 16, 8, 16 (mean 12); keys per token 2 x (8 + 16 + 8 + 16) / 4 = 24 = 2 heads x 12
    assert (shape.head_dim, shape.num_kv_heads, shape.num_heads) == (12, 2, 4)
