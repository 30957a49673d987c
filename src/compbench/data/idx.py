"""`dataset=fashion_mnist|mnist`: the standard idx files (LeCun's format) from a local root.

The root holds `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and
`t10k-labels-idx1-ubyte`, each gzipped (`.gz`, as published and as Debian ships them) or plain.
`dataset=fashion_mnist` defaults to Debian's `dataset-fashion-mnist` package
(/usr/share/datasets/fashion-mnist/); `dataset=mnist` has no default root (pass dataset.root=DIR).
Never downloaded at run time.

Image size and normalization (a decision): images stay 28x28 and 1 channel (`channels: 1`), scaled
to [0, 1] and normalized with the training set's mean and std. The models compbench trains on CPU
take the channel count from `dataset.channels` (resnet20, mlp, timm): resizing to 32x32 and
repeating to 3 channels, as digits does for its 8x8 images, would cost 4x the compute and memory for
no information, and 28 -> 7x7 after resnet20's two stride-2 stages is fine for its global pooling.
`channels: 3` repeats the gray channel (torchvision's models take 3 channels only) and
`image_size: 32` resizes (bilinear). No augmentation: the set is a TensorDataset held in memory
(60,000 x 784 floats = 188 MB), indexed directly by the loader.

`train_size` / `test_size` take the first N samples of a fixed permutation (seeded by `seed`, the
same for every run and world size): the claims suite trains on a subset to fit its time budget.
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from compbench.base.values import show
from compbench.data import IMAGE_SIZE, SEED, KeyRange

TASK = "classification"
_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
          "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
_SIZES = {"train": 60000, "test": 10000}
# Mean and std of the training pixels in [0, 1] (the usual published figures).
_STATS = {"fashion_mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}
# How a user gets the files: the Debian package for Fashion-MNIST, their own copy for MNIST.
_HOW = {"fashion_mnist": "apt-get update && apt-get install -y dataset-fashion-mnist",
        "mnist": "put the four MNIST idx files (.gz or plain) in a folder"}
_MAGIC = {3: 0x00000803, 1: 0x00000801}  # unsigned bytes, 3 or 1 dimensions
KEY_RANGES = {"num_classes": KeyRange(choices=(10,), what="the labels are 0-9"), "image_size": IMAGE_SIZE,
              "channels": KeyRange(choices=(1, 3), what="3 repeats the gray channel"),
              "train_size": KeyRange(1, null="all samples"), "test_size": KeyRange(1, null="all samples"),
              "seed": SEED}


def check_root(root: str | None, name: str = "fashion_mnist") -> None:
    """The parent's check (compbench.compose.config): the four files exist and parse, with matching counts."""
    folder = _check_folder(root, name)
    for split in ("train", "test"):
        _load_split(str(folder), split, name)


def _check_folder(root: str | None, name: str) -> Path:
    if not root or not Path(root).is_dir():
        raise ValueError(f"dataset={name}: no folder dataset.root={root}; "
                         f"{_HOW[name]}, or pass dataset.root=DIR")
    for base in _FILES.values():
        if _path(Path(root), base) is None:
            raise ValueError(f"dataset={name}: dataset.root={root} has no {base}(.gz); "
                             f"{_HOW[name]}, or pass dataset.root=DIR")
    return Path(root)


def _path(folder: Path, base: str) -> Path | None:
    for candidate in (folder / f"{base}.gz", folder / base):
        if candidate.is_file():
            return candidate
    return None


