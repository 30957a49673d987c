"""Pretrained weights from local .npz files only (no hub downloads at run time).

Three formats:
- a state dict saved with `numpy.savez(path, **{k: v.numpy() for k, v in model.state_dict().items()})`
  (ResNet, VGG, MLP);
- Google's ViT checkpoints (ViT-B_16.npz), read by timm's own loader;
- Google's MLP-Mixer checkpoints (Mixer-B_16.npz), mapped here (timm has no npz loader for Mixer).
The `export_*` functions write the Google formats, so tests (and users converting weights) can make
such files from a torch model.
Any mismatch is a ValueError naming the file and the model.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn as nn

# A timm MlpMixer or VisionTransformer, whose submodules these functions reach by name: typed Any,
# since nn.Module's __getattr__ is typed `Tensor | Module` (neither callable nor indexable for mypy).
TimmModel = Any

# What a damaged archive raises when an array is read (np.load opens the zip lazily): a bad CRC,
# a truncated member, a bad zlib stream, a pickled object array (allow_pickle=False).
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError)


def _unreadable(path: str, model_name: str, detail: object) -> ValueError:
    return ValueError(f"model={model_name}: pretrained file {path} is not a readable .npz ({detail}); "
                      f"pass an intact numpy.savez file or pretrained=null")


def _open(path: str, model_name: str) -> dict[str, np.ndarray]:
    """Every array of the file, read and type-checked here: a damaged or non-numeric file is the
    user's input, refused in the parent's config check with one line."""
    if not Path(path).is_file():
        raise ValueError(f"model={model_name}: pretrained file {path} does not exist; "
                         f"pass a local .npz or pretrained=null")
    try:
        with np.load(path) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except _READ_ERRORS as e:
        raise _unreadable(path, model_name, f"{type(e).__name__}: {e}".splitlines()[0]) from None
    for k, a in arrays.items():
        if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
            raise _unreadable(path, model_name, f"array {k} has dtype {a.dtype}, not numbers")
    return arrays


def _mismatch(path: str, model_name: str, detail: object) -> ValueError:
    return ValueError(
        f"model={model_name}: pretrained file {path} does not match this model ({detail}); "
        f"pass a checkpoint of this architecture or pretrained=null"
    )


def load_npz_state_dict(model: nn.Module, path: str, model_name: str) -> None:
    state = {k: torch.from_numpy(a) for k, a in _open(path, model_name).items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise _mismatch(path, model_name, str(e).splitlines()[0]) from None


def load_google_vit_npz(model: TimmModel, path: str, model_name: str) -> None:
    _open(path, model_name)
    try:
        model.load_pretrained(path)  # timm's npz loader (resamples position embeddings)
    except (KeyError, RuntimeError, ValueError, TypeError) as e:
        raise _mismatch(path, model_name, f"{type(e).__name__}: {e}".splitlines()[0]) from None


def _hwio(w: torch.Tensor) -> np.ndarray:  # torch conv OIHW -> flax HWIO
    return w.detach().permute(2, 3, 1, 0).numpy()


def _dense(w: torch.Tensor) -> np.ndarray:  # torch Linear (out, in) -> flax kernel (in, out)
    return w.detach().T.numpy()


def _mixer_pairs(model: TimmModel) -> list[tuple[str, torch.Tensor, str]]:
    """(google name, torch tensor, kind) for every parameter of a timm MlpMixer."""
    pairs = [("stem/kernel", model.stem.proj.weight, "conv"), ("stem/bias", model.stem.proj.bias, "vec")]
    for i, b in enumerate(model.blocks):
        p = f"MixerBlock_{i}/"
        pairs += [(p + "LayerNorm_0/scale", b.norm1.weight, "vec"),
                  (p + "LayerNorm_0/bias", b.norm1.bias, "vec"),
                  (p + "LayerNorm_1/scale", b.norm2.weight, "vec"),
                  (p + "LayerNorm_1/bias", b.norm2.bias, "vec")]
        for gname, mlp in (("token_mixing", b.mlp_tokens), ("channel_mixing", b.mlp_channels)):
            for r, fc in enumerate((mlp.fc1, mlp.fc2)):
                pairs += [(f"{p}{gname}/Dense_{r}/kernel", fc.weight, "dense"),
                          (f"{p}{gname}/Dense_{r}/bias", fc.bias, "vec")]
    pairs += [("pre_head_layer_norm/scale", model.norm.weight, "vec"),
              ("pre_head_layer_norm/bias", model.norm.bias, "vec")]
    return pairs


def load_google_mixer_npz(model: TimmModel, path: str, model_name: str) -> None:
    w = _open(path, model_name)
    with torch.no_grad():
        for gname, t, kind in _mixer_pairs(model):
            if gname not in w:
                raise _mismatch(path, model_name, f"missing {gname}")
            a = torch.from_numpy(w[gname])
            a = a.permute(3, 2, 0, 1) if kind == "conv" else a.T if kind == "dense" else a
            if a.shape != t.shape:
                raise _mismatch(path, model_name,
                                f"{gname} has shape {tuple(a.shape)}, the model {tuple(t.shape)}")
            t.copy_(a)
        head = model.head  # nn.Identity when the model has no classifier (num_classes=0)
        if (isinstance(head, nn.Linear) and "head/bias" in w and "head/kernel" in w
                and w["head/bias"].shape[-1] == head.out_features):
            head.weight.copy_(torch.from_numpy(w["head/kernel"]).T)
            head.bias.copy_(torch.from_numpy(w["head/bias"]))


def export_google_mixer_npz(model: TimmModel, path: str) -> None:
    out = {g: (_hwio(t) if k == "conv" else _dense(t) if k == "dense" else t.detach().numpy())
           for g, t, k in _mixer_pairs(model)}
    out["head/kernel"], out["head/bias"] = _dense(model.head.weight), model.head.bias.detach().numpy()
    np.savez(path, **cast(dict[str, Any], out))  # numpy's stub takes the arrays' names for allow_pickle


def export_google_vit_npz(model: TimmModel, path: str) -> None:
    """Write a timm VisionTransformer in the original Google ViT npz layout (ViT-B_16.npz)."""
    d = model.embed_dim
    out = {
        "embedding/kernel": _hwio(model.patch_embed.proj.weight),
        "embedding/bias": model.patch_embed.proj.bias.detach().numpy(),
        "cls": model.cls_token.detach().numpy(),
        "Transformer/posembed_input/pos_embedding": model.pos_embed.detach().numpy(),
        "Transformer/encoder_norm/scale": model.norm.weight.detach().numpy(),
        "Transformer/encoder_norm/bias": model.norm.bias.detach().numpy(),
        "head/kernel": _dense(model.head.weight),
        "head/bias": model.head.bias.detach().numpy(),
    }
    for i, b in enumerate(model.blocks):
        p, mha = (f"Transformer/encoderblock_{i}/",
                  f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/")
        heads = b.attn.num_heads
        qkv_w, qkv_b = b.attn.qkv.weight.detach(), b.attn.qkv.bias.detach()
        for j, n in enumerate(("query", "key", "value")):
            out[f"{mha}{n}/kernel"] = qkv_w[j * d : (j + 1) * d].T.reshape(d, heads, d // heads).numpy()
            out[f"{mha}{n}/bias"] = qkv_b[j * d : (j + 1) * d].reshape(heads, d // heads).numpy()
        out[f"{mha}out/kernel"] = (b.attn.proj.weight.detach().reshape(d, heads, d // heads)
                                   .permute(1, 2, 0).numpy())
        out[f"{mha}out/bias"] = b.attn.proj.bias.detach().numpy()
        for ln, norm in (("LayerNorm_0", b.norm1), ("LayerNorm_2", b.norm2)):
            out[f"{p}{ln}/scale"], out[f"{p}{ln}/bias"] = (norm.weight.detach().numpy(),
                                                           norm.bias.detach().numpy())
        for r, fc in enumerate((b.mlp.fc1, b.mlp.fc2)):
            out[f"{p}MlpBlock_3/Dense_{r}/kernel"], out[f"{p}MlpBlock_3/Dense_{r}/bias"] = (
                _dense(fc.weight), fc.bias.detach().numpy())
    np.savez(path, **out)
