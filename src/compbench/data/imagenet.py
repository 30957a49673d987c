"""`dataset=imagenet`: ImageFolder over a local root with train/ and val/ class folders."""

from __future__ import annotations

import os
from pathlib import Path
from typing import cast

from compbench.data import IMAGE_SIZE, KeyRange

TASK = "classification"
_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
KEY_RANGES = {"num_classes": KeyRange(1, 100_000), "image_size": IMAGE_SIZE,
              "channels": KeyRange(choices=(3,), what="ImageFolder loads RGB images")}


def check_root(root: str | None) -> None:
    if not root or not (Path(root) / "train").is_dir() or not (Path(root) / "val").is_dir():
        raise ValueError(
            f"dataset=imagenet: dataset.root={root} must hold train/ and val/ class folders; "
            f"pass dataset.root=DIR"
        )
    for split in ("train", "val"):
        problem = _class_folder_problem(Path(root) / split)
        if problem:
            raise ValueError(f"dataset=imagenet: dataset.root={root}: {split}/ {problem}; "
                             f"pass a root whose train/ and val/ hold one folder of images per class")


def train_size_of(**_: object) -> None:
    """Counting 1.3M files is not cheap: the worker checks the batch size after loading."""
    return None


def _class_folder_problem(split: Path) -> str | None:
    """What ImageFolder would refuse, found with one directory scan per class (it stops at the
    first image of each class: a full ImageNet tree costs ~1000 small scans, not 1.3M stats)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    classes = sorted((e for e in os.scandir(split) if e.is_dir()), key=lambda e: e.name)
    if not classes:
        return "has no class folders"
    for c in classes:
        if not any(f.lower().endswith(IMG_EXTENSIONS) for _, _, files in os.walk(c.path) for f in files):
            return f"class folder {c.name}/ has no images ({', '.join(IMG_EXTENSIONS[:3])}, ...)"
    return None


def imagenet(root: str | None = None, image_size: int = 224, **_: object):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    check_root(root)
    norm = [T.ToTensor(), T.Normalize(_MEAN, _STD)]
    train_tf = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), *norm])
    test_tf = T.Compose([T.Resize(int(image_size * 256 / 224)), T.CenterCrop(image_size), *norm])
    folder = Path(cast(str, root))  # check_root refused None
    return ImageFolder(str(folder / "train"), train_tf), ImageFolder(str(folder / "val"), test_tf)
