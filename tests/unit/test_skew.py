"""compbench.train.skew: rank 0's wait at each step's exchange for the last rank to get there, from the
ranks' arrivals on the machine's shared clock; and a straggler's job shows it as most of rank 0's
exposed communication."""

from __future__ import annotations

import json
import math

import pytest

from compbench.train import machine, skew
from tests.helpers import TINY, compbench
from tests.threaded_engine import ThreadWorld


def test_rank_0_waits_for_the_latest_arrival_at_most_its_exposed_time():
    arrivals = {0: [10.000, 20.000, 30.010, math.nan], 1: [10.004, 19.990, 30.000, math.nan],
                2: [10.001, 20.002, 30.000, math.nan]}
    exposed = [6.0, 5.0, 1.0, 0.0]
    waits = ThreadWorld(3).run(lambda e: skew.waits_for_last_rank_ms(e, arrivals[e.rank], exposed))
    assert waits[1] is None and waits[2] is None  # rank 0's record only
    # step 0: rank 1 came 4 ms later; 1: rank 2 2 ms later; 2: rank 0 was the last; 3: no exchange
    assert waits[0] == pytest.approx([4.0, 2.0, 0.0, 0.0], abs=1e-6)
    short = [1.5, 5.0, 1.0, 0.0]
    capped = ThreadWorld(2).run(lambda e: skew.waits_for_last_rank_ms(e, arrivals[e.rank], short))
    assert capped[0][0] == pytest.approx(1.5)  # never more than the wait itself


def test_ranks_without_a_shared_clock_record_nothing(monkeypatch):
    boots = iter(["a", "b"])
    ids = {}

    def boot_id() -> str:  # each rank's thread its own machine
        import threading

        return ids.setdefault(threading.get_ident(), next(boots))

    monkeypatch.setattr(machine, "_boot_id", boot_id)
    waits = ThreadWorld(2).run(lambda e: skew.waits_for_last_rank_ms(e, [1.0, 2.0], [1.0, 1.0]))
    assert waits == [None, None]


@pytest.mark.dist
def test_a_stragglers_job_waits_for_it_and_says_so(tmp_path):
    """Rank 1 computes 20x slower: rank 0's exposed communication is mostly the wait for it."""
    run = tmp_path / "run"
    proc = compbench("train", *TINY, "engine=torch", "engine.np=2", "max_steps=20", "checkpoint=false",
                     "fault.slow_rank=1", "fault.slow_factor=20", f"output_dir={run}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "results.json").read_text())["summary"]
    assert summary["comm_skew_ms"] >= 0.5 * summary["comm_exposed_ms"] > 0
    # step by step, the rest of the exposed time is not the wait
    assert 0 <= summary["comm_exposed_less_skew_ms"] < summary["comm_skew_ms"]
