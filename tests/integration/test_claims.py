"""`compbench claims --quick`: the whole suite's machinery end to end (every run, the table in
Markdown and CSV, a plot per claim), then a second call that finds every run finished and only
rewrites the table (a half-done suite continues where it stopped). ~10 minutes on 2 cores."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from compbench.claims.findings import CLAIMS, RUNS
from compbench.claims.runner import HEADER
from tests.helpers import compbench

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="dataset-fashion-mnist is not installed (make setup)")
def test_quick_claims_suite_writes_the_table_and_resumes(tmp_path):
    out = tmp_path / "claims"
    proc = compbench("claims", "--quick", "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"claims: {len(RUNS)} runs, 0 already finished, {len(RUNS)} to run" in proc.stdout
    with open(out / "claims.csv") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == HEADER and [r[0] for r in rows[1:]] == [c.id for c in CLAIMS]
    assert all(r[-1] in ("yes", "NO") for r in rows[1:]), rows  # every run finished: a verdict each
    md = (out / "claims.md").read_text()
    assert "NOT evidence" in md and all(c.id in md for c in CLAIMS)
    assert sorted(p.stem for p in (out / "plots").glob("*.png")) == sorted(c.id for c in CLAIMS)
    assert "full suite estimate" in proc.stdout

    (out / "claims.md").unlink()
    again = compbench("claims", "--quick", "--out", str(out), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"claims: {len(RUNS)} runs, {len(RUNS)} already finished, 0 to run" in again.stdout
    assert (out / "claims.md").read_text() == md

    stale = compbench("claims", "--quick", "--out", str(out), "optim.lr=0.05", timeout=600)
    assert stale.returncode == 2 and "holds a finished run made with other settings" in stale.stderr
