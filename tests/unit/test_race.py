"""compbench race's pieces without running trainings: the what-if model of every mode (its step time
from what a run measured and what its mode declares, the fit, the crossover bandwidth), the report
on synthetic runs (tables, plots, targets), and the command's refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compbench.comm.cost_model import Fit
from compbench.race.main import main as race_main
from compbench.race.model import BACKWARD_SHARE, Profile, crossover_gbps, fit_model
from compbench.race.report import load, write
from compbench.race.suites import TEXT
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
    rows = [(p, g, p.step_ms(FIT, g), False) for p in profiles for g in (0.01, 0.1, 1.0)]
    fit = fit_model(rows)
    for p, g, step, _ in rows:
        assert p.step_ms(fit, g) == pytest.approx(step, rel=1e-6)
    dense, small = profiles[0], profiles[1]
    gbps, where = crossover_gbps(small, 120, dense, 100, FIT)  # more steps, far fewer bytes
    assert where == "below" and 0.001 < gbps < 100
    assert 120 * small.step_ms(FIT, gbps * 0.9) < 100 * dense.step_ms(FIT, gbps * 0.9)
    assert 120 * small.step_ms(FIT, gbps * 1.2) > 100 * dense.step_ms(FIT, gbps * 1.2)
    assert crossover_gbps(dense, 100, dense, 100, FIT)[1] == "nowhere"


def _fake_race(out: Path) -> list:
    import json

    entries = []
    for m, sent, every in (("ddp-adamw", 3.2e6, 1), ("diloco", 3.2e6 / 30, 30), ("onebit-adam", 1.5e5, 1)):
        for mbps in (10.0, 100.0, 1000.0):
            for seed in (0, 1):
                run_dir = out / "runs" / f"{m}-{mbps:g}mbps-s{seed}"
                run_dir.mkdir(parents=True)
                p = Profile.of(_results(110.0, 10.0, sent, every=every, hidden=every if every > 1 else 0))
                step = p.step_ms(FIT, mbps / 1e3)
                reached = m != "ddp-adamw" or mbps == 1000.0 or (mbps == 100.0 and seed == 1)
                res = _results(step, step - 100.0, sent, every=every, hidden=every if every > 1 else 0,
                               tokens_per_s=4096e3 / step, utilization=100.0 / step,
                               comm_exposed_ms=step - 100.0,
                               decompress_ms=0.0, peak_bytes_per_step=sent * every,
                               target={"metric": "eval/loss", "value": 2.3, "reached": reached, "step": 200,
                                       "train_s": 200 * step / 1e3 + seed})
                res["curve"] = [{"step": s, "train_s": s * step / 1e3, "eval/loss": 3.0 - s / 300}
                                for s in (50, 100, 150, 200)]
                (run_dir / "results.json").write_text(json.dumps(res))
                entries.append((m, mbps, seed, run_dir))
    return entries


def test_the_report_tables_plots_and_targets(tmp_path):
    entries = _fake_race(tmp_path)
    text = write(tmp_path, TEXT, load(entries), quick=False, checks=text_targets)
    assert "| diloco | 10 | 20.5 +- 0.5 s (2/2) |" in text  # 200 steps of 100 ms, the seeds 1 s apart
    assert "| ddp-adamw | 10 | not reached (0/2; best 2.333) |" in text
    assert "| ddp-adamw | 100 | not reached (1/2; 72.4 s by 1, the others' best 2.333) |" in text
    assert "18 of 18 within 15%" in text
    assert "| ddp-adamw | - (the baseline) |" in text and "| diloco | at every bandwidth" in text
    assert "| onebit-adam tokens/s >= 1.4x ddp-adamw's at 100 Mbit/s | yes |" in text
    assert "| demo tokens/s >= 1x ddp-adamw's at 1000 Mbit/s | no run | - |" in text
    assert "| diloco (eager) at 10 Mbit/s computes >= 95% of its step | yes |" in text
    plots = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert plots == ["curves_1000mbps.png", "curves_100mbps.png", "curves_10mbps.png", "time_to_target.png",
                     "utilization.png"]
    assert (tmp_path / "race.csv").read_text().count("\n") == 1 + 9


@pytest.mark.parametrize("argv, message", [
    (["--links", "ten"], "--links ten must be a comma-separated list of link rates in Mbit/s > 0"),
    (["--links", "0,10"], "--links 0,10 must be a comma-separated list"),
    (["--only", "ddp,nope"], "--only ddp,nope: unknown method ddp, nope; choose from ddp-adamw, diloco"),
    (["--seeds", "0"], "--seeds 0 must be >= 1"),
])
def test_bad_arguments_are_refused(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("+", r"\+")):
        race_main(argv)
