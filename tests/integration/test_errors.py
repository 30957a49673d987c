"""User mistakes: one line naming the fix, exit code 2, no traceback, no output directory left."""

import numpy as np
import pytest

from tests.helpers import compbench

CASES = [
    (["compressor=nope"], "unknown compressor=nope; choose one of:"),
    (["model=resnet21"], "unknown model=resnet21; choose one of:"),
    (["ratio=0"], "ratio=0 is outside (0, 1]"),
    (["ratio=1.5"], "ratio=1.5 is outside (0, 1]"),
    (["engine.np=0"], "engine.np=0 must be an integer >= 1"),
    (["dataset=cifar10", "dataset.root=/nonexistent"],
     "no cifar-10-batches-py/ under dataset.root=/nonexistent"),
    (["dataset=fashion_mnist", "dataset.root=/nonexistent"],
     "no folder dataset.root=/nonexistent; apt-get update && apt-get install -y dataset-fashion-mnist"),
    (["model.pretrained=/nonexistent.npz"], "pretrained file /nonexistent.npz does not exist"),
    (["no_such_setting=1"], "Could not override 'no_such_setting'"),
    (["flush_denormal=maybe"], "flush_denormal=maybe must be true or false"),
]


def _check(tmp_path, args, expected):
    proc = compbench("train", *args, f"outputs_root={tmp_path / 'outputs'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("args,expected", CASES, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_user_error(tmp_path, args, expected):
    _check(tmp_path, args, expected)


def test_mismatched_pretrained_file(tmp_path):
    bad = tmp_path / "other.npz"
    np.savez(bad, **{"fc.weight": np.zeros((3, 3), dtype=np.float32)})
    _check(tmp_path, [f"model.pretrained={bad}"], "does not match this model")


def test_incompatible_compressor_and_comm(tmp_path):
    _check(tmp_path, ["compressor=topk", "comm=allreduce"],
           "compressor=topk sends rank-dependent indices; use comm=allgather or comm=ps")


def test_unknown_command(tmp_path):
    proc = compbench("trian", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown command 'trian'" in proc.stderr
