"""Both engines pass the same 2-rank checks on CPU (gloo): allreduce, uneven allgather, alltoall,
broadcast, async handles. Ranks start through compbench's own launcher (no fixed ports)."""

import sys
from pathlib import Path

import pytest

from compbench.launch.processes import run_processes

pytestmark = pytest.mark.dist
CHECKS = str(Path(__file__).with_name("engine_checks.py"))


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_engine_collectives(engine):
    code, message = run_processes([sys.executable, CHECKS, engine], engine, 2, threads=1)
    assert code == 0, message


PS_CHECKS = str(Path(__file__).with_name("ps_checks.py"))


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_ps_averages_summable_payloads_exactly(engine):
    code, message = run_processes([sys.executable, PS_CHECKS, engine], engine, 2, threads=1)
    assert code == 0, message


LISTENING_CHECK = str(Path(__file__).with_name("listening_check.py"))


@pytest.mark.dist
@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_a_local_job_listens_on_the_loopback_only(engine):
    code, message = run_processes([sys.executable, LISTENING_CHECK, engine], engine, 2, threads=1)
    assert code == 0, message
