"""sync=diloco's per-worker sync intervals on real process groups (engine=torch over gloo, compbench's
launcher): equal steps per worker are sync=diloco bit for bit; under a 3x straggler, a list [H, H/3]
has rank 1 train H/3 steps a round, and the adaptive rule finds that ratio by itself."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TINY, results, train

pytestmark = pytest.mark.dist

H = 6
RUN = [*TINY, "engine=torch", "engine.np=2", "optim=adamw", "sync=diloco", f"sync.inner_steps={H}",
       "batch_size=16", "max_steps=12"]  # 2 rounds of 6 steps
STRAGGLER = ["fault=straggler", "fault.slow_rank=1", "fault.slow_factor=3"]


def _trained_steps(run, rank: int) -> int:
    """The optimizer steps a rank took: its inner AdamW's step count, from the checkpoint."""
    state = torch.load(run / "checkpoint.pt", weights_only=True)["per_rank"][rank]["inner_optimizer"]["state"]
    return int(state[0]["step"])


@pytest.mark.slow  # two runs, 28 s here under load; tests/unit/test_per_worker_steps.py checks the same
def test_equal_steps_per_worker_are_diloco_bit_for_bit(tmp_path):  # on thread ranks in the default tier
    diloco, _ = train(tmp_path, *RUN, name="diloco")
    equal, _ = train(tmp_path, *RUN, f"sync.inner_steps_per_worker=[{H},{H}]", name="equal")
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (diloco, equal))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for rank in (0, 1):
        assert all(torch.equal(x, y) for x, y in zip(a["per_rank"][rank]["local_params"],
                                                     b["per_rank"][rank]["local_params"], strict=True))
    ra, rb = results(diloco), results(equal)
    assert ra["summary"]["final_test_loss"] == rb["summary"]["final_test_loss"]
    assert ra["curve"][-1]["samples"] == rb["curve"][-1]["samples"] == 12 * 2 * 16


def test_a_straggler_trains_a_third_of_each_round_under_a_list(tmp_path):
    run, _ = train(tmp_path, *RUN, *STRAGGLER, f"sync.inner_steps_per_worker=[{H},{H // 3}]", name="list")
    r = results(run)
    assert r["summary"]["steps"] == 12  # the loop's steps, common to both workers
    assert [_trained_steps(run, rank) for rank in (0, 1)] == [12, 2 * (H // 3)]
    # every step's samples count only the workers that trained it: per round 2 steps of 2, 4 of 1
    assert r["curve"][-1]["samples"] == 2 * 16 * (2 * 2 + 4 * 1)
    assert r["scheduler"]["per_worker"] == {"setting": [H, H // 3], "steps": [H, H // 3]}
    g = r["summary"]["goodput"]
    assert g["workers"] == 2 and g["goodput"] + g["idle_share"] == pytest.approx(1.0, abs=2e-4)


# 6 s here; in the slow tier all the same: it reads measured compute times, which a loaded machine skews
@pytest.mark.slow
def test_the_adaptive_rule_finds_the_stragglers_third(tmp_path):
    run, _ = train(tmp_path, *RUN, *STRAGGLER, "model.hidden=[512]", "dataset.image_size=16",
                   "dataset.train_size=2048", "max_steps=24", "eval_points=1",
                   "sync.inner_steps_per_worker=adaptive", name="adaptive")
    steps = results(run)["scheduler"]["per_worker"]["steps"]
    assert steps[0] == [H, H]  # the first round runs every worker at H
    assert len(steps) == 5  # one agreement per round's end (4 rounds)
    for h0, h1 in steps[1:]:  # then rank 1, 3x slower, trains about a third
        assert h0 == H and abs(h1 - H // 3) <= 1, steps


@pytest.mark.slow  # three runs
def test_a_run_resumed_where_a_worker_idles_ends_where_the_uninterrupted_run_ends(tmp_path):
    """The checkpoint at step 8 falls in the second round after rank 1's 2 trained steps (it idles from
    there): the resumed run idles it on, and ends bit for bit where the uninterrupted one does."""
    common = [*RUN, *STRAGGLER, f"sync.inner_steps_per_worker=[{H},{H // 3}]"]
    full, _ = train(tmp_path, *common, name="full")
    half, _ = train(tmp_path, *common, "max_steps=8", name="half")
    resumed, proc = train(tmp_path, *common, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    h = torch.load(half / "checkpoint.pt", weights_only=True)
    assert [r["inner"] for r in h["per_rank"]] == [8 % H] * 2
    assert h["per_rank"][1]["per_worker"]["steps"] == [H, H // 3]
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for rank in (0, 1):
        assert all(torch.equal(x, y) for x, y in zip(a["per_rank"][rank]["local_params"],
                                                     b["per_rank"][rank]["local_params"], strict=True))
    assert [_trained_steps(run, 1) for run in (half, resumed)] == [H // 3 + 2, 2 * (H // 3)]
