"""Know before you rent: the peak memory of each phase of an rloo step, from a config and a model config.

:func:`plan_memory` predicts, without weights (the model is built on the meta device to count its
parameters and find its LoRA targets), the bytes of tensors alive at the peak of each phase of one
training step, as ``torch.cuda.max_memory_allocated`` counts them (the caching allocator's reserve and
the CUDA context come on top: :data:`CUDA_OVERHEAD`). Every term is a shape product written out below,
for the worst case: every completion runs to ``max_completion_length``, every prompt is
``prompt_length`` tokens long. ``rloo plan`` prints it; ``benchmarks/memory_plan.py`` checks it against
measured peaks (BENCHMARKS.md).

Phases, each on top of the state that lives through the step (weights, the reference copy, the
optimizer's moments, the autocast weight cache under mixed precision, and the bf16 copy the policy samples
through with ``sampler_cuda_graphs`` or ``use_transformers_continuous_batching`` under bf16):

1. sampling     the prompt prefill (one layer's temporaries over P x Tp tokens), then a KV cache for
                N = P x K rows x (Tp + Tc) tokens, preallocated (:mod:`rloo.generation.kv_cache`: the
                prompt cache repeated K times lives beside the buffer while it is copied in), and the
                decode step's float32 logits and sampling temporaries, ``(N, V)``;
2. log-probs    no-grad passes of at most ``per_device_train_batch_size`` rows: the rows' prompt cache,
                one layer's temporaries, the completions' hidden states and one chunk of the LM head's
                float32 logits (``max_logits_memory_mb``), plus the stored ``(N, Tc)`` log-probs;
3. training     a micro-batch's saved activations (every layer's, or with gradient checkpointing each
                layer's input plus one layer recomputed; a lean gated MLP's two tensors of its width,
                :mod:`rloo.forward.lean_mlp`, where a float32 pass takes it), one head chunk with its
                gradient, the gradients, and the optimizer step's temporaries.

The head's temporaries are those of the kernel the run's device takes (:mod:`rloo.forward.fused_head`):
the chunked head's float32 chunk copies, or the fused head's tile buffers (a CPU's default) and, in its
backward, the float32 gradients of its inputs and weight.

A micro-batch's prompt is run once for its K rows where the model's cache allows it
(:mod:`rloo.forward.shared_prompt`: full-attention families, no gradient checkpointing, one
process); elsewhere each row runs its prompt. The per-token activation counts are those of a
Llama-style layer (RMSNorm, attention with grouped KV heads, a gated MLP), as transformers' own
implementations save them: other families (MoE, hybrid, vision towers) are planned as if they were
that layer, which the plan says.
"""

# size: one model of memory, kept together: the shape and workload read off a config, the per-phase terms (each
# checked by hand in tests), the device sizes and the fixes that re-plan it
from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from rloo.forward.fused_head import CPU_GRAD_TOKEN_TILE, default_kernel
from rloo.forward.layers import per_layer
from rloo.forward.lean_mlp import LEAN_VARIABLE

GiB = 2**30
MiB = 2**20
# the CUDA context, cuBLAS workspaces and the caching allocator's slack, outside max_memory_allocated
CUDA_OVERHEAD = 1.5 * GiB
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# memory of common accelerators, GiB (as nvidia-smi reports them)
DEVICES = {"h100": 79.6, "h200": 139.8, "a100-80gb": 79.2, "a100-40gb": 39.4, "l40s": 44.4, "a10g": 22.0, "l4": 22.0}
# a layer's tensors saved for the backward, per token, in hidden sizes (H) and MLP widths (I): the residual
# input, the normalized input, q, the attention output and its projection's input, the second residual
# and normalization (7 H); gate, its activation, up and their product (4 I); keys and values (2 kv) apart
SAVED_H, SAVED_I = 7, 4
# a lean gated MLP (rloo.forward.lean_mlp: float32 passes) saves gate and up only
LEAN_SAVED_I = 2
# one layer's temporaries in a no-grad forward, per token: the residual and a normalized input (2 H), gate,
# its activation and up alive at once (3 I)
NO_GRAD_H, NO_GRAD_I = 2, 3
# one head chunk: its logits, the float32 copy scored and the softmax (x2 without, x3 with gradient)
HEAD_NO_GRAD, HEAD_GRAD = 1, 4
# the fused head (a CPU's): a tile buffer and its exponentials' scratch in the forward; in the backward one
# tile buffer beside the float32 gradients of the head's inputs and (a trained head) its weight. Under
# mixed precision the buffer holds bf16 logits and the fold works on a float32 copy: half a chunk more
FUSED_FORWARD, FUSED_BACKWARD, FUSED_BF16_BUFFER = 2, 1, 0.5
# the sampler's (N, V) float32 decode temporaries: logits, scaled logits, probabilities, draws
SAMPLING_V = 4
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "adafactor": 1, "sgd": 1, "lion": 1, "rmsprop": 1}


