"""Datasets (offline only: shipped with a package, synthetic, or from a local root) and sharding.

A dataset module (the one `conf/dataset/NAME.yaml`'s `_target_` lives in) provides, besides its
factory, the two checks the parent runs before anything is written:
- `check_root(root, ...)`: ValueError (one line) when its files are missing or damaged; it may ask
  for more of the dataset's settings by name (num_classes, name);
- `train_size_of(**settings) -> int | None`: the number of training samples, or None where counting
  is not cheap (ImageNet: the worker checks after loading);
and `KEY_RANGES: dict[str, KeyRange]`, the values each numeric setting may take (checked by the parent
before the two hooks above run).
- `TASK`: what its samples are, "classification" (x, label) or "language_model" (token windows x, y
  shifted by one): it picks the loss, evaluation and throughput unit (compbench.train.task).
"""

import compbench.base.torchvision_compat  # noqa: F401  (before torchvision is imported)
from compbench.base.values import KeyRange  # the datasets' KEY_RANGES are made of it

# Shared bounds: above 1024 pixels a side a CPU worker's batch would not fit in memory.
IMAGE_SIZE = KeyRange(1, 1024, what="pixels per side")
SEED = KeyRange(0)
