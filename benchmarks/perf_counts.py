"""Counts, not timings: what a training step costs, in numbers that do not depend on the machine's speed.

    .venv/bin/python benchmarks/perf_counts.py           # the counts, compared with tests/perf_baseline.json
    .venv/bin/python benchmarks/perf_counts.py --write   # rewrite the baseline on purpose (make perf-baseline)

Timings on a shared machine are too noisy to gate on; these counts are exact. For a few fixed tiny cases
(:data:`CASES`: completions of fixed lengths, varied lengths ending at EOS, long prompts; the padding-free
and the shared-prompt layouts; one case with ``num_iterations=2``), a real ``RLOOTrainer`` trains two
generation batches (beta > 0: the reference pass runs, and the KL reward's policy side comes from the old
log-prob pass with ``num_iterations=2``, from the update's one pass otherwise) and, per phase (``sampling``,
``logprobs``, ``advantages``, ``update``: the trainer's timer names ``rollout``, ``logprobs``, ``advantages``,
``update``; a one-pass step completes its batch, advantages included, inside ``update``):

- ``forwards``, ``rows``: the model's forward calls (policy and reference) and the rows they took;
  ``reference_forwards`` of them the reference's; ``decode_steps``: sampling forwards of one token a row;
- ``tokens`` (``input_ids.numel()``, padding included) and ``real_tokens`` (the 2-D attention mask's ones
  over the fed columns; every token where no such mask is passed: packed rows, 4-D decode masks);
- ``flops``: the layout cost model's FLOPs of the layout each pass took
  (:func:`rloo.forward.packing.choose_layout`), the CPU forward overhead pinned at
  :data:`rloo.forward.forward_overhead.CPU_OVERHEAD`;
- ``ops``, ``syncs``: aten ops and host syncs dispatched (:class:`rloo.op_counts.OpCounts`); for sampling,
  per decode step of the phase (scoring included); ``non_view_ops`` leave out views (metadata only: no
  kernel on a GPU);
- ``peak_bytes``: the most tensor bytes alive at once (:class:`memory_measure.LiveTensorBytes`, which counts
  the storages ops return until they are freed; Python's cyclic collector is off while a case runs, so
  what is freed when does not depend on what ran before in the process).

And the decode step alone (``decode/*``): aten ops and host syncs per step of rloo's sampler
(``check_every=8``, as on a GPU) against transformers' ``generate`` (do_sample, the same model, prompts, K
and seed; ``reference/*``: recorded, not guarded), each the difference of two full-length rollouts of 8 and
24 tokens divided by 16. The decode model's EOS never comes (its logit is pushed down by
:func:`varied_lengths.arrange_model`), so both run the full length without ``min_new_tokens``, whose
logits processor would add ops to ``generate``'s step only.

Pinned for determinism: seeds, one thread, ``check_every`` (:data:`CHECK_EVERY` in the trainer's sampler
too, where a CPU would read every step), the CPU forward overhead (recorded in the baseline's settings).
:func:`compare` is the guard's rule: a count more than :data:`TOLERANCE` above its baseline fails, naming
the case and the count; one more than :data:`TOLERANCE` below is a note asking for a new baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import prompts, reward_sevens  # noqa: E402
from memory_measure import LiveTensorBytes  # noqa: E402
from sampler_speed import generate_completions  # noqa: E402
from varied_lengths import arrange_model, hazard_for  # noqa: E402

from rloo.generation.rollout import generate_rollouts  # noqa: E402
from rloo.generation.sampling import SamplingParams  # noqa: E402
from rloo.op_counts import OpCounts  # noqa: E402
from rloo.training.timing import PhaseTimer  # noqa: E402

BASELINE = HERE.parent / "tests" / "perf_baseline.json"
TOLERANCE = 0.05
CHECK_EVERY = 8  # the sampler's finished check, as on a GPU (rloo.generation.decoding.CUDA_CHECK_EVERY)
DECODE_STEPS = (8, 24)  # the two rollout lengths whose difference is the decode step's count
NEVER = 1e-9  # the EOS probability per step of a model whose completions run to the limit
# the trainer's timer -> ours
PHASES = {"rollout": "sampling", "logprobs": "logprobs", "advantages": "advantages", "update": "update"}


@dataclass(frozen=True)
class Case:
    """P prompts x K completions of up to T tokens, two generation batches. ``prompt_chars``: 0 for short
    arithmetic prompts of varied lengths, else few-shot prompts of exactly that many characters (tokens);
    ``ragged``: the short prompts' lengths vary (left padding); ``reach``: the share of completions that
    reach T (EOS at a constant hazard), None: none ends."""

    name: str
    num_prompts: int
    num_generations: int
    max_completion_length: int
    prompt_chars: int = 0
    reach: float | None = None
    ragged: bool = False
    padding_free: bool = True
    num_iterations: int = 1
    beta: float = 0.05
    batches: int = 2

    @property
    def hazard(self) -> float:
        return NEVER if self.reach is None else hazard_for(self.max_completion_length, self.reach)

    def prompts(self, count: int) -> list[dict[str, Any]]:
        """``count`` prompts: the benchmark's (:func:`common.prompts`), or with ``ragged`` sums of 1-3 digit numbers."""
        if not self.ragged:
            return prompts(count, self.prompt_chars)
        return [{"prompt": f"{i * 37 % 997}+{i * 3 % 10}="} for i in range(1, count + 1)]