def read_idx(path: Path, dims: int, what: str = "") -> np.ndarray:
    """One idx file (gzipped or plain) as a uint8 array; ValueError naming the file if it is not one
    (`what` prefixes the message: the dataset and its root)."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # truncated, not gzip (BadGzipFile is an OSError), damaged
        raise ValueError(f"{what}{path.name} is corrupt ({e}); install or copy the file again") from None
    header = 4 + 4 * dims
    if len(raw) < header or int.from_bytes(raw[:4], "big") != _MAGIC[dims]:
        raise ValueError(f"{what}{path.name} is not an idx file of {dims}-D unsigned bytes (bad header); "
                         f"install or copy the file again")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    if len(raw) != header + int(np.prod(shape)):
        raise ValueError(f"{what}{path.name} holds {len(raw) - header} data bytes, its header says {shape} "
                         f"(truncated?); install or copy the file again")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


@functools.lru_cache(maxsize=4)
def _load_cached(folder: str, split: str, name: str, stamp: tuple) -> tuple[np.ndarray, np.ndarray]:
    prefix = "train" if split == "train" else "test"
    # Both exist: _check_folder found them before anything is loaded.
    images_path = cast(Path, _path(Path(folder), _FILES[f"{prefix}_images"]))
    labels_path = cast(Path, _path(Path(folder), _FILES[f"{prefix}_labels"]))
    what = f"dataset={name}: dataset.root={folder}: "
    images, labels = read_idx(images_path, 3, what), read_idx(labels_path, 1, what)
    if len(images) != len(labels) or len(images) == 0:
        raise ValueError(f"{what}{images_path.name} has {len(images)} images but "
                         f"{labels_path.name} has {len(labels)} labels; install or copy the files again")
    if labels.max() >= 10:
        raise ValueError(f"{what}{labels_path.name} has label {labels.max()} (expected 0-9); "
                         f"install or copy the file again")
    return images, labels


def _load_split(folder: str, split: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Parsed once per process and file version (the parent checks every job of a sweep)."""
    prefix = "train" if split == "train" else "test"
    paths = [cast(Path, _path(Path(folder), _FILES[f"{prefix}_{kind}"])) for kind in ("images", "labels")]
    stamp = tuple((s.st_size, s.st_mtime_ns) for s in (os.stat(p) for p in paths))
    return _load_cached(folder, split, name, stamp)


def _subset(n: int, size: int | None, seed: int) -> torch.Tensor:
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[: min(size, n)] if size else order


def _tensors(images: np.ndarray, labels: np.ndarray, idx: torch.Tensor, name: str, image_size: int,
             channels: int) -> TensorDataset:
    mean, std = _STATS[name]
    x = torch.from_numpy(images[idx.numpy()]).float().div_(255.0).unsqueeze(1)
    if image_size != x.shape[-1]:
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    x = ((x - mean) / std).repeat(1, channels, 1, 1).contiguous()
    return TensorDataset(x, torch.from_numpy(labels[idx.numpy()].astype(np.int64)))


def idx_dataset(root: str | None = None, name: str = "fashion_mnist", image_size: int = 28,
                channels: int = 1, train_size: int | None = None, test_size: int | None = None,
                seed: int = 0, **_: object):
    if name not in _STATS:
        raise ValueError(f"dataset.name={show(name)} is unknown; use one of {', '.join(_STATS)}")
    if channels not in (1, 3):
        raise ValueError(f"dataset.channels={channels} must be 1 or 3 (3 repeats the gray channel)")
    folder = str(_check_folder(root, name))
    (xtr, ytr), (xte, yte) = _load_split(folder, "train", name), _load_split(folder, "test", name)
    train = _tensors(xtr, ytr, _subset(len(ytr), train_size, seed), name, image_size, channels)
    test = _tensors(xte, yte, _subset(len(yte), test_size, seed + 1), name, image_size, channels)
    return train, test


def train_size_of(root: str | None = None, train_size: int | None = None, **_: object) -> int:
    """Training samples, known without loading (the parent's batch-size check): the count in the
    root's image file header (a root may hold fewer than the published 60000), else 60000 (a missing
    or damaged file is check_root's to report). train_size is in KEY_RANGES (checked before)."""
    n = _SIZES["train"]
    path = _path(Path(root), _FILES["train_images"]) if root and Path(root).is_dir() else None
    if path is not None:
        try:
            with (gzip.open(path) if path.suffix == ".gz" else open(path, "rb")) as f:
                header = f.read(8)
            if len(header) == 8 and int.from_bytes(header[:4], "big") == _MAGIC[3]:
                n = int.from_bytes(header[4:], "big")
        except (OSError, EOFError, zlib.error):
            pass  # check_root names the damaged file
    return min(train_size, n) if train_size else n
