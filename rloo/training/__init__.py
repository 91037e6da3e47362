"""The training loop: ``RLOOTrainer``, its batches, models, checkpoints and logs."""
