"""`model=profiled`: a real network's gradients without its compute, for communication studies.

The model has one parameter per parameter of the named torchvision architecture (ResNet-50: 161
tensors, 25.6M elements, same shapes and order) and a backward pass that, layer by layer from the
last to the first, sleeps that layer's share of `backward_ms` (its share of the architecture's
multiply-adds at 224x224; BatchNorm and bias tensors get a floor of 1e-4 of it) and hands the
parameter a fixed gradient (Gaussian, drawn once: compressors see realistic values). The sleep
frees the core, so 4 to 8 workers on 2 cores measure communication and compression, not a fight
over compute; gradient hooks fire in backward order at the right times, so overlap works as with the
real network. Forward is a linear head on the input (loss and accuracy exist but mean nothing).
"""

from __future__ import annotations

import time
from typing import cast

import torch
import torch.nn as nn
from torch import Tensor

_FLOOR_SHARE = 1e-4


def _layer_costs(arch: nn.Module, image_size: int) -> dict[str, float]:
    """Multiply-adds per parameter tensor (a conv's or linear's weight; its bias and BN get 0)."""
    costs: dict[str, float] = {}

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> None:
            w = cast(Tensor, module.weight)
            per_out = w[0].numel() if isinstance(module, nn.Conv2d) else w.shape[1]
            costs[f"{name}.weight"] = float(out.numel() * per_out)
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in arch.named_modules()
               if isinstance(m, nn.Conv2d | nn.Linear)]
    with torch.no_grad():
        arch.to("meta")(torch.empty(1, 3, image_size, image_size, device="meta"))
    for h in handles:
        h.remove()
    return costs


class _Layer(torch.autograd.Function):
    """Identity on the activation; in backward: sleep, then give the weight its fixed gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, grad: Tensor, sleep_s: float) -> Tensor:
        ctx.grad, ctx.sleep_s = grad, sleep_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, gy: Tensor):
        time.sleep(ctx.sleep_s)
        # Autograd copies (or adds) it into weight.grad: the model keeps a reference, so it is
        # never taken over and modified in place.
        return gy, ctx.grad, None, None


class Profiled(nn.Module):
    def __init__(self, arch: str = "resnet50", backward_ms: float = 100.0, num_classes: int = 10,
                 image_size: int = 32, in_chans: int = 3) -> None:
        import torchvision

        super().__init__()
        reference = getattr(torchvision.models, arch)(weights=None)
        names = [n for n, _ in reference.named_parameters()]
        costs = _layer_costs(reference, 224)
        total = sum(costs.values())
        # Shares of the multiply-adds, with a floor (BN, biases), normalized to sum to backward_ms.
        shares = [max(_FLOOR_SHARE, costs.get(n, 0.0) / total) for n in names]
        self.sleep_s = [backward_ms / 1e3 * share / sum(shares) for share in shares]
        shapes = [p.shape for p in reference.parameters()]
        self.weights = nn.ParameterList([nn.Parameter(torch.zeros(s)) for s in shapes])
        self.grads = [torch.randn(s) * 1e-2 for s in shapes]  # seeded by the trainer: same on every rank
        self.head = nn.Linear(in_chans * image_size * image_size, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = x.flatten(1)
        for w, g, s in zip(self.weights, self.grads, self.sleep_s, strict=True):
            h = _Layer.apply(h, w, g, s)
        return self.head(h)


def profiled(arch: str = "resnet50", backward_ms: float = 100.0, num_classes: int = 10, image_size: int = 32,
             in_chans: int = 3) -> nn.Module:
    return Profiled(arch, backward_ms, num_classes, image_size, in_chans)
