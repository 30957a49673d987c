"""compbench: config-driven experiments with gradient compression in data-parallel training."""

__version__ = "0.1.0"
