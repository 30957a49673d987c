"""compbench race's pieces without running trainings: the what-if model of every mode (its step time
from what a run measured and what its mode declares, the fit, the crossover bandwidth), the report
on synthetic runs (tables, plots, targets), and the command's refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compbench.comm.cost_model import Fit
from compbench.race.main import main as race_main
from compbench.race.model import BACKWARD_SHARE, Profile, crossover_gbps, crossover_rtt_ms, fit_model
from compbench.race.report import load, write
from compbench.race.suites import TEXT, Link
from compbench.race.targets import text_targets

FIT = Fit(ms_per_waited=0.0, ms_per_queued=0.5, ms_per_round=0.2, link_factor=1.0, machine_gb_per_s=math.inf)


def _results(step_ms: float, comm_ms: float, sent: float, every: int = 1, hidden: int = 0,
             overlaps: bool = False, comm: str = "allreduce", **summary) -> dict:
    return {"config": {"choices": {"comm": comm}, "max_train_s": 90},
            "environment": {"world_size": 2},
            "exchange": {"every": every, "pattern": comm, "hidden_steps": hidden,
                         "overlaps_backward": overlaps},
            "summary": {"status": "completed", "step_ms": step_ms, "comm_ms": comm_ms, "compute_ms": 100.0,
                        "bytes_sent_per_step": sent, "bytes_allreduce_per_step": 0,
                        "bytes_dense_per_step": 4e6, "compressed_calls_per_step": 1.0 / every,
                        "dense_calls_per_step": 0, **summary},
            "curve": []}


def test_a_mode_hides_its_exchange_behind_what_it_declares():
    per_step = Profile.of(_results(110.0, 10.0, 1e6))
    assert per_step.fixed_ms == 100.0
    wire = 1e6 * 8 / 1e8 * 1e3  # 1 MB over 100 Mbit/s: the busiest link carries one payload
    comm = FIT.comm_ms(per_step.terms(0.1))
    assert comm == pytest.approx(0.5 + 0.2 * 2 + wire)  # one allreduce: 2 rounds, S/N twice
    assert per_step.step_ms(FIT, 0.1) == pytest.approx(100.0 + comm)
    assert per_step.step_ms(FIT, 0.1, latency_ms=5.0) == pytest.approx(100.0 + comm + 2 * 5.0)
    overlapped = Profile.of(_results(110.0, 10.0, 1e6, overlaps=True))
    assert overlapped.step_ms(FIT, 0.1) == pytest.approx(100.0 + comm - BACKWARD_SHARE * 100.0)
    rounds = Profile.of(_results(110.0, 10.0, 1e6 / 30, every=30))  # a mean over the round
    assert rounds.step_ms(FIT, 0.1) == pytest.approx(100.0 + comm / 30)
    eager = Profile.of(_results(110.0, 10.0, 1e6 / 30, every=30, hidden=30))
    assert eager.step_ms(FIT, 0.1) == 100.0 and eager.step_ms(FIT, 0.0001) > 100.0  # hidden unless slow


def test_a_warm_up_is_dense():
    """1-bit Adam's first steps exchange the gradients' fp32 bytes: time to S steps counts them."""
    results = _results(110.0, 10.0, 1.5e5, bytes_dense_per_step=4e6)
    results["exchange"]["warmup_steps"] = 40
    p = Profile.of(results)
    dense, light = p.step_ms(FIT, 0.01, dense=True), p.step_ms(FIT, 0.01)
    assert dense == pytest.approx(100.0 + FIT.comm_ms(p.terms(0.01, dense=True)))
    assert dense > 10 * light  # 4 MB against 150 kB at 10 Mbit/s
    assert p.time_ms(100, FIT, 0.01) == pytest.approx(40 * dense + 60 * light)
    assert p.time_ms(30, FIT, 0.01) == pytest.approx(30 * dense)


def test_the_fit_recovers_the_network_and_finds_the_crossover():
    profiles = [Profile.of(_results(110.0, 10.0, sent, every=every))
                for sent, every in ((4e6, 1), (2e5, 1), (1e6, 1), (3e6 / 30, 30), (5e5, 1), (8e6, 1))]
    rows = [(p, g, 0.0, p.step_ms(FIT, g), False) for p in profiles for g in (0.01, 0.1, 1.0)]
    fit = fit_model(rows)
    assert fit.latency_factor == 1.0  # one delay: not fitted
    for p, g, _, step, _ in rows:
        assert p.step_ms(fit, g) == pytest.approx(step, rel=1e-6)
    dense, small = profiles[0], profiles[1]
    gbps, where = crossover_gbps(small, 120, dense, 100, FIT)  # more steps, far fewer bytes
    assert where == "below" and 0.001 < gbps < 100
    assert 120 * small.step_ms(FIT, gbps * 0.9) < 100 * dense.step_ms(FIT, gbps * 0.9)
    assert 120 * small.step_ms(FIT, gbps * 1.2) > 100 * dense.step_ms(FIT, gbps * 1.2)
    assert crossover_gbps(dense, 100, dense, 100, FIT)[1] == "nowhere"


def test_the_fit_takes_the_delay_per_round_from_runs_at_two_delays_and_finds_the_round_trip_crossover():
    """Runs with 0 and 25 ms each way: the delay's factor per round is fitted (here 1.5: TCP waits more
    round trips than the collective's own); DiLoCo, one exchange every 30 steps, overtakes DDP above a
    round trip the model finds."""
    truth = Fit(0.0, 0.5, 0.2, 1.0, math.inf, latency_factor=1.5)
    profiles = [Profile.of(_results(110.0, 10.0, sent, every=every))
                for sent, every in ((4e6, 1), (2e5, 1), (1e6, 1), (3e6 / 30, 30), (5e5, 1), (8e6, 1))]
    rows = [(p, g, lat, p.step_ms(truth, g, latency_ms=lat), False)
            for p in profiles for g in (0.01, 0.1, 1.0) for lat in (0.0, 25.0)]
    fit = fit_model(rows)
    assert fit.latency_factor == pytest.approx(1.5, rel=1e-6)
    for p, g, lat, step, _ in rows:
        assert p.step_ms(fit, g, latency_ms=lat) == pytest.approx(step, rel=1e-6)
    ddp, diloco = profiles[0], profiles[3]
    rtt, where = crossover_rtt_ms(diloco, 300, ddp, 100, fit, gbps=1.0)  # 3x the steps: needs a slow link
    assert where == "above" and 0.01 < rtt < 2000
    one_way = rtt / 2
    for factor, wins in ((1.1, True), (0.9, False)):
        assert (300 * diloco.step_ms(fit, 1.0, latency_ms=one_way * factor)
                < 100 * ddp.step_ms(fit, 1.0, latency_ms=one_way * factor)) == wins


def _fake_race(out: Path, links: tuple[Link, ...] = (Link(10), Link(100), Link(1000))) -> list:
    import json

    entries = []
    for m, sent, every in (("ddp-adamw", 3.2e6, 1), ("diloco", 3.2e6 / 30, 30), ("onebit-adam", 1.5e5, 1)):
        for link in links:
            mbps = link.mbps
            for seed in (0, 1):
                run_dir = out / "runs" / f"{m}-{link.folder}-s{seed}"
                run_dir.mkdir(parents=True)
                p = Profile.of(_results(110.0, 10.0, sent, every=every, hidden=every if every > 1 else 0))
                step = p.step_ms(FIT, mbps / 1e3, latency_ms=link.delay_ms)
                reached = m != "ddp-adamw" or mbps == 1000.0 or (mbps == 100.0 and seed == 1)
                # the loaded run: other work stretched its wall-clock steps by 1.6x, not its estimate
                loaded = (m, mbps, seed) == ("diloco", 10.0, 1)
                wall = 1.6 * step if loaded else step
                res = _results(wall, step - 100.0, sent, every=every, hidden=every if every > 1 else 0,
                               tokens_per_s=4096e3 / wall, utilization=100.0 / step,
                               comm_exposed_ms=step - 100.0, steps=200, step_ms_q1=0.9 * wall,
                               step_ms_q3=1.1 * wall, decompress_ms=0.0, peak_bytes_per_step=sent * every,
                               loaded=loaded, **({"step_unloaded_ms": step, "step_unloaded_ms_q1": 0.9 * step,
                                                  "step_unloaded_ms_q3": 1.1 * step} if loaded else {}),
                               target={"metric": "eval/loss", "value": 2.3, "reached": reached, "step": 200,
                                       "train_s": 200 * step / 1e3 + seed})
                # reached between steps 150 (2.4) and 200 (2.2, 2.3 in the seeds that miss it): at 175
                slope = 250 if reached else 300
                res["curve"] = [{"step": s, "tokens": 4096 * s, "train_s": s * step / 1e3,
                                 "eval/loss": 3.0 - s / slope} for s in (50, 100, 150, 200)]
                # what ran, as a run records it: idle (a tenth of a core of other work) or beside a busy
                # loop per core
                res["environment"] = {"world_size": 2, "threads_per_rank": 1, "nice": -20, "cores": 2,
                                      "own_threads": 2, "load_before": 0.4,
                                      "load_after": 4.1 if loaded else 2.1,
                                      "others_runnable": 2.1 if loaded else 0.1}
                res["config"]["budget_clock"] = "unloaded"
                (run_dir / "results.json").write_text(json.dumps(res))
                entries.append((m, link, seed, run_dir))
    return entries


def _rows(text: str) -> dict[tuple[str, ...], list[str]]:
    """The markdown tables' rows by their first two cells (a table's row is `| a | b | ... |`)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    rows: dict[tuple[str, ...], list[str]] = {}
    for c in cells:  # the first table's row where two share their first cells (a method and a link)
        rows.setdefault(tuple(c[:2]), c)
    return rows


