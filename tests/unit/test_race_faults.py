"""The race under fault scenarios (compbench.race.scenarios, `compbench race --faults`): the what-if
model under a straggler against hand-computed figures (compbench.race.under_fault), the scenarios'
runs as the race makes them (their overrides, folders and config check), the refusals, and the
report's scenario and goodput columns, ranking and figure on a synthetic race (no training)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from compbench.comm.cost_model import Fit
from compbench.network.netem import can_shape
from compbench.race.main import main as race_main
from compbench.race.model import Profile
from compbench.race.report import load, write
from compbench.race.scenarios import SCENARIOS, parse_faults
from compbench.race.suites import TEXT, Link
from compbench.race.under_fault import under_straggler
from tests.unit.test_race import _results, _rows

WIRE_ONLY = Fit(ms_per_waited=0.0, ms_per_queued=0.0, ms_per_round=0.0, link_factor=1.0,
                machine_gb_per_s=math.inf)  # the wire's time alone: 1 MB allreduced by 2 at 100 Mbit/s, 80 ms
H = 30


def _profile(hidden: int = 0, quorum: dict | None = None, sync: str | None = None,
             per_worker: str | list[int] | None = None) -> Profile:
    """A step of 100 ms without communication (60 of compute, 10 of optimizer), 1 MB exchanged every
    30 steps between 2 workers; a quorum mode's settings where given, or another mode's."""
    results = _results(110.0, 10.0, 1e6 / H, every=H, hidden=hidden, compute_ms=60.0, optimizer_ms=10.0)
    if quorum is not None:
        results["config"]["choices"]["sync"] = "quorum_diloco"
        results["config"]["sync"] = {"window_factor": 0.1, "max_staleness": 4, **quorum}
    if sync is not None:
        results["config"]["choices"]["sync"] = sync
        results["config"]["sync"] = {"inner_steps_per_worker": per_worker}
    return Profile.of(results)


def test_lock_step_modes_take_the_stragglers_step():
    """s = 3: the straggler's step without communication f_s = 100 + 2 x 60 = 220 ms. DiLoCo: 220 + 80 /
    30; goodput (70 + 190) / (2 x step), its useful work 70 + 2 x 60 = 190 ms. Delayed DiLoCo (k = 1)
    hides the 80 ms behind the straggler's 30 x 220 ms: 220."""
    diloco, delayed = _profile(), _profile(hidden=H)
    for p in (diloco, delayed):  # no straggler: the plain model's step
        plain = under_straggler(p, WIRE_ONLY, 0.1, 1.0)
        assert plain.step_ms == pytest.approx(p.step_ms(WIRE_ONLY, 0.1))
        assert plain.goodput == pytest.approx(70 / plain.step_ms) and plain.lock_step
    lock = under_straggler(diloco, WIRE_ONLY, 0.1, 3.0)
    assert lock.step_ms == pytest.approx(220 + 80 / 30)
    assert lock.goodput == pytest.approx(260 / (2 * (220 + 80 / 30)))
    assert (lock.discarded_share, lock.lock_step) == (0.0, True)
    assert lock.idle_share == pytest.approx(1 - lock.goodput)
    late = under_straggler(delayed, WIRE_ONLY, 0.1, 3.0)
    assert (late.step_ms, late.goodput) == (pytest.approx(220.0), pytest.approx(260 / 440))
    # at 0.1 Mbit/s the exchange takes 80 s: exposed 80000 - 30 x 220 a round behind the straggler's k rounds
    slow_link = under_straggler(delayed, WIRE_ONLY, 1e-4, 3.0)
    assert slow_link.step_ms == pytest.approx(220 + (80_000 - 30 * 220) / 30)


