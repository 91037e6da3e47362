"""Sharing a trained model: a model card and ``push_to_hub`` through ``huggingface_hub``.

``trainer.push_to_hub()`` (or ``push_to_hub=True``, at the end of training) writes a model card
(``README.md``: base model, dataset, the RLOO settings, the last metrics, how to cite RLOO) next
to the saved weights and uploads the folder with ``HfApi.create_repo`` / ``upload_folder``: the
library's own client, so ``HF_ENDPOINT``, ``HF_TOKEN`` and its retries apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rloo.report import metric_names as names

RLOO_CITATION = """@inproceedings{ahmadian2024back,
  title     = {{Back to Basics: Revisiting REINFORCE-Style Optimization for Learning from Human Feedback in LLMs}},
  author    = {Arash Ahmadian and Chris Cremer and Matthias Gall{\\'e} and Marzieh Fadaee and Julia Kreutzer
               and Olivier Pietquin and Ahmet {\\"U}st{\\"u}n and Sara Hooker},
  booktitle = {ACL},
  year      = {2024}
}"""

# the settings a reader of the card needs to reproduce the run's objective
_CARD_SETTINGS = (
    "num_generations",
    "beta",
    "learning_rate",
    "max_completion_length",
    "advantage_estimator",
    "loss_aggregation",
    "num_iterations",
    "max_steps",
)


def model_card(
    repo_id: str, base_model: str | None, dataset_name: str | None, args: Any, metrics: dict[str, float]
) -> str:
    """The ``README.md`` of a trained model (Hugging Face model-card front matter, then the text)."""
    front = ["---", "library_name: transformers", "tags: [rloo, reinforcement-learning]"]
    if base_model:
        front.append(f"base_model: {base_model}")
    if dataset_name:
        front.append(f"datasets: [{dataset_name}]")
    front.append("---")
    settings = "\n".join(f"| `{name}` | `{getattr(args, name)}` |" for name in _CARD_SETTINGS)
    card_metrics = (names.REWARD, names.REWARD_STD, names.KL, names.TRAIN_LOSS, names.EVAL_REWARD)
    shown = {k: v for k, v in metrics.items() if k in card_metrics}
    results = "\n".join(f"| `{k}` | {v:.4g} |" for k, v in shown.items()) or "| (none logged) | |"
    return "\n".join(
        [
            *front,
            f"\n# {repo_id.split('/')[-1]}\n",
            f"Fine-tuned{f' from `{base_model}`' if base_model else ''} with RLOO (REINFORCE Leave-One-Out)"
            f"{f' on `{dataset_name}`' if dataset_name else ''}, using [rloo](https://pypi.org/project/rloo/).",
            "\n## Training settings\n\n| setting | value |\n|---|---|",
            settings,
            "\n## Last logged metrics\n\n| metric | value |\n|---|---|",
            results,
            "\n## Citation\n\n```bibtex",
            RLOO_CITATION,
            "```\n",
        ]
    )


def push_folder(
    folder: Path, repo_id: str, *, token: str | None, private: bool | None, commit_message: str, api: Any = None
) -> str:
    """Create ``repo_id`` if needed and upload ``folder``; returns the commit URL."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, token=token)
    info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=commit_message, token=token)
    return str(getattr(info, "commit_url", info))


def hub_repo_id(args: Any) -> str:
    """The hub repo a run pushes to: ``hub_model_id``, else the run folder's name (the hub puts a
    bare name under the token's user)."""
    return args.hub_model_id or Path(args.output_dir).name


def push_run(
    folder: Path, model: Any, args: Any, log_history: list[dict[str, float]], dataset_name: str | None, message: str
) -> str:
    """Write the model card into the saved ``folder`` and push it to ``args.hub_model_id`` (or the
    run folder's name); the card shows the last value of each logged metric."""
    repo_id = hub_repo_id(args)
    metrics = {key: value for row in log_history for key, value in row.items()}
    base = getattr(getattr(model, "config", None), "name_or_path", None) or None
    (folder / "README.md").write_text(model_card(repo_id, base, dataset_name, args, metrics))
    return push_folder(folder, repo_id, token=None, private=args.hub_private_repo, commit_message=message)
