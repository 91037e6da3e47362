"""The fields of ``RLOOConfig``, each with its documentation: one dataclass, :class:`RLOOFields`,
that :class:`rloo.config.rloo_config.RLOOConfig` extends with validation, preset resolution and
freezing (departures from TRL are listed there).

Kept apart from the class's behaviour so that either can grow; the order of the fields here is
the order of ``RLOOConfig``'s constructor and of the README's field table.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any

from rloo.config.field_types import FloatList, FloatPair, KeywordMapping, NameList
from rloo.config.optimizers import OPTIMIZERS
from rloo.config.presets import PRESETS

# each option's TRL counterpart, by its dataclass Field (read with trl_name). Not in the field's
# metadata: transformers' HfArgumentParser (and TRL's TrlParser) pass every metadata key to
# argparse's add_argument, which refuses one it does not know
_TRL_NAMES: dict[Any, str | None] = {}  # dataclasses.Field hashes by identity


def option(default: Any, help: str, *, trl: str | None = None) -> Any:
    """A constructor field with its documentation: ``help`` (what it does, unit, range; the only
    metadata key, as argparse reads it) and ``trl``, the TRL 1.13 ``RLOOConfig``/``TrainingArguments``
    field that means the same (None: no counterpart; :func:`trl_name`)."""
    if isinstance(default, tuple):  # a list field: transformers' HfArgumentParser reads only a default_factory
        declared = field(default_factory=lambda: list(default), metadata={"help": help})
    else:
        declared = field(default=default, metadata={"help": help})
    _TRL_NAMES[declared] = trl
    return declared


def default_value(declared: Any) -> Any:
    """A field's default as the README and ``--help`` show it (a list field's too)."""
    return declared.default_factory() if declared.default is MISSING else declared.default


def trl_name(declared: Any) -> str | None:
    """The TRL field a field of :class:`RLOOFields` (a ``dataclasses.Field``) means the same as; None: none.
    A ``KeyError`` for a field not declared with :func:`option`."""
    return _TRL_NAMES[declared]


@dataclass
class RLOOFields:
    """Every constructor argument of ``RLOOConfig``, with its default and documentation."""

    # --- run ---
    output_dir: str | None = option(
        None,
        "Run folder: checkpoint-STEP/, config.yaml, metrics.jsonl, the final model. None = a fresh runs/rloo, "
        "runs/rloo-2, ... (printed at start-up; config.yaml records it).",
        trl="output_dir",
    )
    run_name: str | None = option(
        None, "The run's name: printed at start-up and given to W&B; None = output_dir's folder name.", trl="run_name"
    )
    overwrite_output_dir: bool = option(
        False,
        "Allow a fresh run into an output_dir holding an earlier run (its logs are kept renamed, the rest "
        "replaced), or a resume behind newer checkpoints (they are deleted). False refuses, changing nothing.",
        trl="overwrite_output_dir",
    )
    seed: int = option(42, "Seed of the model init, the prompt order and sampling (eval: seed + 1).", trl="seed")
    preset: str = option(
        "trl",
        f"Algorithm preset filling every algorithm knob left None: one of {', '.join(PRESETS)}; trl is the math "
        "of TRL 1.13's RLOOTrainer. An explicit knob wins over the preset (printed at start-up).",
        trl=None,
    )
    # --- data and generation ---
    num_generations: int = option(
        2, "Completions per prompt (K), >= 2: the leave-one-out baseline needs K - 1 others.", trl="num_generations"
    )
    max_prompt_length: int | None = option(
        512,
        "Prompt length limit in tokens, >= 1: longer prompts are truncated from the left (counted in "
        "prompts/truncated). None = no truncation. TRL 1.13 has no such field.",
        trl=None,
    )
    max_completion_length: int = option(
        512,  # TRL 1.16's RLOOConfig and GRPOConfig
        "Most tokens generated per completion, >= 1; a completion with no EOS by then is truncated.",
        trl="max_completion_length",
    )
    temperature: float = option(
        1.0,
        "Sampling temperature, > 0; as in TRL it also divides the logits when computing the log-probs for the loss.",
        trl="temperature",
    )
    top_p: float = option(
        1.0,
        "Nucleus sampling: keep the likeliest tokens within this probability mass, in (0, 1]; 1.0 = off.",
        trl="top_p",
    )
    top_k: int = option(0, "Sample among the k likeliest tokens only, >= 0; 0 disables it.", trl="top_k")
    min_p: float | None = option(
        None, "Drop tokens below min_p x the top token's probability, in [0, 1]; None disables it.", trl="min_p"
    )
    repetition_penalty: float = option(
        1.0,
        "Penalty on tokens already in the prompt or completion, > 0; > 1 discourages repeats, 1.0 disables it.",
        trl="repetition_penalty",
    )
    remove_unused_columns: bool = option(
        False,
        "True keeps only the prompt column (TRL's meaning): reward functions then get no other dataset column.",
        trl="remove_unused_columns",
    )
    pad_to_multiple_of: int | None = option(
        None,
        "Pad the prompt and completion token tensors to a multiple of this length, >= 1 (shapes tensor cores "
        "like); the padding is masked, so the math is unchanged. None = no extra padding.",
        trl="pad_to_multiple_of",
    )
    generation_kwargs: KeywordMapping | None = option(
        None,
        "Extra generation settings, as TRL's: stop_strings (or vLLM's stop): a completion ends once its text "
        "contains one, kept in it; eos_token_id: more ids that end a completion (the tokenizer's and the "
        "model's generation_config.eos_token_id always do). Keys with their own field are refused.",
        trl="generation_kwargs",
    )
    chat_template_kwargs: KeywordMapping | None = option(
        None,
        "Variables for the chat template of conversational prompts, e.g. {enable_thinking: false} (Qwen3).",
        trl="chat_template_kwargs",
    )
    max_tool_calling_iterations: int | None = option(
        None,
        "With tools: the most rounds of tool calls in an episode, >= 0; None = no limit but max_completion_length "
        "(the whole episode after the prompt).",
        trl="max_tool_calling_iterations",
    )
    tool_timeout: float | None = option(
        60.0,
        "With tools: seconds a tool call may run, > 0; a call past it is answered with an error message (and "
        "counted as failed). None = no limit.",
        trl=None,
    )
    generation_batch_size: int | None = option(
        None,
        "Completions per generation batch on one process: a multiple of per_device_train_batch_size and of "
        "num_generations. None = per_device_train_batch_size x steps_per_generation; set one of the two, not both.",
        trl="generation_batch_size",
    )
    steps_per_generation: int | None = option(
        None,
        "Micro-batches (of per_device_train_batch_size completions) per generation batch, >= 1, a multiple of "
        "gradient_accumulation_steps. None = from generation_batch_size, else gradient_accumulation_steps.",
        trl="steps_per_generation",
    )
    shuffle_dataset: bool = option(
        True, "A new seeded random prompt order every epoch; False = dataset order.", trl="shuffle_dataset"
    )
    # --- algorithm (None = from the preset) ---
    beta: float | None = option(
        None,
        "KL penalty coefficient against the frozen reference, >= 0; 0 disables the KL and builds no reference "
        "model. None = from the preset (trl: 0.05).",
        trl="beta",
    )
    num_iterations: int = option(
        1,
        "Optimizer passes over each generation batch, >= 1; > 1 computes old log-probs and uses the clipped ratio.",
        trl="num_iterations",
    )
    epsilon: float | None = option(
        None, "Lower clip range (ratio >= 1 - epsilon), in (0, 1). None = from the preset (trl: 0.2).", trl="epsilon"
    )
    epsilon_high: float | None = option(
        None,
        "Upper clip range (ratio <= 1 + epsilon_high), > 0. None = from the preset: equal to epsilon (dapo: 0.28).",
        trl="epsilon_high",
    )
    off_policy_mask_threshold: float | None = option(
        None,
        "Leave out of the policy loss a completion with a negative advantage whose mean per-token KL from the "
        "sampling policy to the current one exceeds this, > 0 (DeepSeek-V3.2's delta, e.g. 0.5); None: off.",
        trl="off_policy_mask_threshold",
    )
    clip_ratio: bool | None = option(
        None,
        "Clip the importance ratio to [1 - epsilon, 1 + epsilon_high]; False = unclipped (plain REINFORCE). "
        "None = from the preset (trl: True, rloo_paper: False).",
        trl=None,
    )
    advantage_estimator: str | None = option(
        None,
        "Baseline and scaling of the advantage: rloo (leave-one-out), grpo, group_mean, reinforce, reinforce_pp "
        "or reinforce_pp_baseline. None = from the preset (trl: rloo).",
        trl=None,
    )
    normalize_advantages: bool | None = option(
        None,
        "Whiten the advantages over the generation batch (mean 0, std 1). None = from the preset (trl: False).",
        trl="normalize_advantages",
    )
    kl_estimator: str | None = option(
        None,
        "Per-token KL estimator of log-ratio x: k1 (x), k2 (x^2 / 2) or k3 (exp(-x) - 1 + x). None = from the "
        "preset (trl: k1).",
        trl=None,
    )
    kl_placement: str | None = option(
        None,
        "Where beta x KL goes: reward (subtracted from the reward before the baseline) or loss (added to the "
        "per-completion loss; with k2 or k3: k1's gradient there is 0 in expectation). None = from the preset "
        "(trl: reward).",
        trl=None,
    )
    ratio_level: str | None = option(
        None,
        "Importance ratio per completion (sequence) or per token (token). None = from the preset (trl: sequence).",
        trl=None,
    )
    loss_aggregation: str | None = option(
        None,
        "How token losses become the loss: token_mean, seq_mean_token_mean, seq_mean_token_sum or "
        "seq_mean_token_sum_norm. None = from the preset (trl: seq_mean_token_sum).",
        trl=None,
    )
    mask_truncated_completions: bool | None = option(
        None,
        "Zero the loss of completions with no EOS. None = from the preset (trl: False, dapo: True).",
        trl="mask_truncated_completions",
    )
    sync_ref_model: bool = option(
        False,
        "Refresh the reference policy every ref_model_sync_steps steps: ref = alpha * policy + (1 - alpha) * ref "
        "(TR-DPO). Needs beta > 0 and a reference to refresh: a full model or a trained PeftModel's adapter copy "
        "(not a fresh LoRA's adapters-disabled model).",
        trl="sync_ref_model",
    )
    ref_model_mixup_alpha: float = option(
        0.6, "alpha of sync_ref_model's refresh, in [0, 1].", trl="ref_model_mixup_alpha"
    )
    ref_model_sync_steps: int = option(
        512, "Optimizer steps between sync_ref_model's refreshes, >= 1.", trl="ref_model_sync_steps"
    )
    reward_weights: FloatList | None = option(
        None,
        "One weight per reward function; the reward is the weighted sum of those that apply. None = all 1.0.",
        trl="reward_weights",
    )
    multi_objective_aggregation: str = option(
        "sum_then_normalize",
        "Several reward functions: sum_then_normalize (the weighted sum, then the advantage estimator) or "
        "normalize_then_sum (GDPO: each function normalized within its group, mean 0 and std 1 over the "
        "completions it applies to, then the weighted sum, then the estimator).",
        trl="multi_objective_aggregation",
    )
    reward_clip_range: FloatPair | None = option(
        None,
        "(min, max): clamps the combined reward before the KL penalty and the baseline. None = no clipping.",
        trl="reward_clip_range",
    )
    reward_timeout: float | None = option(
        None,
        "Seconds a reward call may take, > 0; past it the call failed (see reward_error_policy). None: no limit, "
        "with a warning when a call has run 60 s (then 120 s, 240 s, ...).",
    )
    reward_error_policy: str = option(
        "raise",
        "A reward call that raises, times out or returns a bad result: 'raise' stops the run naming it; "
        "'skip' scores that batch 'does not apply' (rewards/<name>/failed).",
    )
    router_aux_loss_coef: float = option(
        0.001,
        "Weight of a mixture-of-experts model's load-balancing loss added to the loss, >= 0 (logged as aux_loss); "
        "no effect on other models; 0 turns it off.",
        trl="router_aux_loss_coef",
    )
    entropy_coef: float = option(0.0, "Weight of an entropy bonus subtracted from the loss, >= 0; 0 = off.", trl=None)
    # --- optimization ---
    learning_rate: float = option(1e-6, "Peak learning rate, > 0 (1e-6 is typical for RL).", trl="learning_rate")
    per_device_train_batch_size: int = option(
        8,
        "Completions (not prompts) per micro-batch on one process, >= 1: 8 with num_generations=4 is 2 prompts.",
        trl="per_device_train_batch_size",
    )
    gradient_accumulation_steps: int = option(
        1,
        "Micro-batches per optimizer step, >= 1; also the default of steps_per_generation.",
        trl="gradient_accumulation_steps",
    )
    max_steps: int = option(-1, "Optimizer steps to train, >= 1; -1 = from num_train_epochs.", trl="max_steps")
    num_train_epochs: float = option(
        1.0, "Passes over the training prompts when max_steps is -1, > 0 (fractions allowed).", trl="num_train_epochs"
    )
    warmup_ratio: float = option(
        0.0,
        "Fraction of the optimizer steps spent in linear learning-rate warm-up, in [0, 1); used if warmup_steps is 0 "
        "(transformers 5 writes warmup_steps=0.1 instead).",
        trl="warmup_ratio",
    )
    warmup_steps: float = option(
        0,
        "Optimizer steps of linear LR warm-up, >= 0, or a fraction of the run in (0, 1) (0.1: the first 10%, as "
        "transformers 5); when > 0 it overrides warmup_ratio.",
        trl="warmup_steps",
    )
    lr_scheduler_type: str = option(
        "linear",
        "Learning-rate schedule, one of transformers' get_scheduler: linear, cosine, cosine_with_restarts, "
        "polynomial, constant, constant_with_warmup, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, "
        "warmup_stable_decay.",
        trl="lr_scheduler_type",
    )
    lr_scheduler_kwargs: KeywordMapping | None = option(
        None,
        "Keyword arguments of the schedule, e.g. {min_lr_rate: 0.1} for cosine_with_min_lr, {num_cycles: 2} "
        "for cosine_with_restarts; checked when the config is built.",
        trl="lr_scheduler_kwargs",
    )
    max_grad_norm: float = option(
        1.0, "Clip the global gradient norm to this, >= 0; 0 disables clipping.", trl="max_grad_norm"
    )
    health_thresholds: KeywordMapping | None = option(
        None,
        "Live health monitors (length/KL/reward/entropy collapse, train up eval down, loss spikes): thresholds "
        "by name over the defaults (README: Health monitors); 0 turns one off. A firing monitor warns.",
        trl=None,
    )
    max_nonfinite_steps: int = option(
        3,
        "An optimizer step whose loss or gradient is NaN/inf is skipped (no update), counted in "
        "train/nonfinite_steps and warned; after this many in a row training stops, keeping its checkpoints.",
        trl=None,
    )
    optim: str = option(
        "adamw_torch",
        f"Optimizer, built by transformers' factory: one of {', '.join(OPTIMIZERS)} (the 8-bit ones need "
        "bitsandbytes; on a CPU >= 0.50, where paged is plain). The adam_* fields apply to the AdamW ones.",
        trl="optim",
    )
    optim_args: str | None = option(
        None,
        "Extra optimizer arguments as transformers reads them, 'key=value,key=value': sgd takes momentum, "
        "dampening, weight_decay, nesterov; adagrad lr_decay, weight_decay, eps; rmsprop momentum, alpha, eps, "
        "weight_decay, centered. Refused for the other optimizers (transformers ignores it there).",
        trl="optim_args",
    )
    weight_decay: float = option(0.0, "Weight decay of all trainable weights, >= 0.", trl="weight_decay")
    adam_beta1: float = option(0.9, "AdamW beta1 (decay of the gradient mean), in [0, 1).", trl="adam_beta1")
    adam_beta2: float = option(0.999, "AdamW beta2 (decay of the squared gradient), in [0, 1).", trl="adam_beta2")
    adam_epsilon: float = option(1e-8, "AdamW epsilon added to the denominator, >= 0.", trl="adam_epsilon")
    bf16: bool | None = option(
        None,
        "bf16 mixed precision: True, False (fp32), or None = bf16 on GPUs that support it, fp32 elsewhere (TRL: True).",
        trl="bf16",
    )
    fp16: bool = option(
        False, "fp16 autocast + gradient scaler on a CUDA GPU (else fp32, warned); not with bf16=True.", trl="fp16"
    )
    gradient_checkpointing: bool = option(
        False, "Recompute activations in the backward: less memory, slower (TRL: True).", trl="gradient_checkpointing"
    )
    gradient_checkpointing_kwargs: KeywordMapping | None = option(
        None,
        "Keyword arguments of the model's gradient_checkpointing_enable, over rloo's {use_reentrant: false}.",
        trl="gradient_checkpointing_kwargs",
    )
    disable_dropout: bool = option(
        True, "Dropout off in the policy: sampling and training see one policy (TRL: False).", trl="disable_dropout"
    )
    # speed and memory: exact, they change no gradient
    skip_zero_advantage: bool = option(
        True,
        "Rows with zero advantage skip their (exactly zero) backward; only with no entropy bonus or KL in the loss.",
        trl=None,
    )
    max_logits_memory_mb: float = option(
        256.0,
        "MiB, > 0: float32 logits stay under it: the LM head runs in chunks of it (else passes split by rows).",
        trl=None,
    )
    padding_free: bool = option(
        True,
        "Pack a pass's rows end to end (positions restarting per row) where the model's attention keeps them "
        "apart and it costs fewer FLOPs than padding; False: never. Per pass, by a FLOPs model (README).",
        trl=None,
    )
    model_init_kwargs: KeywordMapping | None = option(
        None,
        "Keyword arguments of from_pretrained for a model given by name or path. Weights load in float32 unless "
        "it names a dtype (a torch.dtype or its name, e.g. {dtype: bfloat16}); values must be YAML-writable.",
        trl="model_init_kwargs",
    )
    trust_remote_code: bool = option(
        False,
        "Run the modelling/tokenizer code a model folder or hub repo ships (only for sources you trust).",
        trl="trust_remote_code",
    )
    # --- logging and checkpoints ---
    logging_steps: float = option(
        10,
        "Log the metrics, averaged since the last log, every this many optimizer steps, >= 1, or a fraction of the "
        "run in (0, 1) (0.1: every 10% of max_steps).",
        trl="logging_steps",
    )
    logging_first_step: bool = option(False, "Also log after the first optimizer step.", trl="logging_first_step")
    save_steps: float = option(
        500,
        "Save output_dir/checkpoint-STEP every this many optimizer steps, >= 1, or a fraction of the run in (0, 1): "
        "at the first generation-batch boundary at or after each multiple, so every checkpoint resumes exactly.",
        trl="save_steps",
    )
    save_strategy: str = option(
        "steps",
        "When to checkpoint: steps (every save_steps), epoch (after each pass over the prompts) or no (only "
        "the final model).",
        trl="save_strategy",
    )
    save_total_limit: int | None = option(
        None, "Keep at most this many checkpoints, deleting the oldest, >= 1; None = keep all.", trl="save_total_limit"
    )
    eval_steps: float | None = option(
        None,
        "Evaluate on the eval_dataset every this many optimizer steps, >= 1, or a fraction of the run in (0, 1); "
        "None = never.",
        trl="eval_steps",
    )
    eval_strategy: str | None = option(
        None,
        "When to evaluate: steps (every eval_steps), epoch (after each pass over the prompts) or no. None = steps "
        "when eval_steps is set, else no (TRL: no).",
        trl="eval_strategy",
    )
    load_best_model_at_end: bool = option(
        False,
        "Keep the weights of the best evaluation in output_dir/best and load them at the end (needs evaluation).",
        trl="load_best_model_at_end",
    )
    metric_for_best_model: str | None = option(
        None,
        "The eval metric that picks the best model (eval_ prefix optional); None = eval_reward.",
        trl="metric_for_best_model",
    )
    greater_is_better: bool | None = option(
        None,
        "Whether a larger metric_for_best_model is better; None = True unless its name has 'loss'.",
        trl="greater_is_better",
    )
    num_generations_eval: int | None = option(
        None, "Completions per prompt in evaluation, >= 1; None = num_generations.", trl="num_generations_eval"
    )
    per_device_eval_batch_size: int | None = option(
        None,
        "Completions per evaluation batch on each process, >= 1 (rounded down to whole prompts, at least one); "
        "None = as many as a training generation batch.",
        trl="per_device_eval_batch_size",
    )
    report_to: NameList = option(
        ("none",),
        "Experiment trackers besides metrics.jsonl, through accelerate: none, all (every installed one), "
        "tensorboard, wandb, trackio, comet_ml, mlflow, aim, clearml, dvclive, swanlab, or a tracker registered "
        "with accelerate. Logged under TRL's names (train/reward, eval/reward) with the run's config.",
        trl="report_to",
    )
    log_completions: bool = option(
        False,
        "Append prompts, completions, rewards and advantages to output_dir/completions.jsonl every logging step.",
        trl="log_completions",
    )
    log_multimodal: bool = option(
        True,
        "With log_completions, save each prompt's images as PNG files in output_dir/completion_images, named in "
        "its completions' rows (images); False: text only, for smaller logs.",
        trl="log_multimodal",
    )
    log_grad_variance: int = option(
        0,
        "Every this many optimizer steps, measure the variance of the policy-gradient estimate across the batch's "
        "prompts for the advantages used and, on the same samples, for no baseline, group mean, leave-one-out and "
        "GRPO (grad_var/* metrics; README: Gradient-variance diagnostic), >= 0; 0 = off. Costs about one extra "
        "optimizer step's forward and backward, row by row, per measured batch.",
        trl=None,
    )
    num_completions_to_print: int = option(
        0,
        "Accepted for TRL configs, >= 0, but unused: completions are written by log_completions instead.",
        trl="num_completions_to_print",
    )
