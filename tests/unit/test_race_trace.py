"""The race on a link that changes (compbench.race.on_trace): the effective link and the walk of a
trace's schedule against hand-computed figures, `--links trace:FILE` (its runs given net.trace, bad
traces refused before anything runs), and the report's trace section, CSV column and figure on a
synthetic race (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from compbench.comm.cost_model import Fit
from compbench.network.delay import has_tun
from compbench.network.netem import can_shape
from compbench.network.trace import parse_trace
from compbench.race.model import Profile
from compbench.race.on_trace import (
    effective,
    mean_delay_ms,
    mean_mbps,
    stretches,
    time_on_trace_ms,
    trace_link,
)
from compbench.race.report import fitted, load, write
from compbench.race.suites import TEXT, Link
from tests.unit.test_race import _fake_race, _results, _rows

HEAD = "t_s,rank,mbps,delay_ms,loss\n"
# rank 1's link drops to 10 Mbit/s with 5 ms from 10 s to 20 s
DIP = HEAD + "0,*,100,0,0\n10,1,10,5,0\n20,*,100,0,0\n"
WIRE_ONLY = Fit(ms_per_waited=0.0, ms_per_queued=0.0, ms_per_round=0.0, link_factor=1.0,
                machine_gb_per_s=math.inf)  # the wire's time alone


@pytest.fixture
def no_runs(monkeypatch):
    """A refusal is expected before any run: a race that got as far as its runs fails the test instead
    of training."""
    import compbench.race.main as race_module

    def fail(*args: object) -> None:
        raise AssertionError("the race got as far as its runs")

    monkeypatch.setattr(race_module, "check_jobs", fail)
    monkeypatch.setattr(race_module, "run_jobs", fail)


def test_the_effective_link_is_the_slowest_rate_and_the_longest_delay_between_two_workers():
    trace = parse_trace(DIP, 2)
    assert effective(trace, 12.0) == (10.0, 5.0)  # rank 1's 5 ms and rank 0's 0 ms: 5 ms between them
    both = parse_trace(HEAD + "0,0,100,3,0\n0,1,50,4,0.01\n", 2)
    assert effective(both, 0.0) == (50.0, 7.0)  # a packet between them waits 3 + 4 ms
    assert stretches(trace) == [(0.0, 100.0, 0.0), (10.0, 10.0, 5.0), (20.0, 100.0, 0.0)]
    assert mean_mbps(trace) == pytest.approx((100 * 10 + 10 * 10) / 20)  # 55 Mbit/s over its 20 s
    assert mean_delay_ms(trace) == pytest.approx(2.5)


def test_the_walk_takes_each_step_at_the_link_in_force_when_it_starts():
    """100 ms of compute and 1 MB allreduced a step (2 rounds), the cost the wire's alone: 180 ms a
    step at 100 Mbit/s (80 ms of wire), 100 + 800 + 2 x 5 = 910 ms at 10 Mbit/s with 5 ms. 100 steps:
    ceil(10 s / 180 ms) = 56 steps start before 10 s (to 10.080 s), ceil((20 - 10.08) s / 910 ms) = 11
    before 20 s (to 20.090 s), the 33 left at 180 ms: 26.030 s."""
    p = Profile.of(_results(110.0, 10.0, 1e6))
    assert p.step_ms(WIRE_ONLY, 0.1) == pytest.approx(180.0)
    assert p.step_ms(WIRE_ONLY, 0.01, latency_ms=5.0) == pytest.approx(910.0)
    trace = parse_trace(DIP, 2)
    assert time_on_trace_ms(p, 100, WIRE_ONLY, trace) == pytest.approx(26030.0)
    assert time_on_trace_ms(p, 50, WIRE_ONLY, trace) == pytest.approx(50 * 180.0)  # done before the dip
    # the 57th step starts at 10.080 s, in the dip: its half at 910 ms
    assert time_on_trace_ms(p, 56.5, WIRE_ONLY, trace) == pytest.approx(56 * 180.0 + 0.5 * 910.0)


def test_a_constant_trace_walks_as_the_constant_link_with_the_warm_up_first():
    results = _results(110.0, 10.0, 1.5e5, bytes_dense_per_step=4e6)
    results["exchange"]["warmup_steps"] = 40
    p = Profile.of(results)
    constant = parse_trace(HEAD + "0,*,10,2,0\n", 2)  # 2 + 2 ms between the two workers
    assert time_on_trace_ms(p, 100, WIRE_ONLY, constant) == pytest.approx(
        p.time_ms(100, WIRE_ONLY, 0.01, latency_ms=4.0))
    # the warm-up's dense steps come first: on a link that gets faster, before it does
    later = parse_trace(HEAD + "0,*,10,0,0\n30,*,1000,0,0\n", 2)
    dense, light = p.step_ms(WIRE_ONLY, 0.01, dense=True), p.step_ms(WIRE_ONLY, 0.01)
    assert 40 * dense > 30e3  # the warm-up outlasts the slow stretch: 30 s pass within it
    n = math.ceil(30e3 / dense)
    fast_dense = p.step_ms(WIRE_ONLY, 1.0, dense=True)
    assert time_on_trace_ms(p, 100, WIRE_ONLY, later) == pytest.approx(
        n * dense + (40 - n) * fast_dense + 60 * p.step_ms(WIRE_ONLY, 1.0))
    assert light < dense


def test_a_trace_link_runs_with_net_trace_and_is_named_after_its_file(tmp_path, monkeypatch):
    import compbench.race.main as race_module

    path = tmp_path / "dip.csv"
    path.write_text(DIP)
    seen: dict = {}
    monkeypatch.setattr(race_module, "check_jobs", lambda jobs, scratch: seen.update(jobs=jobs))
    monkeypatch.setattr(race_module, "run_jobs", lambda jobs, label: 0)
    monkeypatch.setattr(race_module, "write", lambda out, race, runs, quick, checks, whatif, not_run: "")
    assert race_module.main(["--quick", "--only", "ddp-adamw,diloco", "--out", str(tmp_path / "race"),
                             "--links", f"100,trace:{path}"]) == 0
    link = Link(55.0, 0.0, str(path.resolve()))
    assert trace_link(str(path), 2) == link
    assert (str(link), link.folder, link.label) == (f"trace:{path.resolve()}", "trace-dip",
                                                    "trace dip (mean 55 Mbit/s)")
    traced = [(run_dir, overrides) for run_dir, overrides in seen["jobs"]
              if run_dir.name.startswith("diloco-trace")]
    assert [d.name for d, _ in traced] == ["diloco-trace-dip-s0"]
    overrides = traced[0][1]
    assert f"net.trace={path.resolve()}" in overrides
    assert not any(o.startswith(("net.emulate_gbps", "net.emulate_latency_us")) for o in overrides)


@pytest.mark.parametrize("text, message", [
    (HEAD + "0,*,-5,0,0\n", "--links 100,trace:{path}: net.trace={path} row 2: mbps=-5 must be within "),
    (HEAD + "0,0,100,0,0\n", "net.trace={path}: rank(s) 1 have no setting at t_s=0 (a gap"),
    (HEAD + "0,*,100,0,0\n0,3,100,0,0\n", "row 3: rank=3 is beyond the job's 2 worker(s)"),
])
def test_a_bad_trace_is_one_error_line_and_exit_2_before_anything_is_written(text, message, tmp_path, capsys,
                                                                           no_runs):
    from compbench.cli.main import main

    path = tmp_path / "bad.csv"
    path.write_text(text)
    out = tmp_path / "race"
    with pytest.raises(SystemExit) as stop:
        main(["race", "--quick", "--only", "ddp-adamw,diloco", "--out", str(out), "--links",
              f"100,trace:{path}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and message.format(path=path) in err, err
    assert not out.exists()


@pytest.mark.parametrize("links, message", [
    ("trace:", "--links trace:: trace: names no trace"),
    ("100,trace:", "--links 100,trace:: trace: names no trace; give trace:NAME"),
    ("trace:no_such_trace", "--links trace:no_such_trace: net.trace=no_such_trace is not a shipped trace"),
])
def test_a_trace_link_that_names_no_trace_is_refused(links, message, no_runs):
    from compbench.race.main import main

    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        main(["--links", links])


# a trace that dips to 10 Mbit/s from 5 s to 10 s; the synthetic runs on it record their wall seconds
DIP_RACE = HEAD + "0,*,1000,0,0\n5,*,10,0,0\n10,*,1000,0,0\n"


def _race_with_a_trace(tmp_path: Path) -> tuple[list, Link]:
    path = tmp_path / "dip.csv"
    path.write_text(DIP_RACE)
    link = trace_link(str(path), 2)
    entries = _fake_race(tmp_path / "race", (Link(10), Link(100), Link(1000), link))
    for method, run_link, _, run_dir in entries:
        res = json.loads((run_dir / "results.json").read_text())
        for p in res["curve"]:
            if (method, run_link) == ("diloco", link):  # a slow stretch its median step does not show
                p["train_s"] = {50: 5.0, 100: 10.0, 150: 30.0, 200: 40.0}[p["step"]]
            p["wall_s"] = p["train_s"] + 2.0  # start-up before the first step
        (run_dir / "results.json").write_text(json.dumps(res))
    return entries, link


def test_the_report_shows_the_trace_and_predicts_by_walking_it(tmp_path, monkeypatch):
    import pandas as pd

    from compbench.race import to_target

    monkeypatch.setitem(to_target.VALIDATED, ("periodic", 1), 0.97)
    entries, link = _race_with_a_trace(tmp_path)
    out = tmp_path / "race"
    runs = load(entries)
    text = write(out, TEXT, runs, quick=False, checks=None)
    assert link.mbps == pytest.approx((1000 * 5 + 10 * 5) / 10)  # 505 Mbit/s: its mean over its 10 s
    # the fit reads the shaped links' runs alone: 12 out of sample as without the trace
    assert "12 of 12 runs on the other links within 15%" in text
    assert "## Links that change: traces" in text
    assert "**trace dip (mean 505 Mbit/s)** (`--links trace:" in text
    assert (": 10 s, 2 changes of the effective link, 10-1000 Mbit/s (time-weighted mean 505), one-way "
                "delay between two workers 0-0 ms, loss up to 0. After its 10 s its last settings hold: 6 of "
                "6 runs trained past its end") in text
    # diloco's prediction from its 1000 Mbit/s run, walking the trace over its 175 steps to the target
    model = fitted(runs)
    assert model is not None
    source = next(p for r, p in model.rows if (r.method, r.link, r.seed) == ("diloco", Link(1000), 0))
    trace = parse_trace(DIP_RACE, 2)
    walked = time_on_trace_ms(source, 175, model.fit, trace) / 1e3
    # measured on a trace: the training seconds at the crossing (halfway from 30 s to 40 s), not its
    # 175 steps x its median step of 100 ms
    assert _rows(text)[("diloco", str(link))][2] == "35.0 +- 0.0 s (2/2)"
    row = next(v for k, v in _rows(text).items() if k[0] == "diloco" and k[1].startswith("35.0"))
    assert row[2] == f"{walked:.1f}"
    table = pd.read_csv(out / "race.csv")
    on_trace = table[table["trace"].notna()]
    assert len(on_trace) == 6 and set(on_trace["trace"]) == {str((tmp_path / "dip.csv").resolve())}
    assert on_trace["link (Mbit/s)"].tolist() == pytest.approx([505.0] * 6)
    assert on_trace["wire ms/exchange"].isna().all()  # no one rate to take a wire time at
    diloco = on_trace[on_trace["method"] == "diloco"]
    assert diloco["time to target predicted (s)"].tolist() == pytest.approx([walked] * 2, rel=1e-5)
    assert diloco["time to target (s)"].tolist() == [35.0, 35.0]
    assert diloco["time to target at the measured step (s)"].tolist() == [35.0, 35.0]  # the wall clock's
    assert (out / "plots" / "trace_dip.png").stat().st_size > 10_000
    assert (out / "plots" / "curves_trace-dip.png").exists()


def test_a_shipped_trace_is_checked_for_every_methods_workers(no_runs):
    """The outage trace sets rank 1's link: the text race's one-worker DiLoCo has no rank 1, so the
    trace is refused for it, naming the method and the way round (--only)."""
    from compbench.race.main import main

    with pytest.raises(ValueError, match=r"--links trace:outage: net.trace=outage row 6: rank=1 is beyond "
                                         r"the job's 1 worker\(s\).*\(for diloco-1worker, on 1 worker\(s\): "
                                         r"--only leaves it out\)"):
        main(["--links", "trace:outage"])


@pytest.mark.skipif(not (can_shape() and has_tun()), reason="net.trace's check needs root, iproute2 and "
                                                            "/dev/net/tun (a trace that delays)")
def test_the_text_race_on_a_shipped_trace_composes_every_run(tmp_path):
    """The text race's methods of each kind (per step, periodic, a warm-up), on `--links trace:outage`,
    as the race makes their runs, pass the config check (the trace's own included; nothing written)."""
    from compbench.compose import config

    link = trace_link("outage", 2)
    assert (link.trace, link.folder, link.overrides) == ("outage", "trace-outage", ("net.trace=outage",))
    # rank 1's link at the floor rate for 60 s of the trace's 180: the slowest link's mean
    assert link.mbps == pytest.approx((100 * 120 + 0.001 * 60) / 180)
    for m in ("ddp-adamw", "diloco", "onebit-adam"):
        cfg = config.check(config.compose(
            [*TEXT.base, *TEXT.methods[m], *link.overrides, TEXT.quick_target, "stop_at_target=true",
             f"max_train_s={TEXT.quick_budget_s:g}", "budget_clock=unloaded", "nice=-20", "seed=0",
             f"output_dir={tmp_path / m}"]))
        assert cfg.net.trace == "outage" and cfg.net.get("emulate_gbps") is None
    assert not any(tmp_path.iterdir())
