"""sync=halos on real process groups (engine=torch over gloo, compbench's launcher) on the text workload
(model=gpt, dataset=shakespeare, tiny): it trains (rank 0's evaluation loss falls) and the servers' counts
in results.json match the settings: each LPS applies every update of its region's workers (H-step rounds
over max_steps) up to rank 0's stop, pushes to the GPS at most once per K updates and merges every
answer, the GPS's updates per region are that region's pushes. Under a 3x straggler rank 0 trains its
max_steps alone and its stop ends the straggler's training early. The servers' rates are raised from
the paper's (tuned for 16 workers and thousands of steps) so that a 40-step run moves."""

from __future__ import annotations

import math

import pytest

from tests.helpers import results, train

pytestmark = pytest.mark.dist

H, K, STEPS = 2, 2, 40
TEXT = ["model=gpt", "dataset=shakespeare", "model.n_layer=1", "model.n_embd=32", "model.n_head=2",
        "dataset.block_size=32", "dataset.eval_windows=16", "optim=adamw", "optim.lr=0.01",
        "optim.lr_schedule=constant", "batch_size=16", f"max_steps={STEPS}", "eval_points=2",
        "progress=false", "engine=torch", "sync=halos", f"sync.inner_steps={H}", f"sync.accumulation={K}",
        "sync.local_delay=2", "sync.local_lr=0.5", "sync.global_lr=0.5"]


def check_run(run, workers: int, regions: int) -> dict:
    r = results(run)
    evals = [c["eval/loss"] for c in r["curve"] if "eval/loss" in c]
    assert len(evals) == 2 and evals[-1] < evals[0] - 0.02 and evals[-1] < math.log(85) - 0.1, evals
    record = r["scheduler"]["halos"]
    per_region = workers // regions
    assert sorted(record["regions"]) == [str(i) for i in range(regions)]
    rounds = per_region * STEPS // H  # every worker's every round
    for region, lps in record["regions"].items():
        # rank 0 stops the others when it ends (independent learners): a worker still training then is
        # answered the stop at its next delivery (at most one each, not applied); a region none of whose
        # workers was stopped so applied every round of its workers
        assert lps["after_stop"] <= per_region and lps["updates"] + lps["after_stop"] <= rounds, record
        assert lps["after_stop"] > 0 or lps["updates"] == rounds, record
        assert 1 <= lps["pushes"] <= lps["updates"] // K, record
        assert lps["merges"] == lps["pushes"] == record["global_per_region"][region], record
    assert record["regions"]["0"]["updates"] >= STEPS // H, record  # rank 0's own rounds, all applied
    assert record["global_updates"] == sum(lps["pushes"] for lps in record["regions"].values())
    g = r["summary"]["goodput"]
    discarded = sum(lps["discarded_compute_s"] for lps in record["regions"].values())
    assert g["workers"] == workers and g["discarded_compute_s"] == pytest.approx(discarded, abs=2e-3)
    assert g["goodput"] + g["idle_share"] + g["discarded_share"] == pytest.approx(1.0, abs=2e-4)
    assert "checkpoint.pt" not in {p.name for p in run.iterdir()}  # the recipe's checkpoint=false
    return record


def test_two_regions_of_one_worker_train_and_count_their_servers(tmp_path):
    run, _ = train(tmp_path, *TEXT, "engine.np=2", "sync.regions=2")
    record = check_run(run, workers=2, regions=2)
    # a region of one worker: nobody else moves its LPS between its answer and its next update
    assert all(lps["staleness_max"] == 0 for lps in record["regions"].values()), record


@pytest.mark.slow  # the default tier's time: the trainer's path for independent learners is quorum_diloco's
# straggler test's (default tier), the LPS after the stop tests/unit/test_halos_rules.py's
def test_rank_0_trains_its_steps_alone_and_its_stop_ends_the_straggling_region(tmp_path):
    """Rank 1 computes 3x slower, each worker its own region: rank 0 never waits for it (no collective
    while they train: rank 0 alone evaluates), trains its max_steps, and its stop, sent by the GPS to
    LPS 1, reaches rank 1 with the answer to its next delivery, well before its max_steps."""
    # compute heavy enough (tens of ms a step) that rank 1's 3x, a sleep, outweighs the steps' overheads
    run, _ = train(tmp_path, *TEXT, "model.n_layer=2", "model.n_embd=128", "dataset.block_size=64",
                   "engine.np=2", "sync.regions=2", "fault=straggler", "fault.slow_rank=1",
                   "fault.slow_factor=3")
    r = results(run)
    record = r["scheduler"]["halos"]
    fast, slow = record["regions"]["0"], record["regions"]["1"]
    assert r["summary"]["steps"] == STEPS, r["summary"]["steps"]
    assert fast["updates"] == STEPS // H and fast["after_stop"] == 0, record
    # rank 1's rounds: those LPS 1 applied, then the one answered with the stop (discarded, counted)
    assert slow["after_stop"] == 1 and H * (slow["updates"] + 1) < STEPS, record
    assert slow["discarded_compute_s"] > 0 and fast["discarded_compute_s"] == 0, record
    assert slow["merges"] == slow["pushes"] == record["global_per_region"]["1"], record
    # rank 0 evaluated alone: its own model's loss, no average over the workers (a collective)
    evals = [c for c in r["curve"] if "eval/loss" in c]
    assert len(evals) == 2 and evals[-1]["step"] == STEPS and evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    assert not any("eval/loss_averaged" in c or "replica/distance" in c for c in r["curve"]), r["curve"]
    assert r["summary"]["final_eval_loss"] == evals[-1]["eval/loss"]
    g = r["summary"]["goodput"]
    assert g["workers"] == 2 and g["discarded_compute_s"] == slow["discarded_compute_s"], (g, record)
    assert g["goodput"] + g["idle_share"] + g["discarded_share"] == pytest.approx(1.0, abs=2e-4)


@pytest.mark.slow  # four processes on this 2-core machine
def test_four_workers_in_two_regions_train_and_count_their_servers(tmp_path):
    run, _ = train(tmp_path, *TEXT, "engine.np=4", "sync.regions=2")
    record = check_run(run, workers=4, regions=2)
    # two workers per LPS: each update is stale by the other's updates in between, at most by all of them
    assert all(lps["staleness_max"] <= STEPS // H for lps in record["regions"].values()), record
