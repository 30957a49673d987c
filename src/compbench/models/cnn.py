"""`model=cnn`: a small LeNet-style convolutional net for 28x28 images (Fashion-MNIST, MNIST).

conv 3x3 (16) -> max-pool -> conv 3x3 (32) -> max-pool -> fc 128 -> fc classes, ReLU, no BatchNorm:
0.21M parameters at width 16 (the default), ~1.2M multiply-adds per 28x28 image (resnet20: ~30M).
It exists for the claims suite's budget: on 2 CPU cores resnet20 trains ~180 samples/s, too slow to
take 40+ runs past 90% on Fashion-MNIST in 90 minutes; this net reaches 90% in 3 epochs. Its layers
are the shapes the claims need: two conv kernels (ATOMO's and PowerSGD's matrices) and a 1568x128 fc
matrix that dominates the bytes (top-k at 1% keeps ~2,000 of its 200,700 entries).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from compbench.base.values import KeyRange
from compbench.models.weights import load_npz_state_dict

KEY_RANGES = {"width": KeyRange(1, what="channels of the first convolution"),
              "hidden": KeyRange(1, what="units of the hidden fully connected layer")}


def cnn(num_classes: int = 10, image_size: int = 28, in_chans: int = 1, width: int = 16, hidden: int = 128,
        pretrained: str | None = None) -> nn.Module:
    if image_size % 4:
        raise ValueError(f"model=cnn: image_size={image_size} must be a multiple of 4 (two 2x2 poolings); "
                         f"use dataset.image_size=28 or 32")
    side = image_size // 4
    model = ChannelsLastSequential(
        nn.Conv2d(in_chans, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * width * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )
    if pretrained:
        load_npz_state_dict(model, pretrained, "cnn")
    return model


class ChannelsLastSequential(nn.Sequential):
    """Runs the convolutions on a channels-last input: oneDNN's CPU kernels for that layout take 44 ms
    instead of 66 ms for forward+backward of 64 images on one core (measured, width 32). Only the
    activations change layout; weights and gradients stay contiguous, so compressors and the
    state_dict's keys see the plain nn.Sequential."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(memory_format=torch.channels_last))
