"""`model=cnn`: a small LeNet-style convolutional net for 28x28 images (Fashion-MNIST, MNIST).

conv 3x3 (32) -> max-pool -> conv 3x3 (64) -> max-pool -> fc 128 -> fc classes, ReLU, no BatchNorm:
0.42M parameters, ~4 MFLOP-MACs per 28x28 image (resnet20 at 28x28: ~30M). It exists for the claims
suite's budget: on 2 CPU cores resnet20 trains ~180 samples/s, too slow to take 40+ runs past 90%
on Fashion-MNIST in 90 minutes; this net reaches 90% in a few epochs. Its layers are the shapes the
claims need: two conv kernels (ATOMO's and PowerSGD's matrices) and a 3136x128 fc matrix that
dominates the bytes (top-k at 1% keeps ~4,000 of its 401,000 entries).
"""

from __future__ import annotations

import torch.nn as nn

from compbench.models.weights import load_npz_state_dict


def cnn(num_classes: int = 10, image_size: int = 28, in_chans: int = 1, width: int = 32, hidden: int = 128,
        pretrained: str | None = None) -> nn.Module:
    if image_size % 4:
        raise ValueError(f"model=cnn: image_size={image_size} must be a multiple of 4 (two 2x2 poolings); "
                         f"use dataset.image_size=28 or 32")
    side = image_size // 4
    model = nn.Sequential(
        nn.Conv2d(in_chans, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * width * side * side, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )
    if pretrained:
        load_npz_state_dict(model, pretrained, "cnn")
    return model
