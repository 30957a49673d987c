"""`model=resnet18|resnet50|vgg16`: torchvision architectures (VGG-16 with batch norm).

Pretrained weights come from a local .npz of the state dict (`compbench.models.weights`), never a hub.
"""

from __future__ import annotations

import torch.nn as nn

from compbench.models.weights import load_npz_state_dict


def torchvision_model(arch: str, num_classes: int = 1000, image_size: int = 224, in_chans: int = 3,
                      pretrained: str | None = None) -> nn.Module:
    import torchvision

    if in_chans != 3:
        raise ValueError(f"model={arch}: torchvision models take 3 input channels, "
                         f"the dataset has {in_chans}")
    classifiers = torchvision.models.list_models(module=torchvision.models)  # not detection, video, ...
    if arch not in classifiers:
        near = [m for m in classifiers if m.startswith(arch[:3])][:6] or classifiers[:6]
        raise ValueError(f"model.arch={arch} is not one of torchvision's image classifiers; e.g. "
                         f"{', '.join(near)} (torchvision.models.list_models())")
    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes)
    if pretrained:
        load_npz_state_dict(model, pretrained, arch)
    return model
