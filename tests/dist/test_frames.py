"""comm=allgather's exchange is one collective on both engines: uneven payloads as frames (a header
of first dimensions; padded to a shared capacity on torch), even ones as they are; the bytes each
rank really sent come back with the payloads."""

import sys
from pathlib import Path

import pytest

from compbench.launch.processes import run_processes

pytestmark = pytest.mark.dist
CHECKS = str(Path(__file__).with_name("frame_checks.py"))


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_one_collective_per_exchange(engine):
    code, message = run_processes([sys.executable, CHECKS, engine], engine, 2, threads=1)
    assert code == 0, message
