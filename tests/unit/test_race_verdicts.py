"""What the race's report may claim from what it has (synthetic runs, no training): a one-link race
fits nothing and extrapolates nothing, a target without data is no verdict, loaded runs whose unloaded
estimate is not validated at their load (or whose two clocks order the methods the other way round)
rank nothing, and every figure renders without a warning."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from compbench.race.model import PRIOR, Profile, fit_model
from compbench.race.report import load, write
from compbench.race.suites import TEXT, Link
from compbench.race.targets import text_targets
from tests.unit.test_race import FIT, _fake_race, _results, _rows


def _edit(run_dir: Path, **summary) -> None:
    res = json.loads((run_dir / "results.json").read_text())
    res["summary"].update(summary)
    (run_dir / "results.json").write_text(json.dumps(res))


def _loaded(run_dir: Path, wall_factor: float, others_per_core: float = 1.05) -> None:
    """The run again beside other work: its wall-clock step `wall_factor` times its unloaded estimate
    (the step it had), other work's runnable tasks `others_per_core` on each of the 2 cores."""
    res = json.loads((run_dir / "results.json").read_text())
    s = res["summary"]
    step = s.get("step_unloaded_ms") or s["step_ms"]
    wall = wall_factor * step
    s.update(loaded=True, step_unloaded_ms=step, step_unloaded_ms_q1=0.9 * step,
             step_unloaded_ms_q3=1.1 * step, step_ms=wall, step_ms_q1=0.9 * wall, step_ms_q3=1.1 * wall)
    res["environment"].update(others_runnable=2 * others_per_core, load_after=2 + 2 * others_per_core)
    (run_dir / "results.json").write_text(json.dumps(res))


def test_a_fit_needs_two_bandwidths_else_the_prior_stays():
    profiles = [Profile.of(_results(110.0, 10.0, sent)) for sent in (4e6, 2e5, 1e6, 5e5, 8e6)]
    one = [(p, 1.0, 0.0, p.step_ms(FIT, 1.0), False) for p in profiles]
    assert fit_model(one) is PRIOR
    assert fit_model([*one, *[(p, 0.1, 0.0, p.step_ms(FIT, 0.1), False) for p in profiles]]) is not PRIOR


def test_a_one_link_race_prints_no_crossover_and_no_extrapolation(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    text = write(tmp_path, TEXT, load(_fake_race(tmp_path, (Link(1000),))), quick=False, checks=text_targets)
    assert ("**Not fitted: the race's runs are on one bandwidth (1000 Mbit/s); a fit needs links of 2 "
            "bandwidths or more**") in text
    assert "No crossover and no extrapolation" in text
    for claim in ("reaches the target before", "round trips", "What-if", "10 / 100 / 1000 Mbit/s",
                  "within 15%", "extrapolated"):
        assert claim not in text, claim
    utilization = next(f.axes[0] for f in figures if f.axes[0].get_title().startswith("text race: compute"))
    assert all(line.get_linestyle() == "None" for line in utilization.get_lines())  # points, no model line
    for figure in figures:
        close(figure)


def test_a_prediction_without_a_run_on_another_link_is_no_verdict(tmp_path):
    """Each method on a link of its own: every run would be predicted from itself."""
    keep = {("ddp-adamw", Link(10)), ("diloco", Link(1000)), ("onebit-adam", Link(100))}
    entries = [e for e in _fake_race(tmp_path) if (e[0], e[1]) in keep]
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=text_targets)
    assert "Prediction from another link: no verdict" in text
    assert "within 15%" not in text


def test_targets_the_race_has_no_data_for_say_no_verdict(tmp_path):
    runs = load(_fake_race(tmp_path, (Link(200, 25),)))
    text = write(tmp_path, TEXT, runs, quick=False, checks=text_targets)
    rows = _rows(text)
    exposed = next(v for k, v in rows.items() if k[0].startswith("exposed communication per exchange"))
    assert exposed[1:] == ["no verdict", "no link without delay in this race"]
    assert rows[("onebit-adam tokens/s >= 1x ddp-adamw's at 1000 Mbit/s", "no verdict")][2] == \
        "no run on that link"
    assert not any(cells[1] == "yes" for cells in rows.values() if len(cells) == 3)


def test_loaded_runs_with_an_unvalidated_estimate_give_no_verdict_at_this_load(tmp_path, monkeypatch):
    """Where no family is validated at any load (compbench.race.to_target.VALIDATED emptied): the
    loaded run's link, the crossovers that read it and the throughput targets of loaded cells rank
    nothing."""
    from compbench.race import report, to_target

    for module in (to_target, report):
        monkeypatch.setattr(module, "VALIDATED", dict.fromkeys(to_target.VALIDATED))
    entries = _fake_race(tmp_path)
    base = next(d for m, link, seed, d in entries if (m, link.mbps, seed) == ("ddp-adamw", 1000.0, 0))
    _loaded(base, 1.6, others_per_core=2.2)
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=text_targets)
    rows = _rows(text)
    verdicts = {c[0]: c[-1] for c in rows.values() if len(c) == 5 and c[0] in ("10", "100", "1000")}
    assert verdicts["10"] == ("**no verdict at this load**: the unloaded estimate is not validated for "
                              "periodic methods at 1 busy loop per core (not reached in every seed: "
                              "ddp-adamw)")
    assert verdicts["1000"].startswith("**no verdict at this load**: the unloaded estimate is not validated "
                                       "for per-step methods at 2 busy loops per core")
    assert verdicts["100"] == "diloco < onebit-adam (not reached in every seed: ddp-adamw)"  # idle there
    assert rows[("diloco", "no verdict at this load")]  # its crossover
    assert "not measured yet for any method family at any load" in text
    target = rows[("onebit-adam tokens/s >= 1x ddp-adamw's at 1000 Mbit/s", "no verdict")]
    assert target[2].startswith("no verdict at this load: the unloaded estimate is not validated for "
                                "per-step")
    clocks = text[text.index("## The two clocks"):text.index("## The verdict per link")]
    ddp = next(c for c in _rows(clocks).values() if c[:2] == ["ddp-adamw", "1000"])
    # the wall clock 1.6x the estimate in one seed of two; beside 2.2 busy loops per core
    assert ddp[2:9] == ["per-step", "1/2", "0.05-2.20", "164.4", "126.5", "0.77",
                        "no: the unloaded estimate is not validated for per-step methods at 2 busy loops "
                        "per core"]


