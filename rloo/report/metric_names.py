"""The names of the metrics that more than one module writes or reads, defined once.

TRL's names where TRL logs the same quantity. The trainer's metrics modules write them; the live
health monitors, the progress bar and log lines, the model card, the report's plots and its
diagnostics read them. A metric only one module touches keeps its name there.
"""

LOSS = "loss"
GRAD_NORM = "grad_norm"
REWARD = "reward"
REWARD_STD = "reward_std"
# skip_zero_advantage leaves rows with A = 0 out of the training passes; which rows each metric is over:
# every row's loss tokens: KL in the reward, the batch's no-grad passes; in the loss, the training passes
# (which then skip no row: the KL gradient of an A = 0 row is not zero)
KL = "kl"
# the trained rows' loss tokens only: no other row has a forward with entropies
ENTROPY = "entropy"
# every row's actions (tokens, or completions for a sequence-level ratio): skipped rows count, never
# clipped (both conditions need A != 0), as TRL counts them
CLIP_RATIO_MEANS = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
# the share of the step's rows (every process's) left out of the training passes
SKIPPED_ROWS_FRAC = "train/skipped_rows_frac"
MEAN_LENGTH = "completions/mean_length"
MIN_LENGTH = "completions/min_length"
MAX_LENGTH = "completions/max_length"
CLIPPED_RATIO = "completions/clipped_ratio"
FRAC_REWARD_ZERO_STD = "frac_reward_zero_std"
FRAC_TASK_REWARD_ZERO_STD = "frac_task_reward_zero_std"
FRAC_TOKENS_NONZERO_ADVANTAGE = "frac_tokens_nonzero_advantage"
POLICY_VERSION = "policy_version"
# a reused batch's first step: mean |log pi_train - log pi_old| of the stored old log-probs, 0 in exact arithmetic
# (over the trained rows' loss tokens, as ENTROPY)
FIRST_STEP_LOG_RATIO = "first_step/abs_log_ratio"
# use_vllm: |log p_trainer - log p_vLLM| of the sampled tokens, and the importance weights (TRL's names)
# the optimizer steps between the weights that sampled a batch and those it trains (max_staleness)
STALENESS = "staleness"
# a rollout worker (rollout_workers: 1): the trainer's seconds waiting for the batch, the worker's seconds waiting
# for its request, the batches asked for and not yet trained, the probe's gap after the weight sync (nats), restarts
ASYNC_TRAINER_WAIT = "async/trainer_wait_seconds"
ASYNC_WORKER_IDLE = "async/worker_idle_seconds"
ASYNC_QUEUE_DEPTH = "async/queue_depth"
ASYNC_SYNC_GAP = "async/weight_sync_probe_gap"
ASYNC_RESTARTS = "async/worker_restarts"
ASYNC_SYNC_SECONDS = "async/weight_sync_seconds"
ENGINE_GAP_MEAN = "sampling/sampling_logp_difference/mean"
ENGINE_GAP_MAX = "sampling/sampling_logp_difference/max"
IS_RATIO_MIN = "sampling/importance_sampling_ratio/min"
IS_RATIO_MEAN = "sampling/importance_sampling_ratio/mean"
IS_RATIO_MAX = "sampling/importance_sampling_ratio/max"
IS_MASKED_FRAC = "sampling/importance_sampling_ratio/masked_frac"
# dynamic_sampling (rloo.training.rollouts.dynamic_sampling), per batch: its generation rounds (verl's
# num_gen_batches), the completions they generated (every process's), the groups trained with a signal and
# without one (the rounds found too few), and of every generated completion: the mean reward and the share of
# groups without a signal (the batch's reward and frac_*_zero_std are of what it trains)
GEN_BATCHES = "dynamic_sampling/gen_batches"
GENERATED_COMPLETIONS = "dynamic_sampling/generated_completions"
KEPT_GROUPS = "dynamic_sampling/kept_groups"
FILLED_GROUPS = "dynamic_sampling/filled_groups"
GENERATED_REWARD = "dynamic_sampling/reward"
GENERATED_ZERO_STD = "dynamic_sampling/frac_reward_zero_std"
EVAL_REWARD = "eval_reward"
TRAIN_LOSS = "train_loss"


def timing(phase: str) -> str:
    """The seconds of one phase of the step (:mod:`rloo.training.timing`)."""
    return f"timing/{phase}"


def health(monitor: str) -> str:
    """1.0 at the step a health monitor fired (:mod:`rloo.training.monitoring.health`)."""
    return f"health/{monitor}"
