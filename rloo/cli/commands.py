"""The ``rloo`` command line: ``train``, ``eval``, ``report``, ``plan`` and ``vllm-serve``; the demos
(``demo``, ``demo-tools``, ``bandit``) register on the same app from :mod:`rloo.cli.demo_commands`.

Heavy imports (torch, transformers) happen inside the commands, so ``rloo --help`` is fast.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperCommand

from rloo.training.monitoring.logs import log_console

app = typer.Typer(help="rloo: online RL fine-tuning of causal LMs with REINFORCE Leave-One-Out.", no_args_is_help=True)
console = log_console()  # piped: no hard wrap at 80 columns
errors = log_console(stderr=True)


_options = {"debug": False}


def _print_version(value: bool) -> None:
    if value:  # the package's own version (an editable install's metadata keeps the one it was installed at)
        from rloo import __version__

        console.print(f"rloo {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error."),
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print rloo's version and exit."
    ),
) -> None:
    """rloo: online RL fine-tuning of causal LMs with REINFORCE Leave-One-Out."""
    _options["debug"] = debug


def _fail(message: str, code: int = 2) -> typer.Exit:
    errors.print(f"[red]error:[/red] {escape(message)}", highlight=False)  # `[q_proj]` is not markup
    return typer.Exit(code)


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """A user mistake (ValueError, a missing file) is one line and exit 2; any other error one line
    and exit 1. ``rloo --debug ...`` shows the traceback instead."""
    try:
        yield
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as err:
        if _options["debug"]:
            raise
        raise _fail(*_describe(err)) from None


# errors whose message already says what happened and what to do, by name (no heavy imports),
# with their exit codes: a user mistake 2, a failing reward function, compute_metrics or checkpoint write 1,
# non-finite training 3
_NAMED_ERRORS = {
    "RewardFunctionError": 1,
    "ComputeMetricsError": 1,
    "NonFiniteTrainingError": 3,
    "CheckpointWriteError": 1,
    "SandboxUnavailable": 2,  # no sandbox for model-written code: the message says how to get one
    "VLLMServerError": 1,  # the vLLM server: lost, too slow, or not speaking its protocol (the URL and the fix)
    "ServerLost": 1,
    "ServerTimeout": 1,
    "MalformedAnswer": 1,
}


def _describe(err: Exception) -> tuple[str, int]:
    """``(message, exit code)`` of an error the CLI reports in one line (with its notes: a run stopped
    mid-training names its newest checkpoint and the resume command)."""
    notes = "".join(f" {note}" for note in getattr(err, "__notes__", ()))
    if isinstance(err, ValueError | FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return f"{err}{notes}", 2
    if type(err).__name__ in _NAMED_ERRORS:
        return f"{err}{notes}", _NAMED_ERRORS[type(err).__name__]
    return f"{type(err).__name__}: {err}{notes} (rloo --debug ... shows the traceback)", 1


class _TrainCommand(TyperCommand):
    """``rloo train --help`` ends with every config field, its default and its documentation (read
    from the fields only when help is shown, so ``rloo --help`` stays fast)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from rloo.cli.trl_args import fields_help

        self.epilog = escape(fields_help())
        super().format_help(ctx, formatter)


