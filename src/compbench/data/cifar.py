"""`dataset=cifar10|cifar100`: torchvision's CIFAR from a local root in the standard python format
(cifar-10-batches-py / cifar-100-python). Never downloaded at run time."""

from __future__ import annotations

from pathlib import Path

_FOLDERS = {10: "cifar-10-batches-py", 100: "cifar-100-python"}
_MEAN, _STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def check_root(root: str | None, num_classes: int) -> None:
    folder = _FOLDERS[num_classes]
    if not root or not (Path(root) / folder).is_dir():
        raise ValueError(
            f"dataset=cifar{num_classes}: no {folder}/ under dataset.root={root}; "
            f"download and unpack it elsewhere, then pass dataset.root=DIR"
        )


def cifar(root: str | None = None, num_classes: int = 10, image_size: int = 32, augment: bool = True,
          **_: object):
    import torchvision
    import torchvision.transforms as T

    check_root(root, num_classes)
    cls = torchvision.datasets.CIFAR10 if num_classes == 10 else torchvision.datasets.CIFAR100
    norm = [T.ToTensor(), T.Normalize(_MEAN, _STD)]
    resize = [T.Resize(image_size)] if image_size != 32 else []
    train_tf = T.Compose(resize + ([T.RandomCrop(image_size, padding=4), T.RandomHorizontalFlip()]
                                   if augment else []) + norm)
    test_tf = T.Compose(resize + norm)
    return (cls(root, train=True, transform=train_tf, download=False),
            cls(root, train=False, transform=test_tf, download=False))
