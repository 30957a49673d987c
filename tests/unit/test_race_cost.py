"""The race's cost to target (compbench.race.cost): the arithmetic against hand-computed figures, the
bytes at the crossing read off a run's curve, the report's columns, CSV and figure at `--prices`, and
the refusals of bad prices (one `error:` line, exit 2, nothing written). No training: the runs are
the synthetic race of tests/unit/test_race.py with each evaluation's bytes added."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compbench.race.cost import Prices, parse_prices
from compbench.race.model import WhatIf
from compbench.race.report import load, write
from compbench.race.suites import TEXT
from compbench.race.to_target import to_target
from tests.unit.test_race import _fake_race, _rows

# the fake race's bytes one worker sends a step (a DiLoCo round's mean) and its crossing: 175 steps
SENT = {"ddp-adamw": 3.2e6, "diloco": 3.2e6 / 30, "onebit-adam": 1.5e5}
STEPS = 175


@pytest.fixture
def validated(monkeypatch):
    """The unloaded estimate validated for the fake race's loaded run (periodic, a busy loop per core),
    so that its model's crossovers and what-if are given."""
    from compbench.race import to_target as module

    monkeypatch.setitem(module.VALIDATED, ("periodic", 1), 0.97)


def _with_bytes(out: Path) -> list:
    """The fake race, each evaluation recording the bytes one worker had sent (rank 0's count since
    the start, as the trainer's curve does): `sent` a step."""
    entries = _fake_race(out)
    for method, _, _, run_dir in entries:
        res = json.loads((run_dir / "results.json").read_text())
        for p in res["curve"]:
            p["bytes_sent"] = round(SENT[method] * p["step"])
        (run_dir / "results.json").write_text(json.dumps(res))
    return entries


def test_the_arithmetic_by_hand():
    prices = Prices(device_hour=3.6, egress_gb=0.09)
    # 2 workers x 17.5 s = 35 device-seconds at 3.6 USD an hour (0.001 USD a second): 0.035 USD;
    # 2 x 18.6667 MB = 0.037333 GB at 0.09 USD: 0.00336 USD
    split = prices.split_usd(2, 17.5, 18.6667e6)
    assert split is not None
    device, egress = split
    assert device == pytest.approx(0.035)
    assert egress == pytest.approx(0.00336, rel=1e-5)
    assert prices.cost_usd(2, 17.5, 18.6667e6) == pytest.approx(0.03836, rel=1e-5)
    assert prices.cost_usd(8, 3600.0, 1e9) == pytest.approx(8 * 3.6 + 8 * 0.09)  # an hour, a GB each
    # bytes unknown: no cost where egress is charged (not 0), the devices' alone where it is not
    assert prices.cost_usd(2, 17.5, None) is None
    assert Prices(device_hour=3.6).cost_usd(2, 17.5, None) == pytest.approx(0.035)
    assert str(prices) == "device_hour=3.6,egress_gb=0.09"
    assert parse_prices(str(prices)) == prices
    assert parse_prices("egress_gb=0.5") == Prices(0.0, 0.5)  # a price not given is 0
    assert "devices not charged (device_hour=0)" in Prices(0.0, 0.5).text()


def test_the_bytes_at_the_crossing_are_interpolated_as_the_tokens_are(tmp_path):
    """Evaluations at steps 150 (loss 2.4) and 200 (2.2), target 2.3: halfway, step 175, and the bytes
    one worker had sent there; reached at the first evaluation: from the start."""
    run_dir = _with_bytes(tmp_path)[6][3]  # diloco at 10 Mbit/s, seed 0
    results = json.loads((run_dir / "results.json").read_text())
    t = to_target(results, "eval/loss", False)
    assert t is not None and t.steps == pytest.approx(STEPS)
    assert t.bytes_sent == pytest.approx(STEPS * SENT["diloco"], rel=1e-6)
    results["curve"] = results["curve"][-1:]  # the first evaluation reached it: the start to it
    first = to_target(results, "eval/loss", False)
    assert first is not None and first.bytes_sent == round(SENT["diloco"] * 200)
    for p in results["curve"]:
        del p["bytes_sent"]
    older = to_target(results, "eval/loss", False)
    assert older is not None and older.bytes_sent is None  # an older run's curve: unknown


