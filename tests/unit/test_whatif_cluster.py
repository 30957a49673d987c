"""scripts/whatif_cluster.py without a cluster: its rows file and the report it fits from the rows."""

from __future__ import annotations

import csv
import importlib.util
import random
from pathlib import Path

import pytest

from compbench.comm import cost_model
from compbench.comm.cost_model import Shape

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "whatif_cluster.py"


@pytest.fixture(scope="module")
def whatif():
    spec = importlib.util.spec_from_file_location("whatif_cluster", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(whatif, rng: random.Random, truth: cost_model.Fit, comm: str, groups: int) -> dict:
    row = {k: 0.0 for k in whatif.FIELDS}
    row.update(nodes=rng.choice([2, 4]), gbps=rng.choice([1.0, 10.0]), compressor="dgc", comm=comm,
               groups=groups, bytes_sent_per_step=rng.uniform(0.1, 50) * 1e6, bytes_dense_per_step=1e8,
               compressed_calls_per_step=rng.randint(1, 160), run_dir="x")
    row["workers"] = row["nodes"] * rng.choice([1, 2])
    shape = Shape(row["nodes"], row["workers"], row["gbps"])
    row["comm_ms"] = truth.comm_ms(cost_model.features(row, shape))
    row.update(compute_ms=100.0, step_ms=100.0 + row["comm_ms"])
    return row


def test_rows_file_is_created_appended_and_upgraded_from_the_old_columns(whatif, tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    row = {k: 1 for k in whatif.FIELDS} | {"compressor": "dgc", "comm": "ps", "groups": 4, "run_dir": "r"}
    whatif._append(rows, row)  # no file yet
    old_columns = [f for f in whatif.FIELDS if f != "groups"]
    legacy = tmp_path / "legacy.csv"
    with legacy.open("w", newline="") as f:  # written before the groups column existed: layer-wise
        writer = csv.DictWriter(f, old_columns)
        writer.writeheader()
        writer.writerow({k: row[k] for k in old_columns})
    whatif._append(legacy, row)
    for path in (rows, legacy):
        assert path.read_text().splitlines()[0].split(",") == whatif.FIELDS
    assert [r["groups"] for r in whatif._raw_rows(legacy)] == ["0", "4"]
    assert [whatif._key(r) for r in whatif._raw_rows(rows)] == [(1, 1.0, 1, "dgc", "ps", 4)]


def test_report_recovers_rows_made_by_the_model_on_every_communicator(whatif) -> None:
    truth = cost_model.Fit(ms_per_waited=3.0, ms_per_queued=0.5, ms_per_round=0.2, link_factor=1.2,
                              machine_gb_per_s=2.0)
    rng = random.Random(1)
    rows = [_row(whatif, rng, truth, comm, groups) for _ in range(6)
            for comm, groups in (("allgather", 0), ("ps", 0), ("ps", 4), ("hierarchical", 4))]
    report, fitted = whatif.fit_report(rows)
    assert fitted.ms_per_waited == pytest.approx(3.0, rel=1e-3)
    assert "fit on all rows, on every row: largest error 0.0%, 24 of 24 within 15%" in report
    for label in ("allgather", "ps", "ps g4", "hierarchical g4"):
        assert f"- {label}: 6 of 6 within 15%" in report
    assert "| K | Gbit/s | N | " in report  # the pivot table
