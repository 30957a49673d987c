"""Schedulers through the real trainer and engines (2 gloo ranks on CPU)."""

import sys
from pathlib import Path

import pytest

from compbench.launch.processes import run_processes
from tests.helpers import results

pytestmark = pytest.mark.dist
RUNS = str(Path(__file__).with_name("scheduler_runs.py"))


# Suite time: torch's run in the slow tier (the engines' parity is tests/dist/test_engine_parity.py)
@pytest.mark.parametrize("engine", ["horovod", pytest.param("torch", marks=pytest.mark.slow)])
def test_every_scheduler_equals_layerwise_without_compression(tmp_path, engine):
    """compressor=none, 5 steps: layerwise (overlapped and not), mergecomp 0/1/3 groups and auto
    give layerwise's parameters to 1e-5 (scheduler_runs.py checks it on every rank). Then a
    compressed groups=auto run: its choice and search are in results.json."""
    code, message = run_processes([sys.executable, RUNS, engine, str(tmp_path)], engine, 2, threads=1)
    assert code == 0, message
    assert results(tmp_path / "mergecomp-auto")["scheduler"]["search_steps"] == 4  # two trials of 2 steps
    auto = results(tmp_path / "auto-topk")
    sched, summary = auto["scheduler"], auto["summary"]
    assert sched["name"] == "mergecomp" and sched["requested"] == "auto"
    assert len(sched["search"]) == 4 and sched["search_steps"] == 8 and sched["search_end_step"] == 9
    best = min(sched["search"], key=lambda c: c["ms"])
    assert (sched["groups"], sched["skew"]) == (best["groups"] or 4, best["skew"])
    assert sum(sched["group_tensors"]) == 4
    assert summary["bytes_sent_per_step"] < summary["bytes_dense_per_step"]  # compressed after step 0
    assert 0 <= summary["comm_exposed_ms"] <= summary["step_ms"]
