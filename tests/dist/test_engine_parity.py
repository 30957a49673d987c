"""The same seed gives the same parameters on Horovod and torch.distributed, for every compressor
and every valid communicator (the engines move bytes; they must not change the math)."""

import sys
from pathlib import Path

import pytest
import torch

from compbench.launch.processes import run_processes

pytestmark = pytest.mark.dist
SCRIPT = str(Path(__file__).with_name("train_all_compressors.py"))


def test_horovod_and_torch_agree_for_every_compressor(tmp_path):
    results = {}
    for engine in ("horovod", "torch"):
        out = tmp_path / f"{engine}.pt"
        code, message = run_processes([sys.executable, SCRIPT, engine, str(out)], engine, 2, threads=1)
        assert code == 0, message
        results[engine] = torch.load(out)
    assert results["horovod"].keys() == results["torch"].keys()
    assert len(results["horovod"]) >= 30  # every compressor x valid communicator
    for combo, hv in results["horovod"].items():
        th = results["torch"][combo]
        for k in hv:
            assert torch.isfinite(hv[k]).all(), combo
            torch.testing.assert_close(hv[k], th[k], atol=1e-5, rtol=1e-5, msg=f"{combo} {k}")
