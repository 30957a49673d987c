"""The curve's bookkeeping (compbench.train.progress): the evaluation schedule (steps, points,
seconds, rounded to rounds), the target's record, and the state a checkpoint carries; and the
refusal of bad settings (one line naming the key)."""

from __future__ import annotations

import dataclasses

import pytest

from compbench.base.settings import RunSettings
from compbench.compose import config
from compbench.train.progress import Progress, Target
from tests.helpers import TINY


def _settings(**kw) -> RunSettings:
    cfg = config.compose([*TINY, *(f"{k}={v}" for k, v in kw.items())])
    return RunSettings.of(cfg)


class _Engine:
    rank = 0

    def __init__(self) -> None:
        self.broadcasts = 0

    def broadcast_object(self, obj, root=0):
        self.broadcasts += 1
        return obj


def test_schedules():
    assert Progress(_settings(eval_points=8), "samples", 100, 1).every == 12
    assert Progress(_settings(eval_points=0), "samples", 100, 1).every == 0
    assert Progress(_settings(eval_every_steps=7), "samples", 100, 1).every == 7
    assert Progress(_settings(eval_every_steps=7), "samples", 100, 5).every == 10  # whole rounds of 5
    # seconds: the median time of steps 5-14 (10 ms) turns 0.25 s into 25 steps, once
    progress, engine = Progress(_settings(eval_every_s=0.25), "tokens", 1000, 1), _Engine()
    for step in range(20):
        progress.add_step(step, 10.0 if step >= 5 else 99.0, 64, 100, engine)
    assert progress.every == 25 and engine.broadcasts == 1
    assert progress.due(25) and not progress.due(24)
    assert (progress.train_s, progress.units, progress.bytes_sent) == (pytest.approx(0.645), 1280, 2000)


def test_target_record_and_state():
    progress = Progress(_settings(target_loss=1.0, stop_at_target=True), "tokens", 10, 1)
    progress.add_step(0, 100.0, 64, 10, _Engine())
    assert not progress.point(1, 0.1, {"eval/loss": 1.5}, _Engine())
    progress.add_step(1, 100.0, 64, 10, _Engine())
    assert progress.point(2, 0.2, {"eval/loss": 0.9}, _Engine())  # reached: stop here
    assert not progress.point(3, 0.3, {"eval/loss": 0.8}, _Engine())  # recorded once
    summary = progress.summary()
    assert summary == {"metric": "eval/loss", "value": 1.0, "reached": True, "step": 2, "train_s": 0.2,
                       "wall_s": summary["wall_s"], "tokens": 128, "bytes_sent": 20}
    copy = Progress(_settings(target_loss=1.0), "tokens", 10, 1)
    copy.load_state_dict(progress.state_dict())
    assert copy.curve == progress.curve and copy.summary() == summary
    assert copy.last_metrics == {"eval/loss": 0.8}


def test_the_schedule_evaluates_four_times_as_often_near_the_target():
    """Within eval_near_target of the target (not at it) every `every` / 4 steps, whole rounds."""
    near = {"target_loss": 2.0, "eval_near_target": 0.15}
    progress = Progress(_settings(eval_every_steps=40, **near), "tokens", 400, 1)
    assert progress.due(40) and not progress.due(10)
    progress.point(40, 0.1, {"eval/loss": 2.5}, _Engine())  # 25% above: far
    assert not progress.due(50) and progress.due(80)
    progress.point(80, 0.2, {"eval/loss": 2.2}, _Engine())  # 10% above: near
    assert progress.due(90) and not progress.due(85)
    progress.point(90, 0.3, {"eval/loss": 1.9}, _Engine())  # reached: the coarse schedule again
    assert not progress.due(100) and progress.due(120)
    rounds = Progress(_settings(eval_every_steps=60, **near), "tokens", 600, 30)
    rounds.point(60, 0.1, {"eval/loss": 2.1}, _Engine())
    assert rounds.due(90) and not rounds.due(75)  # a quarter of 60, rounded up to a round of 30
    # an accuracy target: near from below
    acc = Progress(_settings(eval_every_steps=40, target_acc1=90, eval_near_target=0.1), "samples", 400, 1)
    acc.point(40, 0.1, {"eval/acc1": 82.0}, _Engine())
    assert acc.due(50)
    # off (the default): the coarse schedule only
    off = Progress(_settings(eval_every_steps=40, target_loss=2.0), "tokens", 400, 1)
    off.point(40, 0.1, {"eval/loss": 2.01}, _Engine())
    assert not off.due(50)