CASES = (
    Case("fixed", 4, 4, 16),
    Case("varied", 4, 4, 32, ragged=True, reach=0.12, num_iterations=2),
    Case("long-prompt", 2, 4, 8, prompt_chars=48, padding_free=False),
    # prompts of rloo.generation.shared_prefix.MIN_PREFIX_TOKENS or more: the decode's shared-prefix attention
    Case("shared-prefix", 2, 4, 8, prompt_chars=96, padding_free=False),
)


def tiny_model(hazard: float, layers: int = 2) -> tuple[Any, Any]:
    """The tiny Llama (rloo.tiny, seed 0) with EOS at ``hazard`` per step, in eval mode, and its tokenizer."""
    from rloo.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(len(tokenizer), tokenizer=tokenizer, num_layers=layers).eval()
    return arrange_model(model, tokenizer.eos_token_id, len(tokenizer), hazard), tokenizer


@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """One thread, the cyclic collector off (frees happen where references drop), seeds set."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gc.collect()
    gc.disable()
    torch.manual_seed(0)
    try:
        yield
    finally:
        gc.enable()
        torch.set_num_threads(threads)


class Recorder:
    """Per-phase counts of one run: forwards and their rows and tokens, layouts and FLOPs, ops and syncs,
    peak bytes. The phase is the trainer timer's (:meth:`phase_of`); nothing is counted outside a phase."""

    def __init__(self, tracked: list[torch.Tensor]) -> None:
        self.phase: str | None = None
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        self.layouts: dict[str, Counter[str]] = defaultdict(Counter)
        self.ops = OpCounts()
        self.memory = LiveTensorBytes(tracked)

    def forward(self, forward: Any, reference: bool) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.phase is not None:
                with _disable_current_modes():  # the instrument's own ops are not the code's
                    self._count_forward(args[0] if args else kwargs.get("input_ids"), kwargs, reference)
            return forward(*args, **kwargs)

        return counted

    def _count_forward(self, ids: torch.Tensor, kwargs: dict[str, Any], reference: bool) -> None:
        counts = self.counts[self.phase or ""]
        counts["forwards"] += 1
        counts["reference_forwards"] += int(reference)
        counts["rows"] += ids.shape[0]
        counts["tokens"] += ids.numel()
        mask = kwargs.get("attention_mask")
        real = ids.numel() if mask is None or mask.dim() != 2 else int(mask[:, -ids.shape[1] :].sum().item())
        counts["real_tokens"] += real
        if ids.shape[1] == 1 and kwargs.get("use_cache"):
            counts["decode_steps"] += 1

    def choose_layout(self, choose: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            choice = choose(*args, **kwargs)
            if self.phase is not None:
                self.counts[self.phase]["flops"] += round(choice.flops[choice.layout])
                self.layouts[self.phase][choice.layout] += 1
            return choice

        return recorded

    @contextlib.contextmanager
    def phase_of(self, name: str) -> Iterator[None]:
        """Counts what runs inside the trainer's timed phase ``name`` (:data:`PHASES`) as that phase's."""
        phase = PHASES.get(name)
        if phase is None:
            yield
            return
        self.phase, ops, syncs = phase, self.ops.total_ops, self.ops.total_syncs
        self.memory.reset()
        try:
            yield
        finally:
            counts = self.counts[phase]
            counts["ops"] += self.ops.total_ops - ops
            counts["syncs"] += self.ops.total_syncs - syncs
            counts["peak_bytes"] = max(counts["peak_bytes"], self.memory.peak)
            self.phase = None


class CountingTimer(PhaseTimer):
    """The trainer's phase timer, telling a :class:`Recorder` which phase runs."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        with super().__call__(phase), self.recorder.phase_of(phase):
            yield


def train_counts(case: Case) -> tuple[dict[str, float], dict[str, Any]]:
    """``(counts, info)`` of ``case``'s training run: counts by ``phase/count``; info: the layouts taken."""
    import rloo.forward.logprobs as logprobs_module
    import rloo.generation.rollout as rollout_module
    import rloo.training.trainer as trainer_module
    from rloo import RLOOConfig, RLOOTrainer

    model, tokenizer = tiny_model(case.hazard)
    rows = case.prompts(case.num_prompts * case.batches)
    with tempfile.TemporaryDirectory() as out, deterministic():
        args = RLOOConfig(
            output_dir=out,
            num_generations=case.num_generations,
            per_device_train_batch_size=case.num_prompts * case.num_generations,
            max_completion_length=case.max_completion_length,
            max_prompt_length=None,
            num_iterations=case.num_iterations,
            max_steps=case.batches * case.num_iterations,
            beta=case.beta,
            padding_free=case.padding_free,
            learning_rate=1e-3,
            logging_steps=1,
            save_steps=10_000,
            report_to=[],
            seed=0,
        )
        trainer = RLOOTrainer(
            model=model, reward_funcs=reward_sevens, args=args, train_dataset=rows, processing_class=tokenizer
        )
        models = [(trainer.unwrapped_model, False)] + ([(trainer.ref_model, True)] if trainer.ref_model else [])
        recorder = Recorder([t for m, _ in models for t in (*m.parameters(), *m.buffers())])
        for module, reference in models:
            module.forward = recorder.forward(module.forward, reference)
        trainer.timer = CountingTimer(recorder)
        with contextlib.ExitStack() as stack:
            stack.enter_context(patched(rollout_module, "finished_check_every", lambda device: CHECK_EVERY))
            stack.enter_context(patched(trainer_module, "write_report", lambda output_dir, warn: None))
            stack.enter_context(
                patched(logprobs_module, "choose_layout", recorder.choose_layout(logprobs_module.choose_layout))
            )
            stack.enter_context(recorder.memory)
            stack.enter_context(recorder.ops)
            trainer.train()
    counts: dict[str, float] = {}
    for phase in PHASES.values():
        for name, value in sorted(recorder.counts[phase].items()):
            counts[f"{phase}/{name}"] = value
    steps = max(counts.get("sampling/decode_steps", 0), 1)
    counts["sampling/ops_per_decode_step"] = round(counts.pop("sampling/ops") / steps, 3)
    counts["sampling/syncs_per_decode_step"] = round(counts.pop("sampling/syncs") / steps, 3)
    info = {"layouts": {phase: dict(sorted(layouts.items())) for phase, layouts in recorder.layouts.items()}}
    return counts, info


def _rollout_ops(model: Any, tokenizer: Any, texts: list[str], k: int, steps: int, engine: str) -> OpCounts:
    """The ops and syncs of one rollout of ``steps`` tokens, each of which must run them all."""
    with OpCounts() as counts, torch.no_grad():
        if engine == "rloo":
            rollout = generate_rollouts(
                model,
                [tokenizer.encode(text) for text in texts],
                list(range(len(texts))),
                num_generations=k,
                max_new_tokens=steps,
                params=SamplingParams(),
                eos_token_ids=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id,
                sampling_seed=0,
                compact_at=0.25,
                check_every=CHECK_EVERY,
            )
            full = bool(rollout.truncated.all()) and rollout.completion_ids.shape[1] == steps
        else:
            torch.manual_seed(0)
            full = generate_completions(model, tokenizer, texts, k, steps).shape[1] == steps
    if not full:
        raise RuntimeError(f"{engine} ended a completion before {steps} tokens: the decode step is not counted alone")
    return counts


def decode_counts(case: Case, layers: int = 2) -> dict[str, dict[str, Any]]:
    """Aten ops and host syncs per decode step of rloo's sampler and of ``generate`` on ``case``'s prompts,
    K and a model whose completions never end: ``{"rloo": {"ops_per_step", "non_view_ops_per_step",
    "syncs_per_step", "ops"}, ...}`` (``non_view_ops``: about a GPU's kernel launches, views left out;
    ``ops``: the ops of the step by name, what dominates)."""
    model, tokenizer = tiny_model(NEVER, layers)
    texts = [row["prompt"] for row in case.prompts(case.num_prompts)]
    short, long = DECODE_STEPS
    result: dict[str, dict[str, Any]] = {}
    with deterministic():
        for engine in ("rloo", "generate"):
            before = _rollout_ops(model, tokenizer, texts, case.num_generations, short, engine)
            after = _rollout_ops(model, tokenizer, texts, case.num_generations, long, engine)
            ops = Counter(after.ops)
            ops.subtract(before.ops)
            result[engine] = {
                "ops_per_step": round((after.total_ops - before.total_ops) / (long - short), 3),
                "non_view_ops_per_step": round((after.non_view_ops - before.non_view_ops) / (long - short), 3),
                "syncs_per_step": round((after.total_syncs - before.total_syncs) / (long - short), 3),
                "ops": {name: n / (long - short) for name, n in ops.most_common() if n},
            }
    return result


def collect(cases: tuple[Case, ...] = CASES) -> dict[str, Any]:
    """Every case's counts (guarded), generate's decode counts (recorded for comparison) and the layouts."""
    counts: dict[str, dict[str, float]] = {}
    reference: dict[str, dict[str, float]] = {}
    info: dict[str, Any] = {}
    for case in cases:
        counts[case.name], info[case.name] = train_counts(case)
        decode = decode_counts(case)
        counts[case.name] |= {f"decode/{k}": v for k, v in decode["rloo"].items() if k != "ops"}
        reference[case.name] = {f"decode/generate_{k}": v for k, v in decode["generate"].items() if k != "ops"}
        info[case.name]["decode_ops"] = {engine: decode[engine]["ops"] for engine in decode}
    return {"settings": settings(), "counts": counts, "reference": reference, "info": info}


def settings() -> dict[str, Any]:
    """What the counts were taken with: a change here changes counts without a regression."""
    import transformers

    from rloo.forward.forward_overhead import CPU_OVERHEAD

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu_forward_overhead": CPU_OVERHEAD,
        "check_every": CHECK_EVERY,
        "decode_steps": list(DECODE_STEPS),
        "tolerance": TOLERANCE,
    }


