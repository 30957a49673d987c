"""Quality against time through the CLI (2 workers): the curve in results.json and TensorBoard,
a run that stops at its target, a resumed run that keeps its curve, and a bad setting refused
before anything is written."""

from __future__ import annotations

import pytest

from tests.helpers import TINY, compbench, results, train

pytestmark = pytest.mark.dist
COMMON = [*TINY, "engine.np=2", "epochs=2", "batch_size=16", "eval_every_steps=2"]  # 16 steps


def test_the_curve_and_the_target(tmp_path):
    run, proc = train(tmp_path, *COMMON, "target_acc1=30", "stop_at_target=true")
    res = results(run)
    curve, target = res["curve"], res["summary"]["target"]
    assert target["reached"] and "reached at step" in proc.stdout
    last = curve[-1]
    assert last["step"] == target["step"] == res["summary"]["steps"] < 16  # it stopped there
    assert last["eval/acc1"] >= 30 > max(p["eval/acc1"] for p in curve[:-1]) if len(curve) > 1 else True
    assert [p["step"] for p in curve] == list(range(2, last["step"] + 1, 2))
    for key in ("train_s", "wall_s", "samples", "bytes_sent", "eval/loss"):
        values = [p[key] for p in curve]
        assert values == sorted(values) or key == "eval/loss", key
    assert all(p["samples"] == p["step"] * 32 and p["train_s"] <= p["wall_s"] for p in curve)
    assert 0 < res["summary"]["utilization"] <= 1


def test_a_target_reached_at_an_epochs_end_ends_the_run_there(tmp_path):
    """The evaluation at an epoch's last step (8 of 16) reaches the target: no second epoch is trained."""
    run, proc = train(tmp_path, *COMMON[:-1], "eval_every_steps=8", "target_acc1=1", "stop_at_target=true")
    res = results(run)
    assert res["summary"]["target"]["step"] == res["summary"]["steps"] == 8
    assert "reached at step 8" in proc.stdout
    assert [p["step"] for p in res["curve"]] == [8]


def test_tensorboard_time_is_training_time(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = train(tmp_path, *COMMON, "max_steps=6")
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    events = acc.Scalars("eval/acc1")
    train_s = {p["step"]: p["train_s"] for p in results(run)["curve"]}
    first = events[0]
    assert len(events) == 3
    for e in events:  # each point at its training time: the time spent evaluating is left out
        assert e.wall_time - first.wall_time == pytest.approx(train_s[e.step] - train_s[first.step], abs=1e-3)


# slow tier: a resume's curve; resumes are exact in the default tier (test_resume, test_faults)
@pytest.mark.slow
def test_resume_keeps_the_curve(tmp_path):
    full, _ = train(tmp_path, *COMMON, name="full")
    half, _ = train(tmp_path, *COMMON, "max_steps=7", name="half")
    resumed, _ = train(tmp_path, *COMMON, f"resume={half}", name="resumed")
    a, b = results(full)["curve"], results(resumed)["curve"]
    # the half run also evaluated at its last step (7); otherwise the same points and metrics
    assert [p["step"] for p in b] == sorted({*range(2, 17, 2), 7})
    by_step = {p["step"]: p for p in a}
    for p in b:
        if p["step"] in by_step:
            assert p["eval/acc1"] == by_step[p["step"]]["eval/acc1"], p["step"]
            assert (p["samples"], p["bytes_sent"]) == (by_step[p["step"]]["samples"],
                                                       by_step[p["step"]]["bytes_sent"])


def test_a_bad_target_is_refused_before_anything_is_written(tmp_path):
    proc = compbench("train", *TINY, "stop_at_target=true", f"outputs_root={tmp_path / 'out'}", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: stop_at_target=true needs a target; pass target_loss=VALUE or target_acc1=VALUE"]
    assert not (tmp_path / "out").exists()
