"""sync=quorum_diloco on real process groups (engine=torch over gloo, compbench's launcher): with no
faults and a quorum of every worker it equals sync=diloco bit for bit; with a 3x straggler and a
quorum of 3 of 4, the fast learners' merges go ahead without it and its late outer gradients are
counted; both runs record their goodput."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TINY, results, train

pytestmark = pytest.mark.dist

RUN = [*TINY, "engine=torch", "optim=adamw", "sync.inner_steps=3"]


def test_a_quorum_of_every_worker_without_faults_is_diloco_bit_for_bit(tmp_path):
    common = [*RUN, "engine.np=2", "batch_size=16", "max_steps=12"]
    diloco, _ = train(tmp_path, *common, "sync=diloco", name="diloco")
    quorum, _ = train(tmp_path, *common, "sync=quorum_diloco", name="quorum")
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (diloco, quorum))
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for rank in (0, 1):  # every learner's own parameters at the end, not only rank 0's
        assert all(torch.equal(x, y) for x, y in zip(a["per_rank"][rank]["local_params"],
                                                     b["per_rank"][rank]["local_params"], strict=True))
    ra, rb = results(diloco), results(quorum)
    assert ra["summary"]["final_test_loss"] == rb["summary"]["final_test_loss"]
    record = rb["scheduler"]["quorum_record"]
    assert record["merges"] == 4 and record["merges_short"] == 0 and record["fresh"] == 8
    for r in (ra, rb):
        g = r["summary"]["goodput"]
        assert g["workers"] == 2 and 0 < g["goodput"] <= g["step_goodput"] <= 1 and g["discarded_share"] == 0


@pytest.mark.slow  # four processes: 86 s on this 2-core machine while it ran other measurements
def test_with_a_straggler_the_quorum_merges_without_it_and_counts_its_late_work(tmp_path):
    # 24 steps of 3 (8 rounds), compute heavy enough that rank 1's 3x shows; one evaluation, at the
    # end (an evaluation is a collective: every learner meets there); a short fixed window
    run, _ = train(tmp_path, *RUN, "model.hidden=[256]", "dataset.image_size=16", "dataset.train_size=4096",
                   "engine.np=4", "batch_size=32", "max_steps=24", "eval_points=1", "checkpoint=false",
                   "sync=quorum_diloco", "sync.quorum=3", "sync.window_s=0.002", "fault=straggler",
                   "fault.slow_rank=1", "fault.slow_factor=3")
    r = results(run)
    record = r["scheduler"]["quorum_record"]
    straggler = record["per_rank"]["1"]
    assert record["merges"] >= 1 and record["merges_short"] >= 1, record
    assert straggler["missed"] >= 1 and straggler["late_merged"] + straggler["discarded"] >= 1, record
    # every delivery is accounted for: 8 rounds of each of the 4 learners
    counted = ("merged", "late_merged", "discarded")
    assert sum(sum(row[k] for k in counted) for row in record["per_rank"].values()) == 32
    g = r["summary"]["goodput"]
    assert g["workers"] == 4 and g["discarded_compute_s"] == record["discarded_compute_s"]
    assert g["goodput"] + g["idle_share"] + g["discarded_share"] == pytest.approx(1.0, abs=2e-4)


@pytest.mark.slow  # three 2-rank runs
def test_a_run_resumed_mid_round_ends_where_the_uninterrupted_run_ends(tmp_path):
    """A quorum of every worker decides nothing by the clock: the checkpoint at step 7 (a round of 3
    begun) holds every learner's round and the synchronizer's θ and outer momentum, and the resumed
    run ends bit for bit where the uninterrupted one does."""
    common = [*RUN, "engine.np=2", "batch_size=16", "max_steps=12", "sync=quorum_diloco"]
    full, _ = train(tmp_path, *common, name="full")
    half, _ = train(tmp_path, *common, "max_steps=7", name="half")
    resumed, proc = train(tmp_path, *common, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    a, b, h = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed, half))
    assert h["per_rank"][0]["inner"] == 1 and h["per_rank"][0]["synchronizer"]["version"] == 2
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for rank in (0, 1):
        for key in ("base", "local_params"):
            assert all(torch.equal(x, y) for x, y in zip(a["per_rank"][rank][key], b["per_rank"][rank][key],
                                                         strict=True)), (rank, key)
    sa, sb = a["per_rank"][0]["synchronizer"], b["per_rank"][0]["synchronizer"]
    assert sa["version"] == sb["version"] == 4
    assert all(torch.equal(x, y) for x, y in zip(sa["theta"], sb["theta"], strict=True))
    momentum = [s["outer"]["state"][i]["momentum_buffer"] for s in (sa, sb) for i in (0, 1)]
    assert torch.equal(momentum[0], momentum[2]) and torch.equal(momentum[1], momentum[3])