def compare(
    baseline: dict[str, dict[str, float]], current: dict[str, dict[str, float]], tolerance: float = TOLERANCE
) -> tuple[list[str], list[str]]:
    """``(rises, falls)``: each ``"case: count: baseline -> now"`` for the counts more than ``tolerance``
    above (a regression) or below (a new baseline is due) their baseline. A case or count missing on
    either side is a rise: the baseline must be rewritten to cover what is collected."""
    rises, falls = [], []
    for case in sorted(baseline.keys() | current.keys()):
        before, now = baseline.get(case, {}), current.get(case, {})
        for name in sorted(before.keys() | now.keys()):
            if name not in before or name not in now:
                rises.append(f"{case}: {name}: {'not in the baseline' if name not in before else 'no longer counted'}")
                continue
            if now[name] > before[name] * (1 + tolerance) + 1e-9:
                rises.append(f"{case}: {name}: {before[name]:g} -> {now[name]:g}")
            elif now[name] < before[name] * (1 - tolerance) - 1e-9:
                falls.append(f"{case}: {name}: {before[name]:g} -> {now[name]:g}")
    return rises, falls


def read_baseline(path: Path = BASELINE) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {BASELINE.relative_to(HERE.parent)}")
    parser.add_argument("--cases", default=",".join(case.name for case in CASES), help="comma-separated")
    parser.add_argument("--decode-layers", type=int, help="only the decode step's counts, at this many layers")
    args = parser.parse_args()
    chosen = tuple(case for case in CASES if case.name in args.cases.split(","))
    if args.decode_layers:
        for case in chosen:
            decode = decode_counts(case, args.decode_layers)
            for engine, counts in decode.items():
                print(f"{case.name} {engine}: " + ", ".join(f"{k} {v:g}" for k, v in counts.items() if k != "ops"))
        return
    collected = collect(chosen)
    for name, counts in collected["counts"].items():
        generate = collected["reference"][name]
        print(f"{name}: " + ", ".join(f"{key} {value:g}" for key, value in counts.items()))
        print(f"{name}: generate " + ", ".join(f"{key} {value:g}" for key, value in generate.items()))
        print(f"{name}: layouts {collected['info'][name]['layouts']}")
    if args.write:
        if len(chosen) != len(CASES):
            raise SystemExit("--write rewrites every case: run it without --cases")
        BASELINE.write_text(json.dumps(collected, indent=1, sort_keys=False) + "\n")
        print(f"wrote {BASELINE}")
        return
    if BASELINE.exists():
        rises, falls = compare(read_baseline()["counts"], collected["counts"])
        rises = [r for r in rises if r.split(":")[0] in {c.name for c in chosen}]
        print("\n".join(["rose:", *rises] if rises else ["no count rose more than 5%"]))
        if falls:
            print("\n".join(["fell (rewrite the baseline: make perf-baseline):", *falls]))


if __name__ == "__main__":
    main()
