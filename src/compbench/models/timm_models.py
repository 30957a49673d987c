"""`model=timm model.arch=NAME`: any timm model by its timm name; `model=vit_tiny|vit_b16|mixer_b16`:
timm's ViT and MLP-Mixer, with Google's .npz checkpoints.

How a timm name is reached. A config group's options are its conf files (conf/model/NAME.yaml, file
name = option = registry name), and Hydra refuses `model=X` without a file before compbench sees it,
so timm's 1300 names are not 1300 files: one option, `model=timm` (conf/model/timm.yaml), takes the
name as `model.arch`, as model=profiled takes any torchvision classifier. The arch of every model
option is also a name `model=` takes (compbench.compose.config.model_alias): `model=vit_base_patch16_224`
is model=vit_b16, and `model=mobilenetv3_small_050` is model=timm (its default arch).

The image size. Models whose timm config says `fixed_input_size` (ViT, DeiT, Mixer, Swin, ...) bake the
image size into their position embeddings, so they are built for the data's (`img_size`, which is
`dataset.image_size`); the others (ResNets, MobileNets, ConvNeXts, ...) pool globally and take any size
large enough. A fixed-size model that cannot be built for the data's size is refused here with the
size timm's `pretrained_cfg` gives it (`input_size`): the fix is `dataset.image_size=THAT`. Whether a
built model takes the data (too small an image for a CNN's strides) is the config check's one meta
forward (compbench.compose.config), in one place for every model.

ViT checkpoints (ViT-B_16.npz) load through timm's own npz loader (`VisionTransformer.load_pretrained`,
which also resamples position embeddings for another image size). timm ships no npz loader for
Mixer, so `weights.load_google_mixer_npz` maps Google's Mixer-B_16.npz names. In both, the
classifier head is loaded only when its size matches num_classes (fine-tuning starts a fresh head).
Other timm models take no checkpoint here (`model.pretrained` is refused for them).
"""

from __future__ import annotations

import difflib
from typing import Any

import torch.nn as nn

from compbench.models.weights import load_google_mixer_npz, load_google_vit_npz

# Errors timm's constructors raise for an image size a model cannot be built for.
_SIZE_ERRORS = (RuntimeError, AssertionError, ValueError, IndexError, TypeError, ZeroDivisionError)


def timm_model(arch: str, num_classes: int = 1000, image_size: int = 224, in_chans: int = 3,
               pretrained: str | None = None, **kwargs: Any) -> nn.Module:
    import timm

    native = _native_side(arch)
    fixed = native is not None and _fixed_input_size(arch)
    if pretrained and not arch.startswith(("vit", "mixer")):
        raise ValueError(f"model.pretrained={pretrained}: compbench reads Google's ViT and Mixer .npz "
                         f"checkpoints, and model.arch={arch} is neither; pass model.pretrained=null")
    if not fixed:
        model = timm.create_model(arch, pretrained=False, num_classes=num_classes, in_chans=in_chans,
                                  **kwargs)
    else:
        try:
            model = timm.create_model(arch, pretrained=False, num_classes=num_classes, img_size=image_size,
                                      in_chans=in_chans, **kwargs)
        except _SIZE_ERRORS as e:
            if image_size == native:
                raise
            raise ValueError(_size_refusal(arch, native, image_size, e)) from None
    if pretrained:
        if arch.startswith("vit"):
            load_google_vit_npz(model, pretrained, arch)
        else:
            load_google_mixer_npz(model, pretrained, arch)
    return model


def is_timm_name(name: str) -> bool:
    """Whether timm builds a model of this name (compbench.compose.config's `model=NAME`)."""
    import timm

    return timm.is_model(name)


def _native_side(arch: str) -> int | None:
    """The image side timm's pretrained config gives `arch` (224 for most), None where it has none;
    ValueError (naming the likeliest names) for a name timm does not know."""
    import timm
    from timm.models import get_pretrained_cfg

    if not isinstance(arch, str) or not timm.is_model(arch):
        close = difflib.get_close_matches(str(arch), timm.list_models(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"model.arch={arch} is not a timm model; {hint}timm.list_models('*PATTERN*') lists "
                         "its names, e.g. model=timm model.arch=efficientnet_b0")
    cfg = get_pretrained_cfg(arch)  # None for an arch registered without one
    return int(cfg.input_size[-1]) if cfg is not None and cfg.input_size else None


def _fixed_input_size(arch: str) -> bool:
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(arch)
    return cfg is not None and bool(cfg.fixed_input_size)


def _size_refusal(arch: str, native: int | None, side: int, error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
    return (f"model.arch={arch} is built for one image size and cannot take the data's {side}x{side} "
            f"images ({first}); pass dataset.image_size={native} (timm's input_size for it)")
