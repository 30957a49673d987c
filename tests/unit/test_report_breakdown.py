"""The report's step-time split has an "other" part: the step minus the phases, so it adds up."""

import json

import pytest

from compbench.records.results import SPLIT, split_ms
from compbench.report.main import COLUMNS, breakdown, load_runs, markdown_table

PHASES_MS = {"compute_ms": 10.0, "compress_ms": 3.0, "comm_ms": 5.0, "comm_exposed_ms": 4.0,
             "decompress_ms": 1.0, "optimizer_ms": 0.5}


def _run(root, name, summary):
    (root / name).mkdir()
    data = {"config": {"choices": {"compressor": "dgc"}, "compressor": {"ratio": 0.001}},
            "summary": {"status": "completed", **summary}}
    (root / name / "results.json").write_text(json.dumps(data))


def test_other_is_the_step_minus_the_phases(tmp_path):
    _run(tmp_path, "compressor=dgc,ratio=0.001", {**PHASES_MS, "step_ms": 29.0})  # no other_ms: older files
    _run(tmp_path, "compressor=dgc,ratio=0.01", {**PHASES_MS, "step_ms": 19.0})  # medians: a hair under
    rows = load_runs(tmp_path)
    assert [r["other_ms"] for r in rows] == [pytest.approx(9.5), pytest.approx(-0.5)]
    bars = breakdown(rows)
    assert list(bars) == [*SPLIT, "other"]
    assert sum(v[0] for v in bars.values()) == pytest.approx(29.0)  # the bars add up to the step
    assert bars["other"][1] == 0.0  # never a negative bar
    table = markdown_table(rows, COLUMNS)
    assert "other_ms" in table.splitlines()[0] and "| 9.5 |" in table


def test_split_ms_of_a_summary():
    assert split_ms({"step_ms": None}) is None
    parts = split_ms({**PHASES_MS, "step_ms": 20.0})
    assert list(parts) == [*SPLIT, "other"] and parts["other"] == pytest.approx(0.5)
    assert "comm_exposed" not in parts  # a part of comm + decompress, not a separate slice


def test_runs_that_differ_only_by_seed_get_bars_of_their_own():
    from compbench.report.main import bar_labels

    rows = [{"compressor": "topk", "ratio": 0.01, "job": "seed=0"}, {"compressor": "topk", "ratio": 0.01,
                                                                    "job": "seed=1"},
            {"compressor": "none", "ratio": None, "job": "none"}]
    labels = bar_labels(rows)
    assert len(set(labels)) == 3 and labels[0].endswith("seed=0") and "\n" in labels[2]
