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


TINY_TEXT = ("max_steps=40", "model.n_layer=1", "model.n_embd=32", "dataset.eval_windows=16")


@pytest.mark.skipif(not (Path.home() / ".cache" / "compbench" / "text").is_dir(),
                    reason="the Shakespeare corpus is not installed (make setup)")
def test_text_suite_runs_every_method_and_writes_the_method_table(tmp_path):
    """`--suite text --quick` with a tiny model and 40 steps (one DiLoCo round of 30, 1-bit Adam past
    its 36 warm-up steps): every method runs, each claim gets a verdict, the method table its bytes."""
    from compbench.claims.runner import METHOD_HEADER
    from compbench.claims.text import CLAIMS as TEXT_CLAIMS
    from compbench.claims.text import QUICK_RUNS

    out = tmp_path / "text"
    proc = compbench("claims", "--suite", "text", "--quick", "--out", str(out), *TINY_TEXT, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"claims: {len(QUICK_RUNS)} runs, 0 already finished, {len(QUICK_RUNS)} to run" in proc.stdout
    with open(out / "claims.csv") as f:
        rows = list(csv.reader(f))
    assert [r[0] for r in rows[1:]] == [c.id for c in TEXT_CLAIMS]
    assert all(r[-1] in ("yes", "NO") for r in rows[1:]), rows
    assert "NOT evidence" in (out / "claims.md").read_text()
    assert sorted(p.stem for p in (out / "plots").glob("*.png")) == sorted(c.id for c in TEXT_CLAIMS)
    with open(out / "methods.csv") as f:
        methods = {r[0]: r for r in csv.reader(f)}
    assert tuple(methods.pop("method")) == METHOD_HEADER and set(methods) == set(QUICK_RUNS)
    assert methods["ddp-adamw"][4] == "1.0x"
    # DeMo's and SparseLoCo's effective ratios are what the claims compare (>= 30x fewer bytes).
    assert float(methods["demo"][4].rstrip("x")) > 10 and float(methods["sparseloco"][4].rstrip("x")) > 100
    assert all(float(r[2].split()[0]) > 0 and r[5] != "-" for r in methods.values()), methods
    assert "full suite estimate" in proc.stdout
