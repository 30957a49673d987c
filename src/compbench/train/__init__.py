"""The trainer: one loop, the compression pipeline, metrics and checkpoints."""
