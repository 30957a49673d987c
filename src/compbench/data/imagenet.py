"""`dataset=imagenet`: ImageFolder over a local root with train/ and val/ class folders."""

from __future__ import annotations

from pathlib import Path

_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def check_root(root: str | None) -> None:
    if not root or not (Path(root) / "train").is_dir() or not (Path(root) / "val").is_dir():
        raise ValueError(
            f"dataset=imagenet: dataset.root={root} must hold train/ and val/ class folders; "
            f"pass dataset.root=DIR"
        )


def imagenet(root: str | None = None, image_size: int = 224, **_: object):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    check_root(root)
    norm = [T.ToTensor(), T.Normalize(_MEAN, _STD)]
    train_tf = T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), *norm])
    test_tf = T.Compose([T.Resize(int(image_size * 256 / 224)), T.CenterCrop(image_size), *norm])
    return ImageFolder(str(Path(root) / "train"), train_tf), ImageFolder(str(Path(root) / "val"), test_tf)