EVERYWHERE = ("at every bandwidth the runs had (10-1000 Mbit/s); extrapolated: at every bandwidth from 0.1 "
              "Mbit/s to 100 Gbit/s")


@pytest.fixture
def validated(monkeypatch):
    """The unloaded estimate validated for periodic methods beside a busy loop per core (the fake
    race's loaded run), as scripts/validate_unloaded.py's measurements would."""
    from compbench.race import to_target

    monkeypatch.setitem(to_target.VALIDATED, ("periodic", 1), 0.97)


def test_the_report_tables_plots_and_targets(tmp_path, validated):
    entries = _fake_race(tmp_path)
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=text_targets)
    rows = _rows(text)
    # 175 steps to the target (tokens read off the curve) of 100 ms: 17.5 s in both seeds, whose wall-clock
    # seconds to it (200 steps, the seeds 1 s apart) are 20.0 and 21.0; the loaded seed's step is its
    # unloaded estimate (its wall-clock step 1.6x longer), so are its tokens/s; the crossing lies between
    # evaluations 50 steps apart: +- 25 steps of 100 ms
    assert rows[("diloco", "10")][2:8] == ["17.5 +- 0.0 s (2/2)", "+-2.5 s, +-25 steps",
                                           "wall clock; 1/2 unloaded estimate", "20.5", "716,800", "40,960"]
    assert rows[("diloco", "10")][-1] == "1/2"  # one of its runs ran on a loaded machine
    assert rows[("ddp-adamw", "10")][2] == "not reached (0/2; best 2.333)"
    assert rows[("ddp-adamw", "100")][2].startswith("not reached (1/2; ")
    # out of sample: the 12 runs on the links other than the fastest
    assert "12 of 12 runs on the other links within 15%" in text
    assert rows[("ddp-adamw", "- (the baseline)")]
    assert rows[("diloco", EVERYWHERE)]
    assert rows[("onebit-adam tokens/s >= 1.4x ddp-adamw's at 100 Mbit/s", "yes")]
    assert not any(key[0].startswith("demo") for key in rows)  # only the methods that ran
    assert rows[("diloco (eager) at 10 Mbit/s computes >= 95% of its step", "yes")]
    assert "1 of 18 runs ran on a loaded machine" in text
    # what ran, as recorded; the verdict per link on both clocks, the loaded run's estimate validated
    assert ("What ran (the runs' results.json): 2 workers of 1 compute thread(s) each, at nice -20, the "
            "budget on the unloaded clock; seeds 2; 1 of 18 runs loaded; other work 0.05-1.05 busy loops per "
            "core, load average 0.4-4.1 on 2 cores.") in text
    verdict = rows[("10", "diloco 17.5 +- 0.0 s (crossing +-2.5) < onebit-adam 38.7 +- 0.0 s "
                          "(crossing +-5.5)")]
    assert verdict[2].startswith("diloco 22.8 +- 5.2 s")  # by the wall clock: the loaded seed at 160 ms
    assert verdict[-1] == "diloco < onebit-adam (not reached in every seed: ddp-adamw)"
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert plots == ["curves_1000mbps.png", "curves_100mbps.png", "curves_10mbps.png", "time_to_target.png",
                     "utilization.png"]


