"""Training runs through the Python API under FSDP2, launched by ``tests/training/parallel/test_fsdp.py``: with
``torchrun`` on 2 processes and the variables ``accelerate launch --config_file
examples/accelerate/fsdp2_cpu.yaml`` sets (``ACCELERATE_USE_FSDP``, ``FSDP_VERSION=2``), the
policy is sharded; with plain ``python`` (one process) the same runs train unsharded.

``python tests/helpers/fsdp_runs.py OUT [CASE ...]`` trains each case of :data:`CASES` (or those named)
on the same global batch (8 completions per step over all processes), and has the main process write its
final parameters (``OUT/<case>.safetensors``, the full ones, read back from the saved final model) and
logged metrics (``OUT/<case>.json``). Each case's ``final/`` folder is the trainer's own save. With
``FSDP_OFFLOAD_PARAMS=true`` too (``fsdp_offload_params``), the shards live in CPU memory, and one
process is sharded as well (over a mesh of one).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from safetensors.torch import save_file

from rloo import RLOOTrainer
from rloo.training.parallel.fsdp import is_sharded
from tests.helpers.models import dataset, frac7, make_model, make_tokenizer, world_config

COMPLETIONS_PER_STEP = 8

# name -> settings: the full model with a separate reference (sharded too) and old log-probs from
# extra passes (2 optimizer steps per generation, each on the whole batch), one row a pass (the
# processes have different numbers of rows to train on: filler passes); LoRA, whose reference
# is the sharded policy with its adapters disabled, with an evaluation every step (5 eval prompts:
# one process gets a filler batch), the best model kept and gradient checkpointing
CASES: dict[str, dict[str, Any]] = {
    "full": {"num_iterations": 2, "max_logits_memory_mb": 1e-6},  # one row a pass: uneven pass counts
    "lora": {
        "eval_steps": 1,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_reward",
        "gradient_checkpointing": True,
    },
}


def frac7_even_sums(completion_ids: list[list[int]], answer: list[str], **kwargs: Any) -> list[float]:
    """``frac7`` for prompts whose sum is even, 0 for the others: their groups' advantages are 0,
    their rows are skipped, and the processes have different numbers of rows to train on."""
    return [r if int(a) % 2 == 0 else 0.0 for r, a in zip(frac7(completion_ids), answer, strict=True)]


def offloads(model: torch.nn.Module) -> bool:
    """Whether every sharded unit of ``model`` keeps its shards in CPU memory (torch's private FSDP2 state:
    the policy each parameter group was sharded with)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    groups = [g for m in model.modules() if isinstance(m, FSDPModule) for g in m._get_fsdp_state()._fsdp_param_groups]
    return bool(groups) and all(isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups)


def main(out: Path, names: list[str]) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    offload = os.environ.get("FSDP_OFFLOAD_PARAMS") == "true"
    for name in names or list(CASES):
        settings = CASES[name]
        tok = make_tokenizer()
        lora = name == "lora"
        args = world_config(
            out / f"world{world}" / name,
            world,
            COMPLETIONS_PER_STEP,
            max_grad_norm=0.05,  # small: clipping acts, so the global norm of the sharded gradient matters
            # six digits end a completion: often every completion of one process ends before the
            # other's do, and it keeps decoding (lockstep generation)
            generation_kwargs={"eos_token_id": tok.convert_tokens_to_ids(list("012345"))},
            **settings,
        )
        extra = {"peft_config": LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), "eval_dataset": dataset(45)[40:]}
        model, data = make_model(tok), dataset()
        trainer = RLOOTrainer(model, frac7_even_sums, args, data, processing_class=tok, **(extra if lora else {}))
        if world > 1 or offload:  # the policy and a separate reference are sharded
            assert all(is_sharded(m) for m in (trainer.model, trainer.ref_model) if m is not None)
            assert offloads(trainer.model) == offload
        trainer.train()
        if trainer.ranks.is_main:
            from safetensors.torch import load_file

            final = Path(args.output_dir) / "final"
            saved = load_file(str(final / ("adapter_model.safetensors" if lora else "model.safetensors")))
            save_file({k: v.contiguous() for k, v in saved.items()}, str(out / f"{name}.safetensors"))
            (out / f"{name}.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    from rloo.training.parallel.distributed import exit_process

    main(Path(sys.argv[1]), sys.argv[2:])
    exit_process(0)  # as rloo train ends: gloo's teardown at interpreter finalization can abort
