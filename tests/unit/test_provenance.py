"""What a run records of the machine around it (compbench.records.provenance): compbench's commit and whether
its tree had changes, the CPU, its cores, the load before and after; a run on a loaded machine is
flagged in its summary and its one-screen summary says so."""

from __future__ import annotations

import os
import subprocess
import sys

from compbench.compose import config
from compbench.records import provenance
from compbench.records.results import format_summary
from compbench.train.loop import Trainer
from tests.helpers import TINY
from tests.threaded_engine import ThreadWorld


def test_the_load_less_the_runs_own_threads_decides():
    assert not provenance.loaded(load_before=0.5, load_after=2.4, own_threads=2, cores=2)
    # the previous run of a matrix still in the 1-minute average: not another job
    assert not provenance.loaded(load_before=2.5, load_after=2.0, own_threads=2, cores=2)
    assert provenance.loaded(load_before=0.1, load_after=2.6, own_threads=2, cores=2)  # busy during
    assert provenance.loaded(load_before=0.1, load_after=5.0, own_threads=2, cores=2)
    # one thread of a run on 2 cores leaves one free: other work beyond it competes
    assert not provenance.loaded(load_before=0.0, load_after=2.3, own_threads=1, cores=2)
    assert provenance.loaded(load_before=0.0, load_after=2.6, own_threads=1, cores=2)


def test_other_works_runnable_tasks_decide_where_they_are_known():
    assert provenance.loaded(load_before=0.0, load_after=0.0, own_threads=2, cores=2, others_runnable=0.8)
    # a job's own communication threads raise the load average, not other work's runnable tasks
    assert not provenance.loaded(load_before=0.0, load_after=4.0, own_threads=2, cores=2, others_runnable=0.1)
    # a run of one thread on 2 cores leaves one free to other work
    assert not provenance.loaded(load_before=0.0, load_after=0.0, own_threads=1, cores=2, others_runnable=1.2)


def test_a_run_records_its_machine_and_a_loaded_one_is_flagged(monkeypatch, tmp_path):
    cfg = config.check(config.compose([*TINY, "max_steps=300", "eval_points=1", "checkpoint=false"]))
    busy = 4.0 * (os.cpu_count() or 1)
    monkeypatch.setattr(provenance, "load_average", lambda: busy)  # recorded as it is

    def rank(engine):
        return Trainer(cfg, engine, tmp_path).fit()

    cores = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        results = ThreadWorld(2).run(rank)[0]  # other work keeps the cores busy meanwhile
    finally:
        for spinner in spinners:
            spinner.kill()
    env = results["environment"]
    assert env["cores"] == os.cpu_count() and env["load_before"] == env["load_after"] == busy
    assert env["commit"] and isinstance(env["dirty"], bool)  # this checkout is a git tree
    assert env["others_runnable"] > provenance.OTHER_LOAD and env["others_cores"] > 0
    assert results["summary"]["loaded"] is env["loaded"] is True
    assert f"LOADED       load {busy} before, {busy} after" in format_summary(results, tmp_path)
