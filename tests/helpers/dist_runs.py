"""Training runs through the Python API, launched by ``tests/training/parallel/test_distributed.py`` under
``torchrun`` (N processes) or plain ``python`` (one process): the same global batch either way.

``python tests/helpers/dist_runs.py OUT`` trains one short run per loss aggregation mode, with
advantage normalization off and on (and one ``reinforce_pp`` run, whose baseline is the batch
mean), each on 8 completions per step over all processes, and has the main process write each
run's final parameters (``OUT/<case>.safetensors``) and logged metrics (``OUT/<case>.json``; two cases
measure ``log_grad_variance``, whose ``grad_var/*`` metrics must agree too). The evaluating case has a
``compute_metrics`` hook whose calls each process appends to ``OUT/compute_metrics_calls.txt`` (its rank
and the completions it got).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from peft import LoraConfig
from safetensors.torch import save_file

from rloo import RLOOTrainer
from rloo.algo.losses import AGGREGATION_MODES
from tests.helpers.models import (
    answer_metrics,
    dataset,
    frac7,
    frac7_when_odd,
    make_model,
    make_tokenizer,
    world_config,
)

COMPLETIONS_PER_STEP = 8

CASES = [(mode, normalize, "rloo") for mode in AGGREGATION_MODES for normalize in (False, True)]
CASES.append(("token_mean", False, "reinforce_pp"))
# LoRA (the reference is the base model, adapters disabled) and an evaluation every step,
# sharded over the processes (5 eval prompts: an uneven split), with a compute_metrics hook
CASES.append(("token_mean", False, "lora+eval"))
# each batch sampled by the weights of the step before (max_staleness 1), corrected, by a rollout worker per
# trainer process (data-parallel trainers, each with its worker): the same on 1 and 2 processes
CASES.append(("token_mean", False, "stale"))
# dynamic sampling, a reward without a signal for half the prompts: the same rounds, groups and rows per process
# as one process (a group sampled by one process and trained by the other is sent there)
CASES.append(("token_mean", False, "dynamic"))


def case_name(mode: str, normalize: bool, estimator: str) -> str:
    return f"{estimator}-{mode}-{'norm' if normalize else 'raw'}"


def recording_hook(out: Path) -> Any:
    """:func:`answer_metrics`, each call recorded in ``out/compute_metrics_calls.txt`` as "RANK N"."""

    def answer_metrics_recorded(eval_pred: Any) -> dict[str, float]:
        with (out / "compute_metrics_calls.txt").open("a") as calls:
            calls.write(f"{os.environ.get('RANK', '0')} {len(eval_pred.completions)}\n")
        return answer_metrics(eval_pred)

    return answer_metrics_recorded


def main(out: Path) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for mode, normalize, estimator in CASES:
        name = case_name(mode, normalize, estimator)
        tok = make_tokenizer()
        lora_eval, stale, dynamic = estimator == "lora+eval", estimator == "stale", estimator == "dynamic"
        args = world_config(
            out / f"world{world}" / name,
            world,
            COMPLETIONS_PER_STEP,
            loss_aggregation=mode,
            normalize_advantages=normalize,
            advantage_estimator="rloo" if lora_eval or stale or dynamic else estimator,
            max_staleness=1 if stale else 0,
            rollout_workers=1 if stale else 0,
            dynamic_sampling=dynamic,
            eval_steps=1 if lora_eval else None,
            # the gradient-variance diagnostic, global over processes: with a batch-level baseline and LoRA
            log_grad_variance=1 if estimator in ("reinforce_pp", "lora+eval") else 0,
        )
        extra = {
            "peft_config": LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
            "eval_dataset": dataset(45)[40:],
            "compute_metrics": recording_hook(out),
        }
        reward = frac7_when_odd if dynamic else frac7
        trainer = RLOOTrainer(
            make_model(tok), reward, args, train_dataset=dataset(), processing_class=tok, **(extra if lora_eval else {})
        )
        trainer.train()
        if trainer.ranks.is_main:
            params = {k: v.detach().contiguous() for k, v in trainer.unwrapped_model.named_parameters()}
            save_file(params, str(out / f"{name}.safetensors"))
            (out / f"{name}.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    from rloo.training.parallel.distributed import exit_process

    main(Path(sys.argv[1]))
    exit_process(0)  # as rloo train ends: gloo's teardown at interpreter finalization can abort