def test_a_quorum_round_ends_with_the_quorums_slowest_plus_the_window():
    """Quorum 1 of 2, s = 3: a fast learner's round T_f = 30 x 100 + 80 = 3080 ms, the straggler's T_s =
    30 x 220 + 80 = 6680. A 2 s window: 3080 + 2000 < 6680, so the merges go on without it and one of
    them a straggler round waits the window: T = 3080 / (1 - 2000 / 6680); its gradient lags by
    floor(6680 / T) = 1 merge. Goodput: (30 x 70 / T + 30 x 190 / 6680) / 2."""
    fixed = under_straggler(_profile(quorum={"quorum": 1, "window_s": 2.0}), WIRE_ONLY, 0.1, 3.0)
    round_ms = 3080 / (1 - 2000 / 6680)
    assert fixed.step_ms == pytest.approx(round_ms / 30) and not fixed.lock_step
    assert fixed.goodput == pytest.approx((30 * 70 / round_ms + 30 * 190 / 6680) / 2)
    assert fixed.discarded_share == 0.0
    # adaptive: 0.1 x the fast round, 308 ms
    adaptive = under_straggler(_profile(quorum={"quorum": 1, "window_s": "adaptive"}), WIRE_ONLY, 0.1, 3.0)
    assert adaptive.step_ms == pytest.approx(3080 / (1 - 308 / 6680) / 30)
    # a window the straggler makes (4 s: 3080 + 4000 > 6680), an unbounded one, a quorum of all: lock-step
    for q in ({"quorum": 1, "window_s": 4.0}, {"quorum": 1, "window_s": None},
              {"quorum": None, "window_s": 2.0}):
        waits = under_straggler(_profile(quorum=q), WIRE_ONLY, 0.1, 3.0)
        assert waits.lock_step and waits.step_ms == pytest.approx(220 + 80 / 30), q
    # a lag of 1 merge beyond max_staleness 0: the straggler's work discarded, not idle
    lost = under_straggler(_profile(quorum={"quorum": 1, "window_s": 2.0, "max_staleness": 0}), WIRE_ONLY,
                           0.1, 3.0)
    assert lost.goodput == pytest.approx(30 * 70 / round_ms / 2)
    assert lost.discarded_share == pytest.approx(30 * 190 / 6680 / 2)
    assert lost.idle_share == pytest.approx(1 - lost.goodput - lost.discarded_share)


def test_per_worker_steps_train_the_straggler_fewer_steps_and_wait_for_nobody():
    """adaptive, s = 3: the straggler trains round(30 / 3) = 10 steps of 220 ms = 2200 ms against the fast
    worker's 30 x 100 = 3000: the round is the fast one's, 100 + 80 / 30 a step (no k). Goodput:
    (30 x 70 + 10 x 190) / (2 x 30 x step). A list [30, 5]: the straggler's 5. [30, 20]: 20 x 220 = 4400
    ms, longer than 3000: the round waits for it."""
    adaptive = under_straggler(_profile(sync="diloco", per_worker="adaptive"), WIRE_ONLY, 0.1, 3.0)
    step = 100 + 80 / 30
    assert adaptive.step_ms == pytest.approx(step) and not adaptive.lock_step
    assert adaptive.goodput == pytest.approx((30 * 70 + 10 * 190) / (2 * 30 * step))
    assert adaptive.discarded_share == 0.0
    listed = under_straggler(_profile(sync="diloco", per_worker=[30, 5]), WIRE_ONLY, 0.1, 3.0)
    assert listed.goodput == pytest.approx((30 * 70 + 5 * 190) / (2 * 30 * step))
    waits = under_straggler(_profile(sync="diloco", per_worker=[30, 20]), WIRE_ONLY, 0.1, 3.0)
    assert waits.step_ms == pytest.approx(4400 / 30 + 80 / 30) and waits.lock_step
    # no straggler: the plain model's step
    plain = _profile(sync="diloco", per_worker="adaptive")
    assert under_straggler(plain, WIRE_ONLY, 0.1, 1.0).step_ms == pytest.approx(plain.step_ms(WIRE_ONLY, 0.1))


def test_halos_workers_wait_only_for_their_servers_answer():
    """s = 3: rank 0's step 100 + 80 / 30, the straggler's 220 + 80 / 30; goodput (70 / step + 190 /
    step_s) / 2, nothing discarded, nobody waits for the straggler."""
    halos = under_straggler(_profile(sync="halos"), WIRE_ONLY, 0.1, 3.0)
    step, step_s = 100 + 80 / 30, 220 + 80 / 30
    assert halos.step_ms == pytest.approx(step) and not halos.lock_step
    assert halos.goodput == pytest.approx((70 / step + 190 / step_s) / 2) and halos.discarded_share == 0.0
    plain = _profile(sync="halos")
    assert under_straggler(plain, WIRE_ONLY, 0.1, 1.0).step_ms == pytest.approx(plain.step_ms(WIRE_ONLY, 0.1))


def test_a_scenarios_runs_get_its_overrides_and_folder():
    link = Link(100, 0.0, "", "straggler3x")
    assert (link.folder, link.label, str(link), link.fault) == (
        "100mbps-straggler3x", "100 Mbit/s, straggler3x", "100", "straggler3x")
    assert link.overrides == ("net.emulate_gbps=0.1", "fault=straggler", "fault.slow_rank=1",
                              "fault.slow_factor=3")
    assert Link(100).folder == "100mbps" and Link(100).fault == "none" and link.shaped == Link(100)
    assert [s.name for s in parse_faults("none,dropout")] == ["none", "dropout"]