class _EitherSpelling(TyperCommand):
    """A command whose own options take ``--num_generations`` as well as ``--num-generations``, as ``rloo train``
    takes every field both ways (TRL's flags are snake_case); other flags pass through unchanged."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        own = {name for param in self.params for name in getattr(param, "opts", [])}

        def spelled(arg: str) -> str:
            name, sep, value = arg.partition("=")
            dashed = "--" + name[2:].replace("_", "-")
            return dashed + sep + value if arg.startswith("--") and name not in own and dashed in own else arg

        return super().parse_args(ctx, [spelled(arg) for arg in args])


@app.command(cls=_TrainCommand, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def train(
    arguments: list[str] = typer.Argument(
        None,
        metavar="[RUN.yaml] [key=value]... [--field value]...",
        help="A YAML run file (RLOOConfig fields plus model, dataset, reward_funcs, peft); dotted.key=value "
        "overrides (learning_rate=1e-5 peft.r=8); and/or TRL's flags, as `trl rloo` takes them "
        "(--model_name_or_path M --dataset_name D --reward_funcs accuracy_reward --use_peft --config FILE.yaml, "
        "any field as --field value).",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in output_dir."),
    resume_from: str = typer.Option(
        None, help="Continue from this checkpoint: a folder, or a checkpoint-<step> name in output_dir."
    ),
    print_config: bool = typer.Option(
        False, "--print-config", help="Print the resolved run file (every field) and exit; loads nothing."
    ),
) -> None:
    """Train a model with RLOO, as a YAML run file and/or TRL's command-line flags describe it."""
    from rloo.cli.run_file import load_run_file
    from rloo.cli.trl_args import run_values

    with _one_line_errors():
        if not arguments:
            raise ValueError("give a run file (rloo train RUN.yaml) or TRL's flags (--model_name_or_path ...)")
        path, overrides, flags = run_values(list(arguments))
        run_file = load_run_file(path, overrides, flags)
    if print_config:
        import yaml

        print(yaml.safe_dump(run_file.to_dict(), sort_keys=False), end="")  # plain: pipe it to a file
        return
    from rloo.cli.run_file import train_from_run_file
    from rloo.training.checkpointing.checkpoints import latest_checkpoint
    from rloo.training.checkpointing.run_folder import LOG_FILES, ResumeRefused, earlier_run_files
    from rloo.training.monitoring.signals import TrainingInterrupted

    try:
        with _one_line_errors():
            checkpoint = _checkpoint_path(
                resume_from or run_file.config.resume_from_checkpoint, run_file.config.output_dir
            )
            try:
                trainer = train_from_run_file(run_file, resume=checkpoint or resume, console=errors)
            except ResumeRefused as refused:  # in the CLI's words: --resume-from PATH, not resume_from_checkpoint=
                raise ValueError(refused.cli) from None
        if trainer.ranks.distributed:  # every file is written: skip gloo's teardown at finalization
            from rloo.training.parallel.distributed import exit_process

            exit_process(0)
    except KeyboardInterrupt as stop:
        # exit 128 + the signal (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP); resume only from a checkpoint
        code = stop.exit_code if isinstance(stop, TrainingInterrupted) else 130
        # no output_dir: the fresh folder the trainer claimed is the checkpoint's
        folder = stop.checkpoint.parent if isinstance(stop, TrainingInterrupted) else run_file.config.output_dir
        if folder is None or latest_checkpoint(Path(folder)) is None:
            left = earlier_run_files(Path(folder)) if folder is not None else []
            replaced = ", ".join(name for name in left if name not in LOG_FILES) or "nothing"
            again = (
                f"; start again with rloo train ... overwrite_output_dir=true (it replaces {replaced}; "
                "the logs are kept renamed)"
                if left
                else ""
            )
            errors.print(
                escape(f"stopped before any checkpoint was written: nothing to resume from{again}"), highlight=False
            )
        else:
            # config.yaml in the run folder records the whole run, overrides included
            command = f"rloo train {Path(folder) / 'config.yaml'} --resume"
            errors.print(f"stopped. Resume with: {escape(command)}", highlight=False)
        raise typer.Exit(code) from None