def test_a_link_with_delay_has_its_rows_its_plot_and_the_round_trip_crossover(tmp_path):
    entries = _fake_race(tmp_path, (Link(100), Link(1000), Link(200, 25)))
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=text_targets)
    rows = _rows(text)
    assert rows[("diloco", "200:25")][2] == "17.5 +- 0.0 s (2/2)"  # the same steps, the link's step time
    assert "1.00 ms per ms of one-way delay per round (fitted on runs at 0, 25 ms)" in text
    assert "of the runs with delay, 6 of 6" in text
    header = next(x for x in text.splitlines() if x.startswith("| method ") and "round trips" in x)
    assert "... at 200 Mbit/s, round trips" in header
    everywhere = EVERYWHERE.replace("10-1000", "100-1000")
    assert rows[("diloco", everywhere)][2] == ("at every round trip up to 2 s (extrapolated: the runs' round "
                                               "trips up to 50 ms)")
    assert "links 100 Mbit/s; 200 Mbit/s, 25 ms; 1000 Mbit/s" in text
    assert (tmp_path / "plots" / "curves_200mbps-25ms.png").exists()
    import pandas as pd

    runs = pd.read_csv(tmp_path / "race.csv")
    assert sorted(set(runs["one-way delay (ms)"])) == [0.0, 25.0]
    # the exposed-communication check leaves the link with delay out (its round trips are the model's)
    assert "onebit-adam at 200:25" not in text