@pytest.mark.parametrize("argv, message", [
    (["--faults", "straggler"],
     "--faults straggler: unknown scenario straggler; choose from none (no fault), "),
    (["--faults", "none,none"], "--faults none,none names none twice; give each once"),
    (["--faults", "straggler3x", "fault.slow_factor=5"], "fault.slow_factor is set by the race's fault "
                                                         "scenarios; drop it and pass --faults NAME,..."),
    (["--faults", "kill-rejoin", "engine.elastic=true"],
     "engine.elastic is set by the race's fault scenarios"),
    (["--faults", "kill-rejoin", "--only", "diloco,diloco-delayed"],
     "--only diloco-delayed --faults kill-rejoin: diloco-delayed cannot run under kill-rejoin "
     "(sync=delayed_diloco cannot change its number of workers (SyncTraits.elastic)); leave diloco-delayed "
     "out of --only, or kill-rejoin out of --faults"),
    (["--faults", "straggler3x", "--only", "diloco-1worker"],
     "diloco-1worker cannot run under straggler3x (it runs on 1 worker(s), and straggler3x needs 2"),
])
def test_bad_scenarios_are_refused_before_any_run(argv, message, monkeypatch):
    import compbench.race.main as race_module

    def fail(*args: object) -> None:
        raise AssertionError("the race got as far as its runs")

    monkeypatch.setattr(race_module, "check_jobs", fail)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        race_main(argv)


