"""The live gradient-variance diagnostic (``log_grad_variance``): per-completion gradients, sketched.

At a diagnosed generation batch, each completion's score-function gradient
``g_i = grad_theta sum_t log pi(y_it)`` (over its loss tokens, trainable parameters only) is
taken by its own forward and backward (one row at a time, so memory stays one row's) and
reduced at once to ``SKETCH_DIM`` numbers by a fixed count sketch ``S`` (:func:`count_sketch`):
no full per-completion gradient is ever kept. Every estimator's group estimate is then a
combination ``1/K sum_i A_i S g_i`` of the same vectors (:mod:`rloo.algo.variance`), so the
advantages actually used and the alternatives (no baseline, group mean, leave-one-out, GRPO)
cost one set of backward passes. ``E_S[<Sx, Sy>] = <x, y>``, so the variances are unbiased in
the sketch's randomness; with ``SKETCH_DIM = 1024`` a sketched squared norm errs by at most about
``sqrt(2 / 1024)`` = 4.4%, and the variances of the tiny test model's gradients by about 1%.

Cost of a diagnosed batch: one extra forward and backward per completion with a loss token
(about one more optimizer step's compute, row by row, without batching), plus a pass over the
trainable parameters per completion (the sketch). Memory: one row's activations and one
gradient. Between diagnosed batches: nothing. The training run is unchanged, bit for bit:
gradients go through ``torch.autograd.grad`` (``.grad`` is never touched), the model runs in
eval mode (no dropout draw) and the random generators are restored afterwards.

Data parallel: each process sketches its own completions (whole groups) and the group estimates
are gathered, so the metrics are over every process's groups and equal on every process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn

from rloo.algo.variance import USED, alternative_advantages, group_estimates, variance_metrics
from rloo.config import RLOOConfig
from rloo.config.errors import fail
from rloo.forward.lm_head import Autocast
from rloo.forward.logprobs import completion_logprobs
from rloo.training.parallel.distributed import Ranks
from rloo.training.passes import TrainBatch, take_rows

SKETCH_DIM = 1024
SKETCH_SEED = 20_240_214
SKETCH_CHUNK = 2**22  # elements of a parameter drawn for at once (~64 MiB of temporaries)


def count_sketch(
    grads: Sequence[Tensor | None], dim: int = SKETCH_DIM, seed: int = SKETCH_SEED, out: Tensor | None = None
) -> Tensor:
    """``S x`` for the gradient ``x`` given as one tensor per parameter (None: zero): ``(dim,)`` float32.

    ``(S x)_k = sum_{j : h(j) = k} s_j x_j`` with the bucket ``h(j)`` uniform in ``[0, dim)`` and the
    sign ``s_j`` uniform in ``{-1, +1}``, drawn for parameter p from a generator seeded with
    ``seed + p``: the same ``S`` at every call (and on every process of a device type), so
    ``E_S[<S x, S y>] = <x, y>``. Draws are regenerated per call, a chunk at a time: no memory the
    size of the model.
    """
    device = next((g.device for g in grads if g is not None), torch.device("cpu"))
    total = torch.zeros(dim, dtype=torch.float32, device=device) if out is None else out
    for index, grad in enumerate(grads):
        if grad is None:
            continue
        generator = torch.Generator(device=grad.device).manual_seed(seed + index)
        flat = grad.reshape(-1)
        for start in range(0, flat.numel(), SKETCH_CHUNK):  # chunks: the draws' memory stays small
            values = flat[start : start + SKETCH_CHUNK]
            codes = torch.randint(0, 2 * dim, (values.numel(),), generator=generator, device=grad.device)
            signs = 1.0 - 2.0 * (codes >= dim).to(torch.float32)
            total.index_add_(0, codes % dim, values.float() * signs)
    return total


@contextlib.contextmanager
def _unchanged_training(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout draws) and the random generators restored: the run goes on as if
    nothing had happened."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        model.eval()
        try:
            yield
        finally:
            model.train(was_training)


def completion_sketches(
    model: nn.Module,
    batch: TrainBatch,
    temperature: float,
    autocast: Autocast = contextlib.nullcontext,
) -> Tensor:
    """``S g_i`` for every completion of ``batch``: ``(N, SKETCH_DIM)`` float32 on the batch's device
    (zero for a completion without loss tokens)."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = torch.zeros(batch.num_rows, SKETCH_DIM, device=batch.advantages.device)
    with _unchanged_training(model):
        for i in range(batch.num_rows):
            if not bool(batch.loss_mask[i].any()):
                continue
            rows = take_rows(batch, torch.tensor([i], device=batch.advantages.device))
            with autocast():
                logprobs = completion_logprobs(
                    model, rows.prompt_ids, rows.prompt_mask, rows.completion_ids, rows.completion_mask, temperature
                ).logprobs
            total = (logprobs.float() * rows.loss_mask).sum()
            grads = torch.autograd.grad(total, params, allow_unused=True)
            count_sketch(grads, out=out[i])
    return out


class GradVarianceProbe:
    """Measures ``grad_var/*`` on every generation batch that feeds an optimizer step numbered a
    multiple of ``every`` (steps counted from 1)."""

    def __init__(self, every: int, steps_per_batch: int, temperature: float, ranks: Ranks) -> None:
        self.every, self.steps_per_batch, self.temperature, self.ranks = every, steps_per_batch, temperature, ranks

    @classmethod
    def for_run(cls, args: RLOOConfig, ranks: Ranks) -> GradVarianceProbe | None:
        """The probe of a run; None when ``log_grad_variance`` is 0."""
        if not args.log_grad_variance:
            return None
        if args.prompts_per_generation * ranks.world_size < 2:
            raise fail(
                "log_grad_variance",
                args.log_grad_variance,
                "the gradient variance is measured across the prompts of a generation batch and this run has 1; "
                "give it 2 or more (raise per_device_train_batch_size or steps_per_generation to 2 x "
                "num_generations), or set log_grad_variance=0",
            )
        return cls(args.log_grad_variance, args.optimizer_steps_per_generation, args.temperature, ranks)

    def due(self, global_step: int) -> bool:
        """Whether the batch feeding steps ``global_step + 1 .. global_step + steps_per_batch`` is diagnosed."""
        return (global_step + self.steps_per_batch) // self.every > global_step // self.every

    def measure(
        self, model: nn.Module, batch: TrainBatch, rewards: Tensor, scorable: Tensor, autocast: Autocast
    ) -> dict[str, float]:
        """``grad_var/*`` over every process's groups, and ``timing/grad_variance`` (seconds); ``rewards``:
        what the baseline saw (after clipping and KL); ``autocast``: the run's mixed-precision context."""
        start = time.perf_counter()
        sketches = completion_sketches(model, batch, self.temperature, autocast)
        group_ids = batch.rollout.group_ids
        advantages = {USED: batch.advantages, **alternative_advantages(rewards, group_ids, scorable)}
        local = {name: group_estimates(sketches, a, group_ids).cpu() for name, a in advantages.items()}
        parts = self.ranks.gather_objects(local)
        metrics = variance_metrics({name: torch.cat([part[name] for part in parts]) for name in local})
        metrics["timing/grad_variance"] = time.perf_counter() - start  # its cost, seen on the run itself
        return metrics