@app.command("eval", cls=_EitherSpelling)
def evaluate(
    model: str = typer.Option(..., help="Model folder, checkpoint folder or hub id."),
    dataset: str = typer.Option(
        None, help="Dataset path or hub id with a `prompt` column \\[default: the run file's]."
    ),
    reward: list[str] = typer.Option(None, help="Reward: built-in name, module:function, or reward-model folder."),
    reward_weight: list[float] = typer.Option(None, help="One weight per --reward \\[default: 1 each]."),
    run_file: Path = typer.Option(
        None, help="A run file (e.g. RUN_DIR/config.yaml): its rewards, weights, dataset and lengths are the defaults."
    ),
    split: str = typer.Option(
        None,
        help="Dataset split \\[default: with --dataset, test (a file: the file); with --run-file, its eval_dataset's, "
        "else its training split, with a warning].",
    ),
    name: str = typer.Option(None, help="The hub dataset's configuration, e.g. main for openai/gsm8k."),
    as_chat: bool = typer.Option(
        None, "--as-chat/--as-text", help="Text prompts as a user message (rendered with the chat template)."
    ),
    system_prompt: str = typer.Option(None, help="A system message before each prompt (with --as-chat)."),
    column: list[str] = typer.Option(None, help="Column renames old=new, e.g. question=prompt."),
    num_generations: int = typer.Option(
        None, "--num-generations", "--num-samples", help="K samples per prompt for pass@K and the sampled mean [4]."
    ),
    max_completion_length: int = typer.Option(None, help="Max new tokens per completion [256]."),
    temperature: float = typer.Option(None, help="Sampling temperature [1.0]."),
    limit: int = typer.Option(None, help="Evaluate only the first N prompts."),
    success_threshold: float = typer.Option(
        1.0, help="Report the share of completions whose combined (weighted) reward is >= this."
    ),
    batch_size: int = typer.Option(64, help="Prompts generated at once."),
    output: Path = typer.Option(
        None,
        help="Write the results as JSON here \\[default: beside the run: RUN/eval-<model>.json for a run's final/ or "
        "checkpoint, else the run file's folder, else runs/eval/; never overwriting an earlier one].",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON (stdout) instead of the table."),
    seed: int = typer.Option(0, help="Random seed for sampling."),
    compute_metrics: str = typer.Option(
        None, help="module:function: task metrics of each decoding's completions \\[default: the run file's]."
    ),
) -> None:
    """Each reward function's score of a model, greedy and sampled (pass@K), scored as in training."""
    from rloo.cli.evaluate import (
        default_output,
        describe_source,
        eval_inputs,
        evaluate_model,
        results_table,
        write_results,
    )

    with _one_line_errors():
        inputs = eval_inputs(
            run_file,
            dataset=dataset,
            split=split,
            columns=_column_renames(column or []),
            limit=limit,
            rewards=reward or None,
            weights=reward_weight or None,
            num_generations=num_generations,
            max_completion_length=max_completion_length,
            temperature=temperature,
            success_threshold=success_threshold,
            batch_size=batch_size,
            seed=seed,
            name=name,
            as_chat=as_chat,
            system_prompt=system_prompt,
            compute_metrics=compute_metrics,
        )
        described = describe_source(inputs.source)
        if inputs.on_training_data:
            errors.print(
                f"[bold yellow]warning:[/bold yellow] {escape(str(run_file))} has no eval_dataset: evaluating on "
                f"its TRAINING data ({escape(described)}); choose other prompts with --split NAME or --dataset PATH",
                highlight=False,
            )
        result = evaluate_model(model, inputs.data, inputs.rewards, inputs.settings, inputs.compute_metrics)
    source = {**inputs.source.to_dict(), "training_data": inputs.on_training_data}
    result = {"model": model, "dataset": source, **result}
    title = f"{model} on {described}{' (TRAINING data)' if inputs.on_training_data else ''}"
    path = output if output is not None else default_output(model, run_file)
    with _one_line_errors():
        write_results(result, path)
    if as_json:  # for a pipe: the JSON alone on stdout
        typer.echo(json.dumps(result, indent=1))
    else:
        console.print(results_table(result, f"{escape(title)} ({result['num_prompts']} prompts)"))
    errors.print(f"results (JSON): {escape(str(path))}", highlight=False)


def _checkpoint_path(name: str | None, output_dir: str | None) -> str | None:
    """``--resume-from``: a checkpoint folder, or the name of one inside ``output_dir``."""
    if name is None:
        return None
    path = Path(name) if Path(name).is_dir() or output_dir is None else Path(output_dir) / name
    if not path.is_dir():
        raise ValueError(f"--resume-from {name!r}: no such checkpoint folder (looked in {output_dir or '.'} too)")
    return str(path)


def _column_renames(items: list[str]) -> dict[str, str] | None:
    """``--column old=new`` options as a mapping; one without ``=`` is an error naming it."""
    bad = [item for item in items if "=" not in item or item.startswith("=") or item.endswith("=")]
    if bad:
        raise ValueError(f"--column {bad[0]!r} is invalid: write old=new, e.g. --column question=prompt")
    return dict(item.split("=", 1) for item in items) or None


@app.command(cls=_EitherSpelling)
def report(run_dir: Path = typer.Argument(..., help="A run's output_dir.")) -> None:
    """(Re)build RUN_DIR/report.html from the run's metrics and completions."""
    from rloo.report.page import build_report

    with _one_line_errors():
        path = build_report(run_dir)
    console.print(f"report written to {path}")


@app.command(cls=_EitherSpelling, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def plan(
    arguments: list[str] = typer.Argument(
        None,
        metavar="[RUN.yaml | MODEL] [key=value]... [--field value]...",
        help="The run, as `rloo train` takes it; only its model and config fields are read.",
    ),
    device: str = typer.Option("h100", help="A GPU name (h100, h200, a100-80gb, ...) or its memory (24GiB)."),
    prompt_length: int = typer.Option(None, help="Prompt tokens to plan for [default: max_prompt_length]."),
    processes: int = typer.Option(1, help="FSDP2 processes sharding weights, gradients and optimizer state."),
) -> None:
    """Predict each phase's peak memory for a run on a device (reads the model's config.json, no weights)."""
    from rloo.cli.plan import load_plan_run, plan_output
    from rloo.cli.trl_args import run_values

    with _one_line_errors():
        if not arguments:
            raise ValueError(
                "give a run file (rloo plan RUN.yaml), a model (its folder or config.json) or TRL's flags "
                "(--model_name_or_path ...)"
            )
        path, overrides, flags = run_values(list(arguments))
        head, table, tail = plan_output(load_plan_run(path, overrides, flags), device, prompt_length, processes)
    for line in head:
        console.print(line, highlight=False)
    console.print(table)
    for line in tail:
        console.print(line, highlight=False)


@app.command(
    "vllm-serve",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
def vllm_serve(ctx: typer.Context) -> None:
    """Serve a model on vLLM for use_vllm=True, vllm_mode='server' (trl vllm-serve's flags: --model, --port...)."""
    import os

    from rloo.generation.vllm.client import vllm_python

    with _one_line_errors():
        python = vllm_python()
    os.execv(python, [python, "-m", "rloo.generation.vllm.server", *ctx.args])


def main() -> None:
    app()


if __name__ == "__main__":
    main()
