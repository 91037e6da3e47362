"""The names of the metrics that more than one module writes or reads, defined once.

TRL's names where TRL logs the same quantity. The trainer's metrics modules write them; the live
health monitors, the progress bar and log lines, the model card, the report's plots and its
diagnostics read them. A metric only one module touches keeps its name there.
"""

LOSS = "loss"
GRAD_NORM = "grad_norm"
REWARD = "reward"
REWARD_STD = "reward_std"
KL = "kl"
ENTROPY = "entropy"
MEAN_LENGTH = "completions/mean_length"
MIN_LENGTH = "completions/min_length"
MAX_LENGTH = "completions/max_length"
CLIPPED_RATIO = "completions/clipped_ratio"
FRAC_REWARD_ZERO_STD = "frac_reward_zero_std"
FRAC_TASK_REWARD_ZERO_STD = "frac_task_reward_zero_std"
FRAC_TOKENS_NONZERO_ADVANTAGE = "frac_tokens_nonzero_advantage"
POLICY_VERSION = "policy_version"
# a reused batch's first step: mean |log pi_train - log pi_old| of the stored old log-probs, 0 in exact arithmetic
FIRST_STEP_LOG_RATIO = "first_step/abs_log_ratio"
EVAL_REWARD = "eval_reward"
TRAIN_LOSS = "train_loss"


def timing(phase: str) -> str:
    """The seconds of one phase of the step (:mod:`rloo.training.timing`)."""
    return f"timing/{phase}"


def health(monitor: str) -> str:
    """1.0 at the step a health monitor fired (:mod:`rloo.training.monitoring.health`)."""
    return f"health/{monitor}"
