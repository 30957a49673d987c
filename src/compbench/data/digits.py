"""`dataset=digits`: scikit-learn's handwritten digits (1797 8x8 images, shipped with the package),
resized to image_size and repeated to 3 channels so every image model accepts it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from compbench.data import IMAGE_SIZE, SEED, KeyRange

TASK = "classification"
_SAMPLES = 1797  # sklearn.datasets.load_digits
# The stratified split needs at least one sample of each of the 10 classes on both sides.
KEY_RANGES = {"num_classes": KeyRange(choices=(10,), what="the digits 0-9"), "image_size": IMAGE_SIZE,
              "channels": KeyRange(choices=(3,), what="the gray images are repeated to 3 channels"),
              "test_fraction": KeyRange(0.01, 0.99, integer=False), "seed": SEED}


def digits(image_size: int = 32, test_fraction: float = 0.2, seed: int = 0, **_: object):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    x = ((x - 0.5) / 0.5).repeat(1, 3, 1, 1).contiguous()
    y = torch.tensor(data.target, dtype=torch.int64)
    # A fixed stratified split: the test set never depends on the world size or the run.
    tr, te = train_test_split(range(len(y)), test_size=test_fraction, random_state=seed, stratify=y.numpy())
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[te], y[te])


def check_root(root: str | None = None) -> None:
    """Ships with scikit-learn: nothing to check."""


def train_size_of(test_fraction: float = 0.2, **_: object) -> int:
    """Training samples, known without loading (train_test_split's rule: the test set is rounded up)."""
    return _SAMPLES - math.ceil(test_fraction * _SAMPLES)