def test_two_clocks_that_order_methods_the_other_way_round_give_no_verdict(tmp_path, monkeypatch):
    """The estimate validated, but by the wall clock DiLoCo (300 ms steps beside other work) comes after
    1-bit Adam, beyond the seeds' spread: the estimate alone cannot rank them."""
    from compbench.race import to_target

    monkeypatch.setitem(to_target.VALIDATED, ("periodic", 1), 1.02)
    entries = _fake_race(tmp_path)
    for m, link, _, run_dir in entries:
        if (m, link.mbps) == ("diloco", 10.0):
            _loaded(run_dir, 3.0)
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=text_targets)
    row = next(c for c in _rows(text).values() if c[0] == "10" and len(c) == 5)
    assert row[1].startswith("diloco 17.5 +- 0.0 s (crossing +-2.5) < onebit-adam 38.7")
    assert row[2].startswith("onebit-adam 38.7 +- 0.0 s (crossing +-5.5) < diloco 52.5")
    assert row[-1] == ("**no verdict at this load**: by the wall clock onebit-adam before diloco, beyond the "
                       "seeds' spread (not reached in every seed: ddp-adamw)")


@pytest.mark.parametrize("case", ["full", "one link", "with delay", "nothing reached", "no utilization"])
def test_the_plots_render_without_a_warning(tmp_path, case):
    links = {"one link": (Link(1000),), "with delay": (Link(100), Link(200, 25))}.get(case)
    entries = _fake_race(tmp_path, links) if links else _fake_race(tmp_path)
    for *_, run_dir in entries:
        if case == "nothing reached":
            res = json.loads((run_dir / "results.json").read_text())
            _edit(run_dir, target={**res["summary"]["target"], "reached": False})
        if case == "no utilization":
            _edit(run_dir, utilization=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write(tmp_path, TEXT, load(entries), quick=case == "nothing reached", checks=text_targets)
    assert len(list((tmp_path / "plots").glob("*.png"))) == 2 + len(links or (1, 2, 3))


def test_the_reasons_for_no_verdict_are_said_once_per_kind():
    from compbench.race.report import NO_ESTIMATE, gaps_text

    assert gaps_text([("per-step", 1), ("sharded", 2), ("per-step", 2), None, ("sharded", 1)]) == [
        "the unloaded estimate is not validated for per-step methods at 1 and 2 busy loops per core, sharded "
        "methods at 1 and 2 busy loops per core"]
    assert gaps_text([(NO_ESTIMATE, None), ("periodic", None)]) == [
        "a loaded run without an unloaded estimate (its wall clock is the machine's as much as the method's)",
        "the unloaded estimate is not validated for periodic methods at an unrecorded load"]
    assert gaps_text([None, None]) == []


def _validate_script():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "scripts" / "validate_unloaded.py"
    spec = importlib.util.spec_from_file_location("validate_unloaded", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_validation_script_kills_its_loops_and_tables_the_ratios():
    """scripts/validate_unloaded.py without training: its loops (sleeping stand-ins, no load here) end
    when the block fails, and its table holds each family's estimate over the idle wall clock."""
    import os

    v = _validate_script()
    sleeping = v.LOOP.replace("while True:\n    pass\n", "import time\ntime.sleep(60)\n")
    with pytest.raises(RuntimeError), v.busy_loops(2, sleeping) as loops:
        pids = [p.pid for p in loops]
        raise RuntimeError("a failed run")
    assert all(p.poll() is not None for p in loops) and not any(os.path.exists(f"/proc/{p}") for p in pids)
    rows = [{"load": load, "method": m, "repeat": 0, "family": fam, "step_ms": 200.0 * (1 + load),
             "step_unloaded_ms": 200.0 * (1 - drop * load)}
            for load in (0, 1)
            for m, fam, drop in (("ddp-adamw", "per-step", 0.3), ("diloco", "periodic", 0.05))]
    text, measured = v.table(rows)
    assert measured == {("per-step", 1): 0.7, ("periodic", 1): 0.95}
    assert _rows(text)[("1 busy loop per core", "0.70 (0.70-0.70; wall 2.00) OFF")][2] == \
        "0.95 (0.95-0.95; wall 2.00) holds"
    assert "    ('periodic', 1): 0.95," in text
