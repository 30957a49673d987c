"""`model=resnet20`: the CIFAR-style ResNet-20 of He et al. (2016), as used by DGC.

Three stages of 16/32/64 channels, three basic blocks each; shortcuts that change shape use the
paper's option A (stride-2 subsampling plus zero channel padding: no extra parameters), 0.27M params.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from compbench.models.weights import load_npz_state_dict


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x
        if self.stride != 1 or self.pad:
            shortcut = F.pad(x[:, :, :: self.stride, :: self.stride],
                             (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    def __init__(self, num_classes: int = 10, in_chans: int = 3, depth: int = 20) -> None:
        super().__init__()
        n = (depth - 2) // 6
        self.conv = nn.Conv2d(in_chans, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(_Block(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layers(F.relu(self.bn(self.conv(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def resnet20(num_classes: int = 10, image_size: int = 32, in_chans: int = 3,
             pretrained: str | None = None) -> nn.Module:
    model = ResNet20(num_classes, in_chans)
    if pretrained:
        load_npz_state_dict(model, pretrained, "resnet20")
    return model