def test_a_budget_ends_the_run_at_the_evaluation_after_it():
    progress, engine = Progress(_settings(max_train_s=0.25), "samples", 10_000, 1), _Engine()
    assert progress.every_s == pytest.approx(0.25 / 8)  # eval_points over the budget
    progress.add_step(0, 200.0, 32, 10, engine)
    assert not progress.point(1, 0.0, {"eval/acc1": 10.0}, engine)
    progress.add_step(1, 100.0, 32, 10, engine)
    assert progress.point(2, 0.0, {"eval/acc1": 20.0}, engine) and progress.stopped == "max_train_s"


def test_the_unloaded_clock_counts_each_steps_estimate_for_the_budget_and_the_schedule():
    # a loaded machine: the wall time of every step is 4x its estimate on an idle one
    progress, engine = Progress(_settings(max_train_s=0.25, budget_clock="unloaded"), "samples", 10_000, 1), \
        _Engine()
    assert progress.every_s == pytest.approx(0.25 / 8)
    for step in range(20):
        progress.add_step(step, 40.0, 32, 10, engine, unloaded_ms=10.0)
    assert progress.every == 3  # 31.25 ms of evaluation interval over the estimate's 10 ms a step
    assert not progress.point(20, 0.0, {"eval/acc1": 10.0}, engine)  # 0.2 s on its clock, 0.8 s of wall
    assert progress.curve[-1]["train_s"] == pytest.approx(0.8)
    assert progress.curve[-1]["train_unloaded_s"] == pytest.approx(0.2)
    for step in range(20, 25):
        progress.add_step(step, 40.0, 32, 10, engine, unloaded_ms=10.0)
    assert progress.point(25, 0.0, {"eval/acc1": 20.0}, engine) and progress.stopped == "max_train_s"
    copy = Progress(_settings(max_train_s=0.25, budget_clock="unloaded"), "samples", 10_000, 1)
    copy.load_state_dict(progress.state_dict())
    assert copy.clock_s == pytest.approx(0.25) and copy.train_s == pytest.approx(1.0)
    wall = Progress(_settings(max_train_s=0.25), "samples", 10_000, 1)  # the default clock: the wall's
    wall.add_step(0, 300.0, 32, 10, engine, unloaded_ms=10.0)
    assert wall.point(1, 0.0, {"eval/acc1": 10.0}, engine) and "train_unloaded_s" not in wall.curve[-1]


def test_accuracy_targets_are_reached_from_below():
    target = Target.of(dataclasses.replace(_settings(), target_acc1=90.0))
    assert target is not None and target.met({"eval/acc1": 90.0}) and not target.met({"eval/acc1": 89.9})


@pytest.mark.parametrize("overrides, message", [
    (["eval_every_steps=-1"], "eval_every_steps=-1 must be an integer >= 0"),
    (["eval_every_s=abc"], "eval_every_s=abc must be a finite number >= 0"),
    (["eval_points=1.5"], "eval_points=1.5 must be an integer >= 0"),
    (["target_loss=0"], "target_loss=0 must be a finite number > 0"),
    (["target_acc1=101"], "target_acc1=101 must be at most 100"),
    (["target_loss=1", "target_acc1=50"], "target_loss and target_acc1 are both set; keep one of them"),
    (["stop_at_target=true"], "stop_at_target=true needs a target; pass target_loss=VALUE or "
                              "target_acc1=VALUE"),
    (["stop_at_target=yes"], "stop_at_target=yes must be true or false"),
    (["eval_near_target=0.2"], "eval_near_target=0.2 refines the evaluations near a target and none is set"),
    (["target_loss=1", "eval_near_target=1.5"], "eval_near_target=1.5 must be at most 1"),
    (["max_train_s=0"], "max_train_s=0 must be a finite number > 0"),
    (["max_train_s=10", "eval=false"], "max_train_s is checked at evaluations and eval=false runs none"),
    (["budget_clock=cpu"], "budget_clock=cpu is unknown; use wall or unloaded"),
    (["budget_clock=unloaded"], "budget_clock=unloaded is the clock of max_train_s and eval_every_s, and "
                                "neither is set; set max_train_s=SECONDS or drop budget_clock"),
    (["target_loss=1", "eval=false"], "target_loss is checked at evaluations and eval=false runs none; drop "
                                      "target_loss or pass eval=true"),
    (["model=gpt", "dataset=shakespeare", "target_acc1=50"],
     "target_acc1 is an accuracy and model=gpt a language model; pass target_loss=VALUE instead"),
])
def test_bad_settings_are_refused(overrides, message):
    lm = any(o.startswith("model=") for o in overrides)
    base = [o for o in TINY if not (lm and o.startswith(("model", "dataset")))]
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*base, *overrides]))
    assert str(e.value).startswith(message), str(e.value)
