"""`dataset=synthetic`: any shape, learnable labels (class templates plus noise), made from a seed."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from compbench.data import IMAGE_SIZE, SEED, KeyRange

# Any shape is possible; 64 channels and 10^5 classes are far beyond what a benchmark needs.
KEY_RANGES = {"num_classes": KeyRange(1, 100_000), "image_size": IMAGE_SIZE,
              "channels": KeyRange(1, 64, what="image planes"), "train_size": KeyRange(1),
              "test_size": KeyRange(1), "noise": KeyRange(0, integer=False), "seed": SEED}
TASK = "classification"


def synthetic(
    num_classes: int = 10,
    image_size: int = 32,
    channels: int = 3,
    train_size: int = 2048,
    test_size: int = 512,
    noise: float = 1.0,
    seed: int = 0,
    **_: object,
):
    if min(num_classes, image_size, channels, train_size, test_size) < 1:
        raise ValueError("dataset=synthetic: num_classes, image_size, channels and sizes must be >= 1")
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(num_classes, channels, image_size, image_size, generator=g)

    def make(n: int) -> TensorDataset:
        y = torch.randint(num_classes, (n,), generator=g)
        x = templates[y] + noise * torch.randn(n, channels, image_size, image_size, generator=g)
        return TensorDataset(x, y)

    return make(train_size), make(test_size)


def check_root(root: str | None = None) -> None:
    """Made in memory: nothing to check."""


def train_size_of(train_size: int = 2048, **_: object) -> int:
    """Training samples, known without building the set (the parent's batch-size check)."""
    return train_size
