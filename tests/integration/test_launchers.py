"""compbench joins jobs started by horovodrun and torchrun (the multi-machine path)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY, results

pytestmark = pytest.mark.dist
BIN = Path(sys.executable).parent


def _run(cmd: list[str], tmp_path: Path) -> Path:
    out = tmp_path / "run"
    proc = subprocess.run([*cmd, *TINY, "max_steps=3", "epochs=1", f"output_dir={out}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


@pytest.mark.skipif(shutil.which("horovodrun", path=str(BIN)) is None, reason="horovodrun not installed")
def test_horovodrun(tmp_path):
    out = _run([str(BIN / "horovodrun"), "-np", "2", "--gloo", str(BIN / "compbench"), "train"], tmp_path)
    env = results(out)["environment"]
    assert env["engine"] == "horovod" and env["world_size"] == 2


def test_torchrun(tmp_path):
    out = _run([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "compbench", "train",
                "engine=torch"], tmp_path)
    env = results(out)["environment"]
    assert env["engine"] == "torch" and env["world_size"] == 2
