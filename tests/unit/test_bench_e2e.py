"""`compbench bench mode=e2e`: its settings are checked before anything runs, and a small matrix
runs real trainings (the MLP of the issue, 2 gloo ranks) into its tables."""

from __future__ import annotations

import json

import pytest

from compbench.bench import e2e, e2e_table
from compbench.bench import main as bench_main
from compbench.catalog import registry
from compbench.compose import config
from tests.helpers import compbench


def _check(tmp_path, *overrides: str) -> dict:
    cfg = config.compose(["mode=e2e", *overrides], config_name="bench")
    return e2e.check(registry.plain(cfg.e2e), cfg.output, str(tmp_path))


def test_the_default_matrix_is_every_row():
    cfg = config.compose(["mode=e2e"], config_name="bench")
    assert list(cfg.e2e.rows) == list(e2e.ROW_KEYS)


@pytest.mark.parametrize("override,message", [
    ("e2e.rows=[dragonn,nope]", "e2e.rows=['dragonn', 'nope'] has unknown ['nope']; choose from: none_torch"),
    ("e2e.rows=[]", "e2e.rows=[] is empty"),
    ("e2e.links=[wifi]", "e2e.links=['wifi']; use [shaped], [unshaped] or [shaped,unshaped]"),
    ("e2e.links=[unshaped,unshaped]", "e2e.links=['unshaped', 'unshaped']"),
    ("e2e.gbps=0", "e2e.gbps=0 must be a number of Gbit/s > 0"),
    ("e2e.steps=5", "e2e.steps=5 must be an integer >= 6"),
    ("e2e.repeat=0", "e2e.repeat=0 must be an integer >= 1"),
    ("e2e.timeout=-1", "e2e.timeout=-1 must be seconds > 0"),
])
def test_bad_settings_raise_one_line_value_errors(tmp_path, override, message):
    with pytest.raises(ValueError) as info:
        _check(tmp_path, override, "e2e.links=[unshaped]" if "links" not in override else "mode=e2e")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_bare_name_is_one_row_and_a_used_folder_is_refused(tmp_path):
    spec = _check(tmp_path, "e2e.rows=dragonn", "e2e.links=[unshaped]", f"output={tmp_path / 'new'}")
    assert spec["rows"] == ["dragonn"] and spec["out"] == tmp_path / "new"
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "table.md").write_text("")
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        _check(tmp_path, "e2e.links=[unshaped]", f"output={tmp_path / 'used'}")
    with pytest.raises(ValueError, match="exists and is not a folder"):  # a file in the way
        _check(tmp_path, "e2e.links=[unshaped]", f"output={tmp_path / 'used' / 'table.md'}")


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode=fast is not a bench mode; use mode=micro"):
        bench_main.main(["mode=fast"])


def test_targets_read_the_medians_and_say_what_was_not_measured():
    rows = [r for r in e2e.ROWS if r[0] in ("dragonn", "compute", "ddp_topk")]
    times = {("shaped", "dragonn"): [40.0, 50.0, 45.0], ("shaped", "ddp_topk"): [90.0],
             ("shaped", "compute"): [32.0]}
    runs = e2e_table.Runs(rows, ["shaped"], 1, times, {})
    checks = e2e_table.targets(runs)
    assert "- [x] shaped: dragonn's step <= 1.4x the compute-only step (aim 1.25): 1.41x" not in checks
    assert "- [ ] shaped: dragonn's step <= 1.4x the compute-only step (aim 1.25): 1.41x" in checks
    assert "- [x] shaped: dragonn >= 1.3x faster than the DDP top-k hook: 2.00x" in checks
    assert "- [ ] shaped: dgc's step <= 1.15x dragonn's: -x (not measured)" in checks
    assert "- [x] shaped: dragonn's step <= 1.5x the compute-only step: 1.41x" in checks  # issue 48's
    assert "- [ ] shaped: dragonn's non-finite check <= 0.5 ms: - ms (not measured)" in checks


def test_the_check_time_is_shown_per_row_and_held_to_its_target():
    rows = [r for r in e2e.ROWS if r[0] in ("dragonn", "dgc", "compute")]
    times = {("unshaped", "dragonn"): [40.0], ("unshaped", "dgc"): [47.0], ("unshaped", "compute"): [30.0]}
    summaries = {"unshaped-dragonn-0": {"check_ms": 0.31}, "unshaped-dgc-0": {"check_ms": 0.62},
                 "unshaped-compute-0": {}}
    runs = e2e_table.Runs(rows, ["unshaped"], 1, times, summaries)
    checks = e2e_table.targets(runs)
    assert "- [x] unshaped: dragonn's non-finite check <= 0.5 ms: 0.31 ms" in checks
    assert "- [ ] unshaped: dgc's non-finite check <= 0.5 ms: 0.62 ms" in checks
    assert "- [x] unshaped: dragonn's step <= 1.5x the compute-only step: 1.33x" in checks
    assert "- [ ] unshaped: dgc's step <= 1.15x dragonn's: 1.18x" in checks
    table = e2e_table.step_table(runs, 1.0)
    assert "check ms" in table[0]
    dragonn = next(line for line in table if line.startswith("| compbench dragonn 1e-3 allgather |"))
    assert "| 40.0 | 0.31 |" in dragonn
    assert any(line.startswith("| compute only") and "| 30.0 | - |" in line for line in table)


@pytest.mark.dist
def test_a_small_matrix_runs_real_trainings_into_its_tables(tmp_path):
    out = tmp_path / "e2e"
    proc = compbench("bench", "mode=e2e", "e2e.rows=[dragonn,compute]", "e2e.links=[unshaped]", "e2e.steps=6",
                     f"output={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "table.md").read_text()
    assert "| compbench dragonn 1e-3 allgather, unshaped |" in table  # its phases against their floors
    record = json.loads((out / "results.json").read_text())
    assert set(record["step_ms"]) == {"unshaped/dragonn", "unshaped/compute"}
    assert all(t > 0 for times in record["step_ms"].values() for t in times)
    assert record["runs"]["unshaped-dragonn-0"]["floors"]["phases"]["compress"]["floor_ms"] > 0
