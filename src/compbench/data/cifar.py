"""`dataset=cifar10|cifar100`: torchvision's CIFAR from a local root in the standard python format
(cifar-10-batches-py / cifar-100-python). Never downloaded at run time."""

from __future__ import annotations

from pathlib import Path

from compbench.data import IMAGE_SIZE, KeyRange

TASK = "classification"
_FOLDERS = {10: "cifar-10-batches-py", 100: "cifar-100-python"}
_MEAN, _STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
KEY_RANGES = {"num_classes": KeyRange(choices=(10, 100), what="dataset=cifar10 or dataset=cifar100"),
              "image_size": IMAGE_SIZE, "channels": KeyRange(choices=(3,), what="CIFAR images are RGB")}


def check_root(root: str | None, num_classes: int) -> None:
    """The parent's check (compbench.compose.config): the folder and every file's checksum."""
    _check_folder(root, num_classes)
    _check_files(Path(str(root)) / _FOLDERS[num_classes], num_classes)


def _check_folder(root: str | None, num_classes: int) -> None:
    folder = _FOLDERS[num_classes]
    if not root or not (Path(root) / folder).is_dir():
        raise ValueError(
            f"dataset=cifar{num_classes}: no {folder}/ under dataset.root={root}; "
            f"download and unpack it elsewhere, then pass dataset.root=DIR"
        )


def _check_files(folder: Path, num_classes: int) -> None:
    """Every batch file must be the published one (torchvision's md5 list): a truncated download
    or a stray file would otherwise fail in every worker with an unpickling traceback."""
    import torchvision.datasets as D
    from torchvision.datasets.utils import check_integrity

    cls = D.CIFAR10 if num_classes == 10 else D.CIFAR100
    for name, md5 in [*cls.train_list, *cls.test_list, (cls.meta["filename"], cls.meta["md5"])]:
        if not check_integrity(str(folder / name), md5):
            raise ValueError(
                f"dataset=cifar{num_classes}: dataset.root={folder.parent} has a missing or corrupt "
                f"{folder.name}/{name} (md5 differs); unpack the official archive there again"
            )


def train_size_of(num_classes: int = 10, **_: object) -> int:
    """Training samples, known without loading (the parent's batch-size check)."""
    return 50000


def cifar(root: str | None = None, num_classes: int = 10, image_size: int = 32, augment: bool = True,
          **_: object):
    import torchvision
    import torchvision.transforms as T

    _check_folder(root, num_classes)  # torchvision checks the md5s itself
    cls = torchvision.datasets.CIFAR10 if num_classes == 10 else torchvision.datasets.CIFAR100
    norm = [T.ToTensor(), T.Normalize(_MEAN, _STD)]
    resize = [T.Resize(image_size)] if image_size != 32 else []
    train_tf = T.Compose(resize + ([T.RandomCrop(image_size, padding=4), T.RandomHorizontalFlip()]
                                   if augment else []) + norm)
    test_tf = T.Compose(resize + norm)
    return (cls(root, train=True, transform=train_tf, download=False),
            cls(root, train=False, transform=test_tf, download=False))
