"""``rloo eval``: each reward function's score of a model, greedy and sampled (pass@K).

Completions are generated and scored by :func:`rloo.pipeline.generate_and_score`, the same
pipeline training uses, with the same reward weights: a run file given with ``--run-file``
reports the rewards ``rloo train`` logged for it.

Each reward function is reported on its own (its mean; for a reward that is 0 or 1 on every
completion, the share of 1s and pass@K), beside the combined (weighted) reward and the share of
completions whose combined reward reaches ``--success-threshold``. That share is called what it
is, never "accuracy": with a format reward beside an accuracy reward, a model that never answers
right can pass the threshold on format alone. A ``compute_metrics`` hook (``--compute-metrics``, or
the run file's) adds task metrics of each decoding's completions, as training's evaluation logs them.

The terminal gets a table; every number goes to a JSON file (``--output``, else :func:`default_output`:
beside the run), whose path is said; ``--json`` prints that JSON instead of the table, for a pipe.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rloo.algo.stats import pass_at_k
from rloo.data.loading import DatasetSource, holds_one_split
from rloo.generation.sampling import SamplingParams
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.calling import RewardFunctions
from rloo.tools.agent import AgentSettings, resolve_tools


@dataclass(frozen=True)
class EvalSettings:
    """K samples per prompt (``num_generations``), their length limit and temperature; the share of
    completions whose combined reward is at least ``success_threshold`` is reported."""

    num_generations: int = 4
    max_completion_length: int = 256
    temperature: float = 1.0
    success_threshold: float = 1.0
    batch_size: int = 64
    seed: int = 0
    max_prompt_length: int | None = None
    agent: Any = None  # the run file's tools: multi-turn episodes (rloo.tools.agent.AgentSettings), or None

    def __post_init__(self) -> None:
        checks = [
            ("--num-generations", self.num_generations, self.num_generations >= 1, ">= 1"),
            ("--max-completion-length", self.max_completion_length, self.max_completion_length >= 1, ">= 1"),
            ("--batch-size", self.batch_size, self.batch_size >= 1, ">= 1 (prompts generated at once)"),
            ("--success-threshold", self.success_threshold, math.isfinite(self.success_threshold), "a finite number"),
            (
                "--temperature",
                self.temperature,
                math.isfinite(self.temperature) and self.temperature >= 0,
                "finite and >= 0 (0 is greedy)",
            ),
        ]
        for option, value, ok, rule in checks:
            if not ok:
                raise ValueError(f"{option}={value} is invalid: it must be {rule}")


@dataclass(frozen=True)
class EvalInputs:
    """What ``rloo eval`` scores: the prompts and where they come from, the rewards, the settings.
    ``on_training_data``: the run file has no ``eval_dataset`` and its training prompts are used."""

    data: Any
    source: DatasetSource
    rewards: RewardFunctions
    settings: EvalSettings
    on_training_data: bool = False
    compute_metrics: Any = None  # the hook (rloo.training.monitoring.compute_metrics), or None


def eval_inputs(
    run_file: str | Path | None,
    *,
    dataset: str | None,
    split: str | None,
    columns: dict[str, str] | None,
    limit: int | None,
    rewards: list[str] | None,
    weights: list[float] | None,
    num_generations: int | None,
    max_completion_length: int | None,
    temperature: float | None,
    success_threshold: float,
    batch_size: int,
    seed: int,
    name: str | None = None,
    as_chat: bool | None = None,
    system_prompt: str | None = None,
    compute_metrics: str | None = None,
) -> EvalInputs:
    """The inputs of ``rloo eval``: a command-line value wins, then the run file's (its eval_dataset,
    else its dataset; its rewards with their weights; its lengths and temperature), then the
    defaults. ``split``, ``columns``, ``limit``, ``name``, ``as_chat`` and ``system_prompt``, given,
    override the run file's dataset settings; ``compute_metrics`` (an import string) the run file's hook."""
    from rloo.cli.run_file import load_run_file
    from rloo.rewards.resolve import resolve_rewards
    from rloo.training.monitoring.compute_metrics import resolve_compute_metrics

    if limit is not None and limit < 1:
        raise ValueError(f"--limit={limit} is invalid: it must be >= 1 (prompts evaluated)")
    run = load_run_file(run_file) if run_file is not None else None
    given: dict[str, Any] = {"split": split, "columns": columns, "limit": limit, "name": name}
    given |= {"as_chat": as_chat, "system_prompt": system_prompt}
    changes = {key: value for key, value in given.items() if value is not None}
    if dataset is not None:
        # a file (or saved Dataset) holds one split; elsewhere the default is the test split, never train
        default = {"split": "train" if holds_one_split(dataset) else "test"}
        source, on_training_data = DatasetSource(path=dataset, **{**default, **changes}), False
    elif run is not None:
        source = dataclasses.replace(run.eval_dataset or run.dataset, **changes)
        on_training_data = run.eval_dataset is None and (source.path, source.name, source.split) == (
            run.dataset.path,
            run.dataset.name,
            run.dataset.split,
        )
    else:
        raise ValueError("give --dataset, or --run-file with a dataset")
    if rewards is None and run is None:
        raise ValueError("give --reward (once per reward function), or --run-file")
    specs = rewards if rewards is not None else run.reward_funcs  # type: ignore[union-attr]
    if weights is None and rewards is None and run is not None:
        weights = list(run.config.reward_weights) if run.config.reward_weights is not None else None
    if weights is not None and len(weights) != len(specs):
        raise ValueError(f"got {len(weights)} --reward-weight values for {len(specs)} rewards; give one per reward")
    config = run.config if run is not None else None
    settings = EvalSettings(
        num_generations=_first(num_generations, config and config.num_generations, EvalSettings.num_generations),
        max_completion_length=_first(
            max_completion_length, config and config.max_completion_length, EvalSettings.max_completion_length
        ),
        temperature=_first(temperature, config and config.temperature, EvalSettings.temperature),
        success_threshold=success_threshold,
        batch_size=batch_size,
        seed=seed,
        max_prompt_length=config.max_prompt_length if config else None,
    )
    agent = None if run is None else AgentSettings.from_config(run.config, resolve_tools(run.tools))
    if agent is not None:  # episodes within this evaluation's completion length
        limits = dataclasses.replace(agent.limits, max_tokens=settings.max_completion_length)
        settings = dataclasses.replace(settings, agent=dataclasses.replace(agent, limits=limits))
    scorers = RewardFunctions(resolve_rewards(specs), weights)
    hook = resolve_compute_metrics(compute_metrics or (run.compute_metrics if run is not None else None))
    return EvalInputs(source.load("--column"), source, scorers, settings, on_training_data, hook)


def default_output(model: str, run_file: str | Path | None) -> Path:
    """Where ``rloo eval`` writes its JSON without ``--output``: in the run folder of the model evaluated (a
    run's ``final/`` or ``checkpoint-N/``: the folder above, holding its config.yaml), else the run file's
    folder, else ``runs/eval``; named ``eval-<model folder or hub id>.json``, ``-2``, ``-3``... when taken
    (an earlier evaluation is never overwritten)."""
    folder = Path(model)
    if folder.is_dir() and (folder.resolve().parent / "config.yaml").is_file():
        where = folder.parent
    else:
        where = Path(run_file).parent if run_file is not None else Path("runs/eval")
    label = folder.resolve().name if folder.is_dir() else model.replace("/", "--")
    candidate, n = where / f"eval-{label}.json", 1
    while candidate.exists():
        n += 1
        candidate = where / f"eval-{label}-{n}.json"
    return candidate


def write_results(result: dict[str, Any], path: Path) -> None:
    """The results as JSON at ``path`` (its folder created), or a ``ValueError`` naming ``--output``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
    except OSError as error:
        raise ValueError(
            f"--output {str(path)!r} could not be written ({type(error).__name__}: {error}); give --output a "
            "writable file path"
        ) from error


def _first(*values: Any) -> Any:
    """The first value that is not None (0 and 0.0 count: ``--temperature 0`` is greedy)."""
    return next(value for value in values if value is not None)


def describe_source(source: DatasetSource) -> str:
    """``path (name), split S``; a file or a saved Dataset holds one split, so no split is named."""
    name = f" ({source.name})" if source.name else ""
    return f"{source.path}{name}" if holds_one_split(source.path) else f"{source.path}{name}, split {source.split}"


def evaluate_model(
    model: str, data: Any, rewards: RewardFunctions, settings: EvalSettings, compute_metrics: Any = None
) -> dict[str, Any]:
    """Load a model (folder, checkpoint or hub id) and score its completions on ``data``.

    The combined reward is the weighted sum over the reward functions that apply (NaN where
    none does), as in training. ``greedy`` and ``sampled`` hold :func:`summarize`'s numbers;
    ``sampled`` adds pass@K: the share of prompts with at least one success among K samples.
    With a ``compute_metrics`` hook, each also holds its metrics of that decoding's completions
    (``compute_metrics``, keys as the hook returned them).
    """
    from rloo.data.prompts import gather_columns
    from rloo.training.monitoring.compute_metrics import EvalRecords
    from rloo.training.setup.models import load_policy, load_processing_class

    policy: Any = load_policy(model, None)
    policy.to("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_processing_class(model, None, policy, [data])  # a processor for prompts with images
    rewards.to(policy.device)
    generator = torch.Generator(device=policy.device).manual_seed(settings.seed)
    k, length, prompt_length = settings.num_generations, settings.max_completion_length, settings.max_prompt_length
    decodings = {
        "greedy": RolloutSettings(1, length, SamplingParams(top_k=1), prompt_length, agent=settings.agent),
        "sampled": RolloutSettings(
            k, length, SamplingParams(settings.temperature), prompt_length, agent=settings.agent
        ),
    }
    combined: dict[str, list[torch.Tensor]] = {name: [] for name in decodings}
    scores: dict[str, list[torch.Tensor]] = {name: [] for name in decodings}
    records: dict[str, list[Any]] = {name: [] for name in decodings}  # compute_metrics' inputs
    with torch.no_grad():
        for start in range(0, len(data), settings.batch_size):
            indices = list(range(start, min(start + settings.batch_size, len(data))))
            prompts, columns = [data[i]["prompt"] for i in indices], gather_columns(data, indices)
            for name, rollout_settings in decodings.items():
                scored = generate_and_score(
                    policy, tokenizer, prompts, columns, rewards, rollout_settings, generator=generator
                )
                combined[name].append(scored.rewards.rewards_or_nan().cpu())
                scores[name].append(scored.rewards.scores.values.cpu())
                if compute_metrics is not None:
                    records[name].append(EvalRecords.from_scored(scored, columns))
    grouped = {
        name: (torch.cat(combined[name]).view(-1, size), torch.cat(scores[name]).view(-1, size, len(rewards.names)))
        for name, size in (("greedy", 1), ("sampled", k))
    }
    binary = _binary_rewards(torch.cat([values.flatten(0, 1) for _, values in grouped.values()]))
    summaries = {
        name: summarize(total, values, rewards.names, binary, settings.success_threshold)
        for name, (total, values) in grouped.items()
    }
    if compute_metrics is not None:
        for name, (total, values) in grouped.items():
            hook_inputs = (records[name], total, values, rewards.names, name)
            summaries[name]["compute_metrics"] = task_metrics(compute_metrics, *hook_inputs)
    return {
        "model": model,
        "num_prompts": len(data),
        "num_generations": settings.num_generations,
        "temperature": settings.temperature,
        "success_threshold": settings.success_threshold,
        "reward_functions": rewards.names,
        "reward_weights": rewards.weights.tolist(),
        **summaries,
    }


def task_metrics(
    hook: Any, records: list[Any], combined: torch.Tensor, scores: torch.Tensor, names: list[str], decoding: str
) -> dict[str, float]:
    """``hook``'s metrics (checked, keys as returned) of one decoding's completions: ``records``, one per
    batch (:class:`rloo.training.monitoring.compute_metrics.EvalRecords`); ``combined``: ``(P, K)``,
    ``scores``: ``(P, K, F)`` rewards of the F functions ``names``, as :func:`summarize` takes them. The
    hook's ``metric_key_prefix`` is the decoding (``greedy`` or ``sampled``)."""
    from rloo.training.monitoring.compute_metrics import EvalCompletions, call_compute_metrics

    values = torch.cat([combined.reshape(-1, 1), scores.flatten(0, 1)], dim=1)
    completions = EvalCompletions.from_values(records, values, names, combined.shape[1], decoding)
    return call_compute_metrics(hook, completions, None)


def _binary_rewards(values: torch.Tensor) -> list[bool]:
    """``values: (N, F)``, NaN where a function does not apply: whether each function gave only
    0s and 1s (and gave something), so that its share of 1s is worth reporting."""
    applies = ~values.isnan()
    zero_or_one = (values == 0) | (values == 1) | ~applies
    return [bool(applies[:, f].any() and zero_or_one[:, f].all()) for f in range(values.shape[1])]


def summarize(
    combined: torch.Tensor, scores: torch.Tensor, names: list[str], binary: list[bool], threshold: float
) -> dict[str, Any]:
    """The numbers of P prompts x K completions.

    Args:
        combined: ``(P, K)`` combined rewards, NaN where no function applies (never a success).
        scores: ``(P, K, F)`` each function's rewards, NaN where it does not apply.
        binary: per function, whether it is 0/1-valued (:func:`_binary_rewards`).

    Returns ``combined_mean``, ``combined_at_least_threshold`` (share of completions), per function
    ``rewards[name]``: ``mean`` and ``scorable`` (over the completions it applies to / the share it
    applies to), for a binary one ``fraction_of_ones`` (of all completions); with K > 1,
    ``pass_at_k``: per prompt, any of K completions a success / a 1, for the combined reward and
    each binary function; ``pass_at``: the unbiased pass@j for j = 1..K (:func:`rloo.algo.stats.pass_at_k`),
    the same columns.
    """
    success = combined >= threshold  # NaN compares False
    summary: dict[str, Any] = {
        "combined_mean": _nanmean(combined),
        "combined_at_least_threshold": _share(success),
        "rewards": {},
    }
    for f, name in enumerate(names):
        values = scores[..., f]
        entry = {"mean": _nanmean(values), "scorable": _share(~values.isnan())}
        summary["rewards"][name] = entry | ({"fraction_of_ones": _share(values == 1)} if binary[f] else {})
    if combined.shape[1] > 1:
        ones = {name: _share((scores[..., f] == 1).any(dim=1)) for f, name in enumerate(names) if binary[f]}
        summary["pass_at_k"] = {"combined_at_least_threshold": _share(success.any(dim=1)), **ones}
        columns = {"combined_at_least_threshold": success}
        columns |= {name: scores[..., f] == 1 for f, name in enumerate(names) if binary[f]}
        k = combined.shape[1]
        summary["pass_at"] = {str(j): {name: pass_at_k(c, j) for name, c in columns.items()} for j in range(1, k + 1)}
    return summary


def _share(mask: torch.Tensor) -> float:
    return float(mask.float().mean())


def _nanmean(values: torch.Tensor) -> float:
    return float(values.nanmean()) if (~values.isnan()).any() else float("nan")


def results_table(result: dict[str, Any], title: str) -> Any:
    """A ``rich`` table: a row per decoding (greedy, sampled, pass@K), a column per reward function
    (the share of 1s of a 0/1 reward, else the mean), then the combined reward's mean and the share
    of completions at the threshold, then one per ``compute_metrics`` metric."""
    from rich.table import Table

    names, threshold = result["reward_functions"], result["success_threshold"]
    binary = ["fraction_of_ones" in result["greedy"]["rewards"][name] for name in names]
    weights = ", ".join(f"{weight:g}" for weight in result["reward_weights"])
    caption = (
        "% = 1: share of completions a 0/1 reward scored 1. combined: the rewards' weighted sum "
        f"(weights {weights}). pass@{result['num_generations']}: share of prompts with a 1, or a combined "
        f"reward >= {threshold:g}, among {result['num_generations']} samples."
    )
    hooked = list(result["greedy"].get("compute_metrics", {}))
    if hooked:
        caption += " (compute_metrics): the hook's metrics of each decoding's completions."
    table = Table(title=title, caption=caption)
    table.add_column("decoding")
    for name, is_binary in zip(names, binary, strict=True):
        table.add_column(f"{name}\n({'% = 1' if is_binary else 'mean'})", justify="right")
    table.add_column("combined\n(mean)", justify="right")
    table.add_column(f"combined reward\n>= {threshold:g}", justify="right")
    for key in hooked:
        table.add_column(f"{key}\n(compute_metrics)", justify="right")

    def row(summary: dict[str, Any]) -> list[str]:
        cells = [
            f"{entry['fraction_of_ones']:.1%}" if is_binary else f"{entry['mean']:.4f}"
            for entry, is_binary in zip((summary["rewards"][name] for name in names), binary, strict=True)
        ]
        combined = [f"{summary['combined_mean']:.4f}", f"{summary['combined_at_least_threshold']:.1%}"]
        task = summary.get("compute_metrics", {})
        return [*cells, *combined, *(f"{task[key]:.4g}" if key in task else "" for key in hooked)]

    table.add_row("greedy", *row(result["greedy"]))
    table.add_row(f"sampled (T={result['temperature']:g})", *row(result["sampled"]))
    pass_at_k = result["sampled"].get("pass_at_k")
    if pass_at_k is not None:
        cells = [f"{pass_at_k[name]:.1%}" if name in pass_at_k else "" for name in names]
        combined = f"{pass_at_k['combined_at_least_threshold']:.1%}"
        table.add_row(f"pass@{result['num_generations']}", *cells, "", combined, *([""] * len(hooked)))
    return table
