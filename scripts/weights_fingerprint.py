"""Fingerprints of the final weights of short runs, to show a restructuring changes no behaviour.

``python scripts/weights_fingerprint.py [--out FILE]`` trains the tiny offline model a few steps in several
configurations (default; KL with several iterations; KL in the loss with gradient accumulation; rollout
workers with staleness; tools with LoRA) and prints one SHA-256 of the final trainable weights per
configuration as JSON. Run it before and after a change that should not alter training and compare the two
outputs: every hash must match. About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def digest(model: Any) -> str:
    """SHA-256 over every trainable parameter's name and bytes, in name order."""
    sha = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        if param.requires_grad:
            sha.update(name.encode())
            sha.update(param.detach().contiguous().float().numpy().tobytes())
    return sha.hexdigest()


def text_run(folder: Path, **overrides: Any) -> str:
    from tests.helpers.models import trainer

    run = trainer(folder, max_steps=3, report_to=[], **overrides)
    run.train()
    return digest(run.unwrapped_model)


def tools_run(folder: Path) -> str:
    from peft import LoraConfig

    from rloo import RLOOConfig, RLOOTrainer
    from tests.helpers.tool_runs import product
    from tests.helpers.tools import multiply, question, taught_model, tool_tokenizer

    rows = [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5)] * 4]
    args = RLOOConfig(
        output_dir=str(folder / "run"),
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=120,
        max_tool_calling_iterations=2,
        temperature=1.1,
        learning_rate=3e-3,
        max_steps=2,
        logging_steps=1,
        sampler_compaction=None,
        report_to=[],
        seed=0,
    )
    run = RLOOTrainer(
        taught_model(),
        product,
        args=args,
        train_dataset=rows,
        processing_class=tool_tokenizer(),
        tools=[multiply],
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    run.train()
    return digest(run.unwrapped_model)


RUNS: dict[str, Callable[[Path], str]] = {
    "default": lambda folder: text_run(folder),
    "kl_reward_iterations": lambda folder: text_run(folder, beta=0.05, num_iterations=2),
    "kl_loss_accumulation": lambda folder: text_run(
        folder, beta=0.05, kl_placement="loss", kl_estimator="k3", gradient_accumulation_steps=2
    ),
    "workers_staleness": lambda folder: text_run(folder, rollout_workers=1, max_staleness=1),
    "tools_lora": tools_run,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="run only these configurations")
    args = parser.parse_args()
    hashes = {}
    for name in args.only or RUNS:
        with tempfile.TemporaryDirectory() as folder:
            hashes[name] = RUNS[name](Path(folder))
        print(f"{name}: {hashes[name]}", file=sys.stderr, flush=True)
    text = json.dumps(hashes, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
