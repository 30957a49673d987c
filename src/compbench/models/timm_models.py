"""`model=vit_tiny|vit_b16|mixer_b16`: timm ViT and MLP-Mixer, with Google's .npz checkpoints.

ViT checkpoints (ViT-B_16.npz) load through timm's own npz loader (`VisionTransformer.load_pretrained`,
which also resamples position embeddings for another image size). timm ships no npz loader for
Mixer, so `weights.load_google_mixer_npz` maps Google's Mixer-B_16.npz names. In both, the
classifier head is loaded only when its size matches num_classes (fine-tuning starts a fresh head).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from compbench.models.weights import load_google_mixer_npz, load_google_vit_npz


def timm_model(arch: str, num_classes: int = 1000, image_size: int = 224, in_chans: int = 3,
               pretrained: str | None = None, **kwargs: Any) -> nn.Module:
    import timm

    model = timm.create_model(arch, pretrained=False, num_classes=num_classes, img_size=image_size,
                              in_chans=in_chans, **kwargs)
    if pretrained:
        if arch.startswith("vit"):
            load_google_vit_npz(model, pretrained, arch)
        else:
            load_google_mixer_npz(model, pretrained, arch)
    return model
