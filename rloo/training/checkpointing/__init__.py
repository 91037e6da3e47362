"""Persistence: checkpoints that are never half-written, the run folder, the best model, the hub."""
