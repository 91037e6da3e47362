"""What watches a run: logs and trackers, health monitors, the non-finite guard, the progress bar,
stop signals, the gradient-variance probe, evaluation (``RLOOTrainer.evaluate``)."""
