"""`model=mlp`: a plain MLP over the flattened input (the communication benchmark's 4096x4096 model).

No BatchNorm, so it is also the model for exact equivalence tests (2 ranks x b == 1 rank x 2b).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn as nn

from compbench.base.values import is_int, show
from compbench.models.weights import load_npz_state_dict


def mlp(num_classes: int = 10, image_size: int = 32, in_chans: int = 3, hidden: Sequence[int] = (256,),
        pretrained: str | None = None) -> nn.Module:
    # A width that is not a whole number >= 1 fails inside torch (a traceback), and 0 builds a model
    # whose output is a constant: refused here, which the parent's check runs on the meta device.
    if not all(is_int(h) and h >= 1 for h in hidden):
        raise ValueError(f"model.hidden={show(list(hidden))} must list the hidden layers' widths, whole "
                         "numbers >= 1, e.g. model.hidden=[256] (or [] for none)")
    dims = [in_chans * image_size * image_size, *hidden]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(dims[-1], num_classes))
    model = nn.Sequential(*layers)
    if pretrained:
        load_npz_state_dict(model, pretrained, "mlp")
    return model