def test_the_curve_plots_show_markers_units_the_target_and_start_at_zero(tmp_path, monkeypatch):
    """Read off the figures themselves (kept open instead of closed): every evaluation a marker, every
    seed a line, the axes' units, a labelled target line, x from 0, a quick race marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    write(tmp_path, TEXT, load(_fake_race(tmp_path)), quick=True, checks=text_targets)
    curves = {f.axes[0].get_title(): f.axes[0] for f in figures
              if f.axes[0].get_xlabel().startswith("training seconds")}
    ax = curves["text race, 10 Mbit/s (quick: not evidence)"]
    assert ax.get_ylabel() == "eval/loss (nats/token)" and ax.get_xlim()[0] == 0
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["target 2.3"].get_linestyle() == ":"
    seeds = [line for line in ax.get_lines() if not line.get_label().startswith("target")]
    assert len(seeds) == 6 and all(len(line.get_xdata()) == 4 for line in seeds)
    assert len({line.get_marker() for line in seeds}) == 3  # a marker per method, with its colour
    assert [line.get_linestyle() for line in seeds].count("--") == 1  # the loaded run's: dashed
    assert {text.get_text() for text in ax.get_legend().get_texts()} == {
        "ddp-adamw", "diloco", "onebit-adam", "target 2.3",
        "dashed: a loaded run (its wall clock\nstretched by other work)"}
    assert ax.get_xlabel() == "training seconds, wall clock (s)"
    for figure in figures:
        close(figure)


def test_the_csvs_are_tidy_numbers_a_lab_reads(tmp_path):
    import pandas as pd

    write(tmp_path, TEXT, load(_fake_race(tmp_path)), quick=False, checks=text_targets)
    runs = pd.read_csv(tmp_path / "race.csv")
    assert len(runs) == 18
    assert list(runs.columns[:5]) == ["method", "link (Mbit/s)", "one-way delay (ms)", "seed", "reached"]
    for column in ("link (Mbit/s)", "tokens to target", "step ms", "time to target (s)", "tokens/s",
                   "bytes per token", "load before"):
        assert pd.api.types.is_numeric_dtype(runs[column]), column
    diloco = runs[(runs["method"] == "diloco") & (runs["link (Mbit/s)"] == 10)]
    assert diloco["tokens to target"].tolist() == [716800.0, 716800.0]  # 175 steps of 4096 tokens
    # 50 steps between the evaluations around the crossing
    assert diloco["tokens to target resolution"].tolist() == [204800.0, 204800.0]
    assert diloco["loaded"].tolist() == [False, True]
    assert diloco["step ms"].tolist() == [100.0, 100.0]  # the loaded seed's: its unloaded estimate
    assert diloco["step ms measured"].tolist() == [100.0, 160.0]
    assert diloco["time to target (s)"].tolist() == [17.5, 17.5]
    # the clocks named: the loaded seed's time on its estimate, 28.0 s at its measured (wall) step
    assert diloco["step clock"].tolist() == ["wall clock", "unloaded estimate"]
    assert diloco["time to target at the measured step (s)"].tolist() == [17.5, 28.0]
    assert diloco["steps to target resolution"].tolist() == [50.0, 50.0]
    assert diloco["family"].tolist() == ["periodic", "periodic"]
    curves = pd.read_csv(tmp_path / "race_curves.csv")
    assert len(curves) == 18 * 4 and pd.api.types.is_numeric_dtype(curves["eval/loss"])


def test_a_race_with_no_target_reached_says_no_verdict(tmp_path):
    """The budget reached no target: no ratio is rated from a handful of steps."""
    import json

    entries = _fake_race(tmp_path)
    for *_, run_dir in entries:
        res = json.loads((run_dir / "results.json").read_text())
        res["summary"]["target"]["reached"] = False
        res["summary"]["steps"] = 18  # 13 after the warm-up
        (run_dir / "results.json").write_text(json.dumps(res))
    text = write(tmp_path, TEXT, load(entries), quick=True, checks=text_targets)
    assert "**No verdict: no method reached the target within the budget (90 s of training)" in text
    rows = _rows(text)
    assert rows[("onebit-adam tokens/s >= 1.4x ddp-adamw's at 100 Mbit/s", "no verdict")][2] == \
        "budget too small: 13 steps after the warm-up (< 20)"
    assert text.startswith("# Race: text (quick: not evidence)")


@pytest.mark.parametrize("argv, message", [
    (["--links", "ten"], "--links ten must be a comma-separated list of links, each a rate in Mbit/s from 1 "
                         "to 1e+06 and optionally a one-way delay in ms >= 0 after a colon, e.g. --links "
                         "10,200:25"),
    (["--links", "0,10"], "--links 0,10 must be a comma-separated list"),
    (["--links", "100:-5"], "--links 100:-5 must be a comma-separated list"),
    (["--links", "100:x"], "--links 100:x must be a comma-separated list"),
    (["--links", "100,200:25,100.0"], "--links 100,200:25,100.0 names 100 twice; give each once"),
    (["--only", "ddp,nope"], "--only ddp,nope: unknown method ddp, nope; choose from ddp-adamw, ddp-fp16, "),
    (["--seeds", "0"], "--seeds 0 must be within 1 to 10"),
])
def test_bad_arguments_are_refused(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        race_main(argv)


def test_one_bit_adam_races_three_seeds_and_the_flags_set_every_method():
    assert TEXT.seeds_of("onebit-adam", None, quick=False) == 3
    assert TEXT.seeds_of("ddp-adamw", None, quick=False) == TEXT.seeds == 2
    assert {TEXT.seeds_of(m, None, quick=True) for m in TEXT.methods} == {1}
    assert {TEXT.seeds_of(m, 4, quick=False) for m in TEXT.methods} == {4}


def test_a_run_is_judged_loaded_by_todays_rule_on_its_recorded_loads():
    from compbench.race.report import Run

    def run(before: float, after: float, flag: bool) -> Run:
        env = {"load_before": before, "load_after": after, "own_threads": 2, "cores": 2}
        summary = {"status": "completed", "loaded": flag}
        return Run("ddp-adamw", Link(100.0), 0, {"summary": summary, "environment": env})

    assert not run(2.3, 2.1, flag=True).loaded  # the previous run in the load before: not another job
    assert run(0.5, 3.0, flag=False).loaded
    assert Run("ddp-adamw", Link(100.0), 0, {"summary": {"status": "completed", "loaded": True}}).loaded


def test_the_report_says_the_cpu_priority_the_runs_recorded():
    """race.md said `nice -20` (the race's default) for runs made with nice=10."""
    from types import SimpleNamespace

    from compbench.race.report import _niceness

    def cell(*nices):
        return SimpleNamespace(done=[SimpleNamespace(results={"environment": {"nice": n}}) for n in nices])

    assert _niceness({("a", None): cell(10, 10), ("b", None): cell(10)}) == "nice +10"
    assert _niceness({("a", None): cell(-20), ("b", None): cell(0)}) == "nice -20, 0"
    assert _niceness({("a", None): cell(None)}) == "a CPU priority they did not record"