def test_a_bad_scenario_is_one_error_line_and_exit_2(capsys):
    from compbench.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["race", "--faults", "meteor"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and err.startswith("error: --faults meteor: unknown scenario meteor")


@pytest.mark.slow  # 14 runs' config checks and 20 compositions: about 30 s on an idle 2-core machine
@pytest.mark.skipif(not can_shape(),
                    reason="engine.elastic=true on one machine needs root (network namespaces)")
def test_every_method_a_scenario_applies_to_composes_and_the_others_are_listed(tmp_path, monkeypatch, capsys):
    """The text race at 100 Mbit/s under a straggler and a kill with a rejoin, as `compbench race
    --faults` makes its runs: every run passes the config check (compbench.cli.matrix.check_jobs, real),
    each folder names its scenario; the methods that cannot run under one are listed with why."""
    import compbench.race.main as race_module

    seen: dict = {}
    monkeypatch.setattr(race_module, "run_jobs", lambda jobs, label: seen.update(jobs=jobs) or 0)
    monkeypatch.setattr(race_module, "write", lambda *args: seen.update(not_run=args[-1]) or "")
    assert race_main(["--faults", "straggler3x,kill-rejoin", "--links", "100", "--seeds", "1",
                      "--out", str(tmp_path / "race")]) == 0
    names = sorted(d.name for d, _ in seen["jobs"])
    # not elastic (the delayed exchanges in flight, the synchronizer on rank 0, 1-bit Adam's recipe's
    # comm=ps with its per-rank server shards, the steps per worker of the workers that started, HALoS's
    # servers' threads), and one worker
    not_elastic = {"diloco-delayed", "diloco-quorum", "onebit-adam", "diloco-1worker", "diloco-perworker",
                   "halos"}
    assert names == sorted([*(f"{m}-100mbps-straggler3x-s0" for m in TEXT.methods if m != "diloco-1worker"),
                            *(f"{m}-100mbps-kill-rejoin-s0" for m in TEXT.methods if m not in not_elastic)])
    assert set(seen["not_run"]["kill-rejoin"]) == not_elastic
    assert seen["not_run"]["straggler3x"] == {
        "diloco-1worker": "it runs on 1 worker(s), and straggler3x needs 2 or more (a rank 1)"}
    overrides = dict(seen["jobs"])[tmp_path / "race" / "runs" / "diloco-100mbps-kill-rejoin-s0"]
    assert [o for o in overrides if o.startswith(("fault", "engine.elastic"))] == \
        list(SCENARIOS["kill-rejoin"].overrides[:-1]) + ["engine.elastic=true"]
    out = capsys.readouterr().out
    assert ("race: diloco-delayed not run under kill-rejoin: sync=delayed_diloco cannot change its number of "
            "workers (SyncTraits.elastic)") in out


def _fake_fault_race(out: Path) -> tuple[list, dict]:
    """diloco and diloco-quorum at 100 Mbit/s with no fault and with the straggler, 2 seeds each: the
    quorum's steps 120 ms under it, DiLoCo's 300 (it waits); 175 steps to the target each; goodput as
    a run records it."""
    entries = []
    steps = {("diloco", ""): 100.0, ("diloco-quorum", ""): 100.0, ("diloco", "straggler3x"): 300.0,
             ("diloco-quorum", "straggler3x"): 120.0}
    # (goodput, idle share, step goodput); 0.1 discarded in every run
    good = {("diloco", ""): (0.6, 0.3, 0.65), ("diloco-quorum", ""): (0.6, 0.3, 0.65),
            ("diloco", "straggler3x"): (0.45, 0.45, 0.5), ("diloco-quorum", "straggler3x"): (0.7, 0.2, 0.75)}
    for (m, scenario), step in steps.items():
        link = Link(100, 0.0, "", scenario)
        for seed in (0, 1):
            run_dir = out / "runs" / f"{m}-{link.folder}-s{seed}"
            run_dir.mkdir(parents=True)
            res = _results(step, step - 90.0, 1e6 / H, every=H, compute_ms=60.0, optimizer_ms=10.0, steps=200,
                           tokens_per_s=4096e3 / step, utilization=60.0 / step, step_ms_q1=step,
                           step_ms_q3=step,
                           target={"metric": "eval/loss", "value": 2.3, "reached": True, "step": 200,
                                   "train_s": 200 * step / 1e3},
                           goodput=dict(zip(("goodput", "idle_share", "step_goodput"), good[(m, scenario)],
                                            strict=True), discarded_share=0.1))
            if m == "diloco-quorum":
                res["config"]["choices"]["sync"] = "quorum_diloco"
                res["config"]["sync"] = {"quorum": 1, "window_s": 2.0, "window_factor": 0.1,
                                         "max_staleness": 4}
            res["curve"] = [{"step": s, "tokens": 4096 * s, "train_s": s * step / 1e3,
                             "eval/loss": 3.0 - s / 250} for s in (50, 100, 150, 200)]
            res["environment"] = {"world_size": 2, "threads_per_rank": 1, "nice": -20, "cores": 2,
                                  "own_threads": 2, "load_before": 0.4, "load_after": 2.1,
                                  "others_runnable": 0.1}
            (run_dir / "results.json").write_text(json.dumps(res))
            entries.append((m, link, seed, run_dir))
    return entries, {"straggler3x": {"diloco-1worker": "it runs on 1 worker(s)"}}


def test_the_report_ranks_per_link_and_scenario_with_goodput_beside(tmp_path):
    entries, not_run = _fake_fault_race(tmp_path)
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=None, not_run=not_run)
    rows = _rows(text)
    # the main table: the scenario and the goodput beside every row, the loaded runs last
    assert rows[("diloco", "100")][-3:] == ["none", "0.60 (idle 0.3, discarded 0.1)", "0/2"]
    # under the straggler, 175 steps: the quorum 175 x 120 ms = 21 s first, DiLoCo 175 x 300 ms = 52.5 s
    ranked = rows[("100", "straggler3x")]
    assert ranked[2] == "diloco-quorum 21.0 s (goodput 0.7) < diloco 52.5 s (goodput 0.45)"
    assert ranked[4] == "diloco-1worker" and ranked[5] == "diloco-quorum < diloco"
    assert rows[("100", "none")][4] == "-"
    assert "Not run under straggler3x: diloco-1worker: it runs on 1 worker(s)." in text
    # measured beside predicted, from each method's run without a fault: DiLoCo waits, the quorum does not
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
             if line.startswith("|")]
    waits = {c[0]: c[9] for c in cells if c[1:3] == ["100", "straggler3x"] and len(c) == 11}
    assert waits == {"diloco": "yes", "diloco-quorum": "no"}
    with open(tmp_path / "race.csv") as f:
        table = list(csv.DictReader(f))
    firsts = [r for r in table if r["seed"] == "0"]
    assert {(r["method"], r["fault scenario"], r["goodput"], r["step goodput"]) for r in firsts} == {
        ("diloco", "none", "0.6", "0.65"), ("diloco-quorum", "none", "0.6", "0.65"),
        ("diloco", "straggler3x", "0.45", "0.5"), ("diloco-quorum", "straggler3x", "0.7", "0.75")}
    assert (tmp_path / "plots" / "goodput.png").stat().st_size > 0
    assert (tmp_path / "runs" / "diloco-100mbps-straggler3x-s0").is_dir()
