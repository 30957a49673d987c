"""Quality against time: a run's curve, its evaluation schedule and its time to a target.

Every evaluation is a point of the curve: the step, the training seconds (the sum of the steps' wall
times: evaluation and checkpoints are not training), the wall seconds since the start, the samples
or tokens trained on (all workers), the bytes one worker sent, and the metrics (eval/loss, and
eval/acc1 for classifiers). The curve is in results.json (`curve`) and, with TensorBoard's
"Relative" time axis, in every scalar: each is written at its training time.

Schedule: every `eval_every_steps` steps; or about every `eval_every_s` seconds of training (turned
into steps from the median step time of steps 5 to 14, rank 0's, broadcast once); or else
`eval_points` evaluations spread over the run's steps; always at epoch ends and at the last step.
A periodic mode (sync=diloco) evaluates at the end of a round (the step is rounded up to one): the
workers hold the global parameters there.

A target (`target_loss`: eval/loss at or below, or `target_acc1`: eval/acc1 at or above) records
the first point that reaches it (`summary.target`, and the time to it in the run's summary);
`stop_at_target` ends the run there. With `eval_near_target=d`, once an evaluation is within a
relative distance d of the target (a loss at most (1 + d) x the target, an accuracy at least (1 - d)
x it) and has not reached it, the schedule evaluates NEAR_DIVISOR times as often (still whole rounds),
so the crossing, interpolated between the evaluations around it, is resolved finely where it is read
without evaluating often over the whole run. A budget (`max_train_s`) ends the run at the first evaluation
after that many seconds of training (rank 0's clock decides, for every rank); with a budget and no
schedule of steps or seconds, the `eval_points` evaluations are spread over the budget's seconds.

`budget_clock` says what the budget and `eval_every_s` count: `wall`, the steps' wall times (the
curve's `train_s`), or `unloaded`, each CPU step's estimate on a machine nobody else loads
(compbench.records.stats.StepStats.unloaded_ms; the curve's `train_unloaded_s`), so that a run on a
shared machine trains as far and evaluates at the same steps as on an idle one (compbench race).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from compbench.base.settings import RunSettings
from compbench.engines.base import Engine

PROBE = range(5, 15)  # steps whose median time turns eval_every_s into steps (after the warm-up)
NEAR_DIVISOR = 4  # near the target (eval_near_target) the interval between evaluations is a quarter


@dataclass(frozen=True)
class Target:
    tag: str
    value: float
    higher_is_better: bool

    @classmethod
    def of(cls, settings: RunSettings) -> Target | None:
        if settings.target_loss is not None:
            return cls("eval/loss", settings.target_loss, False)
        if settings.target_acc1 is not None:
            return cls("eval/acc1", settings.target_acc1, True)
        return None

    def near(self, metrics: dict[str, float], distance: float) -> bool:
        """Whether `metrics` are within the relative `distance` of the target, not yet at it."""
        value = metrics.get(self.tag)
        if value is None or self.met(metrics):
            return False
        if self.higher_is_better:
            return value >= self.value * (1 - distance)
        return value <= self.value * (1 + distance)

    def met(self, metrics: dict[str, float]) -> bool:
        value = metrics.get(self.tag)
        if value is None:
            return False
        return value >= self.value if self.higher_is_better else value <= self.value

    @property
    def text(self) -> str:
        return f"{self.tag} {'>=' if self.higher_is_better else '<='} {self.value:g}"


class Progress:
    """The running totals, the evaluation schedule and the curve (the same on every rank: the
    metrics are allreduced, so every rank stops at the same point)."""

    def __init__(self, settings: RunSettings, units: str, total_steps: int, period: int,
                 alone: bool = False) -> None:
        """`alone`: rank 0 alone evaluates and decides (a mode whose learners are independent,
        compbench.sync.SyncTraits.learners_independent): no broadcast, the other ranks never ask."""
        self.units_key, self.period, self.alone = units, period, alone
        self.target = Target.of(settings)
        self.stop_at_target = settings.stop_at_target
        self.near_distance = settings.eval_near_target
        self.train_s = 0.0
        self.unloaded = settings.budget_clock == "unloaded"
        self.clock_s = 0.0  # training seconds on the budget's clock (budget_clock)
        self.eval_s = 0.0  # evaluation seconds (rank 0's), beside the training ones
        self.units = 0
        self.bytes_sent = 0
        self.curve: list[dict[str, Any]] = []
        self.reached: dict[str, Any] | None = None
        self.stopped: str | None = None  # "target" or "max_train_s" when one of them ended the run
        self.budget_s = settings.max_train_s
        self.every_s = float(settings.eval_every_s)
        if self.budget_s and not self.every_s and not settings.eval_every_steps and settings.eval_points:
            self.every_s = self.budget_s / settings.eval_points
        self.every = 0
        if settings.eval_every_steps:
            self.every = self._snap(settings.eval_every_steps)
        elif not self.every_s and settings.eval_points:
            self.every = self._snap(max(1, total_steps // settings.eval_points))
        self._probe: list[float] = []
        self.started, self.wall_base = time.perf_counter(), 0.0  # wall seconds, across resumes

    def wall_s(self) -> float:
        return self.wall_base + time.perf_counter() - self.started

    def _snap(self, steps: int) -> int:
        """`steps` rounded up to a whole number of rounds."""
        return -(-steps // self.period) * self.period

    def add_step(self, step: int, step_ms: float, units: int, bytes_sent: int, engine: Engine,
                 unloaded_ms: float | None = None) -> None:
        """Count a finished step (`step` is its index; `unloaded_ms`: its estimate on a machine nobody
        else loads, which budget_clock=unloaded counts); turns eval_every_s into steps once measured."""
        self.train_s += step_ms / 1e3
        if self.unloaded:
            assert unloaded_ms is not None, "budget_clock=unloaded needs each step's estimate (a CPU step)"
            step_ms = unloaded_ms
        self.clock_s += step_ms / 1e3
        self.units += units
        self.bytes_sent += bytes_sent
        if self.every_s and not self.every:
            if step in PROBE:
                self._probe.append(step_ms)
            if step == PROBE[-1]:  # every rank at the same step: one broadcast of rank 0's median
                ms = statistics.median(self._probe) if self.alone else engine.broadcast_object(
                    statistics.median(self._probe) if engine.rank == 0 else None, 0)
                self.every = self._snap(max(1, round(self.every_s * 1e3 / ms)))

    def due(self, steps_taken: int) -> bool:
        """Whether the schedule evaluates after this many steps: every `every` steps, every
        `every` / NEAR_DIVISOR (whole rounds) while the last evaluation is near the target. The
        metrics are allreduced, so every rank decides the same."""
        if self.every <= 0:
            return False
        every = self.every
        if self.near_distance and self.target is not None and self.target.near(self.last_metrics,
                                                                               self.near_distance):
            every = self._snap(max(1, every // NEAR_DIVISOR))
        return steps_taken % every == 0

    def point(self, steps_taken: int, epoch: float, metrics: dict[str, float], engine: Engine) -> bool:
        """Record an evaluation; returns whether the run stops here: its target reached, or its
        budget spent (rank 0's clock, broadcast: every rank stops together; `alone`: rank 0's own
        decision, not broadcast)."""
        point = {"step": steps_taken, "epoch": round(epoch, 4), "train_s": round(self.train_s, 3),
                 **({"train_unloaded_s": round(self.clock_s, 3)} if self.unloaded else {}),
                 "wall_s": round(self.wall_s(), 3), self.units_key: self.units,
                 "bytes_sent": self.bytes_sent, **metrics}
        self.curve.append(point)
        if self.target is not None and self.reached is None and self.target.met(metrics):
            self.reached = point
            if self.stop_at_target:
                self.stopped = "target"
                return True
        if self.budget_s is not None:
            spent = self.clock_s >= self.budget_s if self.alone else engine.broadcast_object(
                self.clock_s >= self.budget_s if engine.rank == 0 else None, 0)
            if spent:
                self.stopped = "max_train_s"
                return True
        return False

    def summary(self) -> dict[str, Any] | None:
        """The target's record: reached or not, and where."""
        if self.target is None:
            return None
        out: dict[str, Any] = {"metric": self.target.tag, "value": self.target.value,
                               "reached": self.reached is not None}
        if self.reached is not None:
            keys = ("step", "train_s", "wall_s", self.units_key, "bytes_sent")
            out.update({k: self.reached[k] for k in keys})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"train_s": self.train_s, "clock_s": self.clock_s, "eval_s": self.eval_s,
                "wall_s": self.wall_s(), "units": self.units, "bytes_sent": self.bytes_sent,
                "curve": [dict(p) for p in self.curve], "reached": self.reached, "every": self.every}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.started, self.wall_base = time.perf_counter(), float(state["wall_s"])
        self.train_s, self.units = float(state["train_s"]), int(state["units"])
        self.eval_s = float(state.get("eval_s", 0.0))  # older checkpoints: not recorded
        self.clock_s = float(state.get("clock_s", self.train_s))  # older checkpoints: the wall clock's
        self.bytes_sent, self.every = int(state["bytes_sent"]), int(state["every"])
        self.curve = [dict(p) for p in state["curve"]]
        self.reached = state["reached"]

    @property
    def last_metrics(self) -> dict[str, float]:
        """The metrics of the last evaluation (none yet: empty)."""
        return {k: v for k, v in (self.curve[-1] if self.curve else {}).items() if k.startswith("eval/")}
