"""Optimizers: the one-pass SGD, Adam and AdamW the modes step (optimizers.py) and the learning-rate
schedules (schedule.py). The learning rate is for the global batch, never scaled by the world size."""
