"""`dataset=fashion_mnist|mnist`: the idx reader on small files made here (gzipped and plain), its
one-line errors, and the real Fashion-MNIST when Debian's package is installed."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from compbench.data import idx

DEBIAN_ROOT = Path("/usr/share/datasets/fashion-mnist")


def _write(path: Path, array: np.ndarray, gz: bool) -> None:
    magic = (0x0803 if array.ndim == 3 else 0x0801).to_bytes(4, "big")
    raw = magic + b"".join(int(d).to_bytes(4, "big") for d in array.shape) + array.astype(np.uint8).tobytes()
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)


def _root(tmp: Path, gz: bool = True, n_train: int = 50, n_test: int = 20) -> Path:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        _write(tmp / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), gz)
        _write(tmp / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10, gz)
    return tmp


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped", "plain"])
def test_reads_idx_files(tmp_path, gz):
    root = _root(tmp_path, gz)
    idx.check_root(str(root), "mnist")
    train, test = idx.idx_dataset(str(root), name="mnist")
    assert train.tensors[0].shape == (50, 1, 28, 28) and test.tensors[0].shape == (20, 1, 28, 28)
    assert sorted(train.tensors[1].tolist()) == sorted((np.arange(50) % 10).tolist())
    three, _ = idx.idx_dataset(str(root), name="mnist", channels=3, image_size=32, train_size=10)
    assert three.tensors[0].shape == (10, 3, 32, 32)


def test_subset_is_the_same_for_every_run(tmp_path):
    root = str(_root(tmp_path))
    a, _ = idx.idx_dataset(root, name="mnist", train_size=7)
    b, _ = idx.idx_dataset(root, name="mnist", train_size=7)
    assert a.tensors[1].tolist() == b.tensors[1].tolist()
    assert idx.train_size_of(train_size=7) == 7 and idx.train_size_of() == 60000


def test_missing_root_names_the_apt_command(tmp_path):
    with pytest.raises(ValueError, match="apt-get update && apt-get install -y dataset-fashion-mnist"):
        idx.check_root(str(tmp_path / "nope"), "fashion_mnist")
    with pytest.raises(ValueError, match="has no t10k-labels-idx1-ubyte"):
        root = _root(tmp_path)
        (root / "t10k-labels-idx1-ubyte.gz").unlink()
        idx.check_root(str(root), "fashion_mnist")


@pytest.mark.parametrize("damage,expected", [
    (lambda p: p.write_bytes(p.read_bytes()[:-10]), "is corrupt"),
    (lambda p: p.write_bytes(b"garbage"), "is corrupt"),
    (lambda p: p.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + (20).to_bytes(4, "big"))),
     "holds 0 data bytes"),
    (lambda p: p.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + bytes(8))), "bad header"),
], ids=["truncated", "not-gzip", "short", "wrong-magic"])
def test_a_damaged_file_is_one_error_line(tmp_path, damage, expected):
    root = _root(tmp_path)
    damage(root / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(ValueError, match=expected) as err:
        idx.check_root(str(root), "fashion_mnist")
    assert "\n" not in str(err.value) and "t10k-labels-idx1-ubyte.gz" in str(err.value)


@pytest.mark.skipif(not DEBIAN_ROOT.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_real_fashion_mnist():
    train, test = idx.idx_dataset(str(DEBIAN_ROOT))
    assert train.tensors[0].shape == (60000, 1, 28, 28) and test.tensors[0].shape == (10000, 1, 28, 28)
    assert train.tensors[1].bincount().tolist() == [6000] * 10
    assert abs(train.tensors[0].mean().item()) < 0.01 and abs(train.tensors[0].std().item() - 1) < 0.01
