"""A real race, small: two methods of the CNN race on one shaped link (root), to a near target
within a few seconds of training; the report and its plots are written, and a second call runs
nothing again (the matrix resumes)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import compbench
from tests.integration.test_netem import needs_root

pytestmark = [pytest.mark.dist, needs_root]
SMALL = ["dataset.train_size=1024", "dataset.test_size=256", "max_train_s=3", "eval_every_steps=4",
         "target_acc1=30"]


def test_a_small_race_writes_its_report(tmp_path):
    out = tmp_path / "race"
    args = ["race", "--suite", "cnn", "--only", "fp32,topk", "--links", "1000", "--seeds", "1",
            "--out", str(out), *SMALL]
    proc = compbench(*args, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (out / "race.md").read_text()
    assert re.search(r"\| fp32 +\| 1000 +\|", report) and re.search(r"\| topk +\| 1000 +\|", report)
    assert "The model needs at least 5 finished runs." in report  # two runs fit nothing
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "curves_1000mbps.png", "time_to_target.png", "utilization.png"]
    again = compbench(*args, cwd=tmp_path, timeout=600)
    assert again.returncode == 0 and "2 runs, 2 already finished, 0 to run" in again.stdout


def test_bad_links_are_one_line(tmp_path):
    proc = compbench("race", "--links", "fast", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --links fast must be a comma-separated list of links, each a rate in Mbit/s from 1 to 1e+06 "
        "and optionally a one-way delay in ms >= 0 after a colon, e.g. --links 10,200:25"]