def test_the_report_costs_every_time_to_target(tmp_path, validated):
    import pandas as pd

    prices = Prices(device_hour=3.6, egress_gb=0.09)
    text = write(tmp_path, TEXT, load(_with_bytes(tmp_path)), quick=False, checks=None,
                 whatif=WhatIf(prices=prices))
    rows = _rows(text)
    # diloco at 10 Mbit/s, both seeds: 17.5 s on 2 workers (0.035 USD) + 2 x 175 x 106,667 bytes (0.00336)
    assert rows[("diloco", "10")][2:4] == ["17.5 +- 0.0 s (2/2)", "0.0384 +- 0 USD (2/2)"]
    assert rows[("ddp-adamw", "10")][3] == "not reached (0/2)"
    assert rows[("ddp-adamw", "100")][3].endswith("USD by 1/2; the others not reached or without bytes")
    assert ("Cost to target at `--prices device_hour=3.6,egress_gb=0.09` (3.6 USD per worker's "
            "device-hour") in text
    runs = pd.read_csv(tmp_path / "race.csv")
    diloco = runs[(runs["method"] == "diloco") & (runs["link (Mbit/s)"] == 10)]
    assert diloco["bytes per worker to target"].tolist() == pytest.approx([STEPS * SENT["diloco"]] * 2,
                                                                          rel=1e-6)
    assert diloco["cost to target (USD)"].tolist() == pytest.approx([0.03836] * 2, rel=1e-5)
    assert diloco["devices' cost to target (USD)"].tolist() == pytest.approx([0.035] * 2)
    assert diloco["egress cost to target (USD)"].tolist() == pytest.approx([0.00336] * 2, rel=1e-5)
    # the predicted cost: the predicted time on the same devices and bytes
    for _, r in runs[runs["reached"]].iterrows():
        assert r["cost to target predicted (USD)"] == pytest.approx(
            r["workers"] * r["time to target predicted (s)"] / 3600 * 3.6
            + r["workers"] * r["bytes per worker to target"] / 1e9 * 0.09, rel=1e-5)
    assert set(runs["device-hour price (USD)"]) == {3.6} and set(runs["egress price (USD/GB)"]) == {0.09}
    assert (tmp_path / "plots" / "cost_to_target.png").stat().st_size > 10_000


def test_the_what_if_costs_its_workers_time_and_bytes(tmp_path, validated):
    """At egress alone (devices free) the what-if's cost does not depend on the link: 8 workers x 175
    steps x 106,667 bytes x 0.09 USD/GB = 0.01344 USD at every rate; at devices alone it is the what-if's
    time (its own column, whole seconds) x 8 workers x the price."""
    entries = _with_bytes(tmp_path)
    egress = write(tmp_path / "egress", TEXT, load(entries), quick=False, checks=None,
                   whatif=WhatIf(prices=Prices(egress_gb=0.09)))
    header = next(x for x in egress.splitlines() if "cost to target at 10 / 100 / 1000 Mbit/s" in x)
    assert "8 workers, USD at `--prices device_hour=0,egress_gb=0.09`" in header
    diloco = next(v for k, v in _rows(egress).items() if k[0] == "diloco" and k[1].startswith("at every"))
    assert diloco[-1] == "0.0134 / 0.0134 / 0.0134"
    device = write(tmp_path / "device", TEXT, load(entries), quick=False, checks=None,
                   whatif=WhatIf(prices=Prices(device_hour=3600.0)))  # a dollar a device-second
    row = next(v for k, v in _rows(device).items() if k[0] == "diloco" and k[1].startswith("at every"))
    seconds = [float(x.removesuffix(" s")) for x in row[-3].split(" / ")]  # the time column: whole s
    costs = [float(x) for x in row[-1].split(" / ")]
    assert costs == pytest.approx([8 * s for s in seconds], abs=8 * 0.5)


def test_without_prices_nothing_is_costed(tmp_path):
    import pandas as pd

    text = write(tmp_path, TEXT, load(_with_bytes(tmp_path)), quick=False, checks=None)
    assert "cost to target" not in text and "Cost to target" not in text
    runs = pd.read_csv(tmp_path / "race.csv")
    assert runs["cost to target (USD)"].isna().all() and runs["bytes per worker to target"].notna().any()
    assert not (tmp_path / "plots" / "cost_to_target.png").exists()


@pytest.mark.parametrize("prices, message", [
    ("device_hour=-1", "--prices device_hour=-1: device_hour=-1 must be a number of US dollars from 0 to "
                       "1e+06 (USD per worker's device-hour), e.g. --prices device_hour=2.5,egress_gb=0.09"),
    ("egress_gb=cheap", "--prices egress_gb=cheap: egress_gb=cheap must be a number of US dollars"),
    ("egress_gb=nan", "--prices egress_gb=nan: egress_gb=nan must be a number"),
    ("device_hour=inf", "--prices device_hour=inf: device_hour=inf must be a number"),
    ("gpu=2", "--prices gpu=2: unknown price gpu; choose from device_hour (USD per worker's device-hour), "
              "egress_gb (USD per GB sent out of a node), e.g. --prices device_hour=2.5,egress_gb=0.09"),
    ("device_hour=1,device_hour=2", "--prices device_hour=1,device_hour=2 names device_hour twice; give each "
                                    "once"),
    ("device_hour", "--prices device_hour: device_hour is not NAME=USD"),
    ("device_hour=1,", "--prices device_hour=1,: \\(an empty item\\) is not NAME=USD"),
])
def test_bad_prices_are_one_error_line_and_exit_2_before_anything_is_written(prices, message, tmp_path,
                                                                            capsys):
    from compbench.cli.main import main

    out = tmp_path / "race"
    with pytest.raises(SystemExit) as stop:
        main(["race", "--quick", "--out", str(out), "--prices", prices])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and err.startswith("error: ")
    assert re.search(message if "\\(" in message else re.escape(message), err), err
    assert not out.exists()