@dataclass(frozen=True)
class ModelShape:
    """What the plan reads off a model config: sizes, the parameter count and every linear layer's
    ``(name, in_features, out_features)`` (for LoRA's targets)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    parameters: int
    linears: tuple[tuple[str, int, int], ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Read a transformers config (a vision-language model's text config is the planned one);
        parameters are counted on a model built on the meta device (no memory, no weights)."""
        import torch
        from transformers import AutoModelForCausalLM

        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(per_layer(text, "num_attention_heads", 1)[0])
        hidden = int(text.hidden_size)
        head_dims = [int(d or hidden // heads) for d in per_layer(text, "head_dim")]
        kv_heads = [int(h or heads) for h in per_layer(text, "num_key_value_heads")]
        head_dim = round(sum(head_dims) / len(head_dims))
        kv_dims = sum(h * d for h, d in zip(kv_heads, head_dims, strict=True)) / len(head_dims)
        notes = []
        if getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None):
            notes.append("a mixture-of-experts model: activations planned as one dense MLP per token")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        linears = tuple(
            (name, int(module.in_features), int(module.out_features))
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
        )
        intermediate = getattr(text, "intermediate_size", None) or 4 * hidden
        return cls(
            vocab_size=int(text.vocab_size),
            hidden_size=hidden,
            intermediate_size=int(intermediate),
            num_layers=int(text.num_hidden_layers),
            num_heads=heads,
            # a heterogeneous config (Gemma 4) holds these per layer: their mean keeps the totals
            num_kv_heads=round(kv_dims / head_dim),
            head_dim=head_dim,
            parameters=sum(p.numel() for p in model.parameters()),
            linears=linears,
            notes=tuple(notes),
        )

    def lora_parameters(self, rank: int, targets: Iterable[str] | str | None) -> int:
        """Adapter parameters of LoRA rank ``rank`` on the linear layers ``targets`` names (peft's
        matching: a name or a name suffix; a string is a regular expression; None: attention and MLP
        projections, peft's defaults for Llama-style models)."""
        if targets is None:
            targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        if isinstance(targets, str):
            if targets == "all-linear":
                chosen = [(n, i, o) for n, i, o in self.linears if not n.endswith("lm_head")]
            else:
                chosen = [(n, i, o) for n, i, o in self.linears if re.fullmatch(targets, n)]
        else:
            names = tuple(targets)
            chosen = [(n, i, o) for n, i, o in self.linears if any(n == t or n.endswith("." + t) for t in names)]
        return sum(rank * (i + o) for _, i, o in chosen)


@dataclass(frozen=True)
class Workload:
    """One process's share of a step, read off an RLOOConfig (:meth:`from_config`)."""

    prompts: int  # P, per generation batch on one process
    num_generations: int  # K
    prompt_length: int  # Tp
    completion_length: int  # Tc
    micro_batch: int  # per_device_train_batch_size
    weight_bytes: int = 4
    mixed_precision: bool = False  # bf16/fp16 autocast over float32 weights
    reference_copy: bool = False  # beta > 0 without LoRA: a second model
    lora_rank: int | None = None
    lora_targets: Any = None
    gradient_checkpointing: bool = False
    optimizer_states: int = 2
    max_logits_mib: float = 256.0
    shards: int = 1  # FSDP: weights, gradients and optimizer state split over this many processes
    stored_logprobs: int = 0  # (N, Tc) float32 tensors kept from phase 2 (reference, old)
    fused_head: bool = False  # the head's kernel (rloo.forward.fused_head.head_kernel): fused, else chunked
    grad_tile_tokens: int | None = None  # a CPU fused head's training tiles: at most this many tokens (cpu_tiles)
    lean_mlp: bool = False  # gated MLPs may be lean (lean_planned); plan_memory: not under checkpointing or FSDP
    # bf16 autocast over float32 weights with sampler_cuda_graphs or use_transformers_continuous_batching: the
    # policy samples through a bf16 copy of its weights, kept between rollouts (rloo.generation.graph_decode)
    sampling_copy: bool = False

    @classmethod
    def from_config(
        cls,
        args: Any,
        prompt_length: int,
        lora: Any = None,
        shards: int = 1,
        bf16_default: bool | None = None,
        device_type: str | None = None,
    ) -> Workload:
        """``args``: an RLOOConfig; ``lora``: a peft LoraConfig (or None); ``shards``: FSDP processes;
        ``bf16_default``: whether the planned device runs bf16, for ``bf16=None`` (None: this machine's GPU);
        ``device_type``: ``"cuda"`` or ``"cpu"``, whose head kernel is planned (None: this machine's)."""
        weight_bytes = DTYPE_BYTES.get(weight_dtype(args), 4)
        from rloo.training.setup.models import bf16_supported

        if device_type is None:
            device_type = "cuda" if torch.cuda.is_available() else "cpu"

        if bf16_default is None:
            bf16_default = bf16_supported()
        bf16 = bf16_default if args.bf16 is None else bool(args.bf16)  # None: bf16 where the GPU has it
        mixed = (bf16 or bool(args.fp16)) and weight_bytes == 4
        beta = args.algorithm.beta
        optim = str(args.optim).lower()
        states = next((n for name, n in OPTIMIZER_STATES.items() if optim.startswith(name)), 2)
        stored = int(beta > 0) + int(args.optimizer_steps_per_generation > 1 or beta > 0)
        return cls(
            prompts=args.prompts_per_generation,
            num_generations=args.num_generations,
            prompt_length=prompt_length,
            completion_length=args.max_completion_length,
            micro_batch=args.per_device_train_batch_size,
            weight_bytes=weight_bytes,
            mixed_precision=mixed,
            reference_copy=beta > 0 and lora is None,
            lora_rank=None if lora is None else int(lora.r),
            lora_targets=None if lora is None else _targets(lora.target_modules),
            gradient_checkpointing=bool(args.gradient_checkpointing),
            optimizer_states=states,
            max_logits_mib=float(args.max_logits_memory_mb),
            shards=shards,
            stored_logprobs=stored,
            fused_head=default_kernel(device_type) == "fused",
            grad_tile_tokens=CPU_GRAD_TOKEN_TILE if device_type == "cpu" else None,
            lean_mlp=lean_planned(mixed, bool(args.torch_compile), lora),
            sampling_copy=mixed
            and bf16
            and bool(args.sampler_cuda_graphs or args.use_transformers_continuous_batching),
        )


def weight_dtype(args: Any) -> str:
    """The dtype the weights load in: ``model_init_kwargs``' ``dtype``, else float32 (rloo's default)."""
    return str((args.model_init_kwargs or {}).get("dtype", "float32")).removeprefix("torch.")


def lean_planned(mixed: bool, compiled: bool, lora: Any) -> bool:
    """Whether a run's gated MLPs may take :func:`rloo.forward.lean_mlp.lean_gated_mlps`: passes without autocast
    or ``torch.compile``, the down projection not a LoRA layer, and not turned off (gradient checkpointing and
    FSDP, which a fix may change, are :func:`plan_memory`'s to check)."""
    targets = None if lora is None else _targets(lora.target_modules)
    down_lora = targets is not None and (targets == "all-linear" or "down_proj" in targets)
    off = os.environ.get(LEAN_VARIABLE, "").strip() == "0"
    return not (mixed or compiled or down_lora or off)


def _targets(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Phase:
    """A phase's peak: its parts, bytes each (the shared state first)."""

    name: str
    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class MemoryPlan:
    phases: tuple[Phase, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)


def _largest(moments: dict[str, dict[str, float]]) -> dict[str, float]:
    """The parts of the moment holding the most."""
    return max(moments.values(), key=lambda parts: sum(parts.values()))


def activation_bytes(work: Workload) -> int:
    """Bytes per activation element: 2 under bf16/fp16 compute, else the weights' own."""
    return 2 if work.mixed_precision else work.weight_bytes


def head_bytes(work: Workload, vocab: int, hidden: int, tokens: float, grad: bool) -> float:
    """The LM head's temporaries over ``tokens`` completion positions, a chunk (or tile) of float32 logits
    at a time (``max_logits_memory_mb``): the chunked head's copies (:data:`HEAD_GRAD`), or the fused
    head's buffers (:data:`FUSED_FORWARD`), then in its backward a buffer beside the float32 gradients of
    the ``(tokens, hidden)`` inputs and (not under LoRA) the ``(vocab, hidden)`` weight. The fused head's two
    forward buffers share the budget; a CPU's trains on tiles of at most ``grad_tile_tokens`` tokens."""
    budget = int(work.max_logits_mib * MiB / 4)  # float32 logits
    if not work.fused_head:
        return min(tokens, max(1, budget // vocab)) * vocab * 4 * (HEAD_GRAD if grad else HEAD_NO_GRAD)
    rows = min(tokens, max(1, budget // (FUSED_FORWARD * vocab)))  # the forward's buffers share the budget
    if grad and work.grad_tile_tokens is not None:
        rows = min(rows, work.grad_tile_tokens)
    chunk = rows * vocab * 4
    extra = FUSED_BF16_BUFFER if work.mixed_precision else 0.0
    forward = chunk * (FUSED_FORWARD + extra)
    if not grad:
        return forward
    weight_grad = 0 if work.lora_rank is not None else vocab * hidden * 4
    return max(forward, chunk * (FUSED_BACKWARD + extra) + tokens * hidden * 4 + weight_grad)


def plan_memory(shape: ModelShape, work: Workload) -> MemoryPlan:
    """The peak bytes of each phase (module docstring). Worst case: full-length prompts and completions."""
    s, w = shape, work
    a = activation_bytes(w)
    h, i, v, layers = s.hidden_size, s.intermediate_size, s.vocab_size, s.num_layers
    kv_dim = s.num_kv_heads * s.head_dim
    q_dim = s.num_heads * s.head_dim
    kv_token = layers * 2 * kv_dim * a  # a token's keys and values, every layer
    n, k, tp, tc = w.prompts * w.num_generations, w.num_generations, w.prompt_length, w.completion_length
    lora = w.lora_rank is not None
    trainable = s.lora_parameters(w.lora_rank, w.lora_targets) if lora else s.parameters  # type: ignore[arg-type]
    trainable_bytes = 4 if lora else w.weight_bytes  # peft keeps adapters in float32

    state = {"weights": s.parameters * w.weight_bytes / w.shards + (trainable * 4 if lora else 0)}
    if w.reference_copy:
        state["reference model"] = s.parameters * w.weight_bytes / w.shards
    if w.optimizer_states:
        state["optimizer state"] = w.optimizer_states * trainable * trainable_bytes / w.shards
    if w.mixed_precision:  # autocast keeps a bf16 copy of each trainable weight for the whole forward
        state["autocast weight copies"] = trainable * 2
    if w.sampling_copy:  # the whole policy once more in bf16, kept between rollouts
        state["bf16 sampling copy"] = s.parameters * 2
    if w.shards > 1:  # FSDP gathers one layer's full weights at a time
        state["gathered layer"] = (s.parameters - v * h) / layers * w.weight_bytes

    def no_grad_layer(tokens: float) -> float:
        return tokens * (NO_GRAD_H * h + NO_GRAD_I * i + 2 * kv_dim) * a

    def head(tokens: float, grad: bool) -> float:
        return head_bytes(w, v, h, tokens, grad)

    # 1. sampling: the largest of its three moments
    moments: dict[str, dict[str, float]] = {
        "prefill": {
            "prompt KV cache": w.prompts * tp * kv_token,
            "one layer's temporaries": no_grad_layer(w.prompts * tp),
        },
        # preallocation copies layer by layer: one layer's repeated prompt cache beside the full buffer
        "cache copy": {"a layer's repeated prompt cache": n * tp * kv_token / layers},
        "decode": {"decode logits and sampling": SAMPLING_V * n * v * 4},
    }
    for moment in ("cache copy", "decode"):
        moments[moment]["KV cache"] = n * (tp + tc) * kv_token
    sampling = {**state, **_largest(moments)}

    # 2. no-grad log-prob passes (reference, old), rows <= a micro-batch
    rows = min(w.micro_batch, n)
    prompts_in_pass = math.ceil(rows / k)
    shared = w.shards == 1 and not w.gradient_checkpointing  # (module docstring)
    stored = w.stored_logprobs * n * tc * 4
    if shared:  # the prompt forward, then a completion forward on the rows' cache (selected, then extended)
        prompt_cache = prompts_in_pass * tp * kv_token
        moments = {
            "prompt forward": {
                "prompt cache": prompt_cache,
                "one layer's temporaries": no_grad_layer(prompts_in_pass * tp),
            },
            "completion forward": {
                "prompt cache, selected and extended": prompt_cache + rows * (2 * tp + tc) * kv_token,
                "one layer's temporaries": no_grad_layer(rows * tc),
            },
            # the caches are gone when the head runs over the completions' hidden states
            "head": {"head hidden states": rows * tc * h * a, "head chunk": head(rows * tc, grad=False)},
        }
    else:
        moments = {
            "forward": {"one layer's temporaries": no_grad_layer(rows * (tp + tc))},
            "head": {"head hidden states": rows * tc * h * a, "head chunk": head(rows * tc, grad=False)},
        }
    logprobs = {**state, "stored log-probs": stored, **_largest(moments)}

    # 3. training: one micro-batch's forward and backward, then the optimizer step
    grads = trainable * trainable_bytes / w.shards
    lean = w.lean_mlp and not w.gradient_checkpointing and w.shards == 1  # neither takes the lean MLP
    saved_token = SAVED_H * h + (LEAN_SAVED_I if lean else SAVED_I) * i + 2 * kv_dim + (q_dim - h)
    tokens = (prompts_in_pass * tp if shared else rows * tp) + rows * tc
    if w.gradient_checkpointing:
        saved = layers * tokens * h * a + tokens * saved_token * a
    else:
        saved = layers * tokens * saved_token * a
        if shared:  # the completion forward's cache: the rows' prompt cache selected, then extended
            saved += rows * (2 * tp + tc) * kv_token
    training = {
        **state,
        "stored log-probs": stored,
        "gradients": grads,
        "saved activations": saved,
        "head hidden states": rows * tc * h * a,
        "head chunk": head(rows * tc, grad=True),
    }
    step = {**state, "stored log-probs": stored, "gradients": grads, "optimizer temporaries": grads}
    phases = (
        Phase("sampling", sampling),
        Phase("log-probs", logprobs),
        Phase("training", training),
        Phase("optimizer step", step),
    )
    return MemoryPlan(phases, s.notes)


def device_bytes(device: str) -> tuple[float, bool]:
    """``(bytes, is_cuda)`` of a device: a GPU name of :data:`DEVICES`, a GPU's memory (``80GiB``, ``24GB``)
    or a CPU's (``cpu:64GiB``: no CUDA overhead)."""
    name = device.strip().lower()
    if name.startswith("cpu:"):
        return device_bytes(name.removeprefix("cpu:"))[0], False
    if name in DEVICES:
        return DEVICES[name] * GiB, True
    match = re.fullmatch(r"([0-9.]+)\s*(gib|gb|g)?", name)
    if match is None:
        known = ", ".join(DEVICES)
        raise ValueError(f"device {device!r}: give a GPU name ({known}), a GPU memory size (80GiB) or cpu:<size>")
    return float(match.group(1)) * (GiB if match.group(2) in (None, "gib", "g") else 1e9), True


def fits(plan: MemoryPlan, capacity: float, cuda: bool = True) -> bool:
    """Whether the peak phase, plus :data:`CUDA_OVERHEAD` on a GPU, fits ``capacity`` bytes."""
    return plan.peak.total + (CUDA_OVERHEAD if cuda else 0.0) <= capacity


def fixes(shape: ModelShape, work: Workload, capacity: float, cuda: bool = True) -> list[str]:
    """The single changes (config fields, in the order a user would try them) that make the plan fit
    ``capacity``; empty when it already fits or no single change does."""
    if fits(plan_memory(shape, work), capacity, cuda):
        return []
    from dataclasses import replace

    tried: list[tuple[str, Workload]] = []
    if not work.gradient_checkpointing:
        tried.append(("gradient_checkpointing: true", replace(work, gradient_checkpointing=True)))
    for budget in (64.0, 16.0):
        if work.max_logits_mib > budget:
            tried.append((f"max_logits_memory_mb: {budget:g}", replace(work, max_logits_mib=budget)))
    rows = work.micro_batch // 2
    while rows >= 1:
        tried.append((f"per_device_train_batch_size: {rows}", replace(work, micro_batch=rows)))
        rows //= 2
    steps = work.prompts * work.num_generations // work.micro_batch  # micro-batches per generation batch
    for fewer in range(steps - 1, 0, -1):  # a smaller generation batch of whole micro-batches
        prompts, left = divmod(fewer * work.micro_batch, work.num_generations)
        if not left:
            completions = fewer * work.micro_batch  # a multiple of the micro-batch, valid alone
            tried.append((f"generation_batch_size: {completions}", replace(work, prompts=prompts)))
    if work.lora_rank is None:
        tried.append(
            (
                "peft: {r: 16} (LoRA; the reference is then the base model, no copy)",
                replace(work, lora_rank=16, lora_targets=None, reference_copy=False),
            )
        )
    for shards in (2, 4, 8):
        if shards > work.shards:
            tried.append(
                (
                    f"FSDP2 over {shards} GPUs (accelerate launch --use_fsdp --fsdp_version 2)",
                    replace(work, shards=shards),
                )
            )
    found = [name for name, changed in tried if fits(plan_memory(shape, changed), capacity, cuda)]
    # of each knob, the first that fits (the largest batch, the fewest GPUs), not every one after it
    knob = [name.split(":")[0].split(" over ")[0] for name in found]
    return [name for n, name in enumerate(found) if n == 0 or knob[n] != knob[n - 1]]
