"""Multi-turn rollouts: tools the model calls, environments, custom rollout functions (TRL GRPO's API)."""
