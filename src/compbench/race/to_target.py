"""A run's time to target, decomposed (Pollux's goodput, OSDI 2021: throughput x statistical
efficiency): the tokens (or samples) it took to reach the target, read off its curve, times the step
time on its link. The first factor does not depend on how loaded the machine was; the second is
measured (the median step, with its quartiles) and predicted by the what-if model, so a race's verdict
holds on a shared machine. The raw wall-clock time to target stays beside it.

Tokens to target: the curve's evaluations bracket the crossing; it is interpolated linearly between
the last evaluation that missed the target and the first that reached it, and the interval between
the two is its resolution (before the first evaluation: from 0).

The step time: the measured median (wall clock) of a run on an idle machine; of a run on a loaded one
(compbench.records.provenance.loaded), the estimate of its step on an unloaded machine that a CPU
run records (`step_unloaded_ms`: its communication's wall time plus the CPU time of the rest over
its compute threads), since other work stretches the wall time and not the CPU time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_MEASURED_STEPS = 20  # after the warm-up steps: fewer make no throughput verdict (no spread to trust)


@dataclass(frozen=True)
class ToTarget:
    """One run's way to the target: `units` (tokens or samples) +- `resolution`, at `per_step` units
    a step, and the step time on the link (ms: median, quartiles)."""

    units: float
    resolution: float
    per_step: float
    step_ms: float
    step_ms_q1: float
    step_ms_q3: float

    @property
    def steps(self) -> float:
        return self.units / self.per_step

    def seconds(self, step_ms: float | None = None) -> float:
        """Steps to the target times a step's time (the measured median, or `step_ms`: a prediction)."""
        return self.steps * (self.step_ms if step_ms is None else step_ms) / 1e3

    @property
    def seconds_spread(self) -> tuple[float, float]:
        """The seconds at the step time's first and third quartiles."""
        return self.steps * self.step_ms_q1 / 1e3, self.steps * self.step_ms_q3 / 1e3


def step_times(summary: dict[str, Any], loaded: bool) -> tuple[float, float, float] | None:
    """The step time (ms: median, first and third quartiles) a run's verdicts use: the measured one,
    or on a loaded machine the unloaded estimate where the run has one."""
    key = "step_unloaded_ms" if loaded and summary.get("step_unloaded_ms") else "step_ms"
    median = summary.get(key)
    if not median:
        return None
    q1, q3 = summary.get(f"{key}_q1"), summary.get(f"{key}_q3")
    return float(median), float(median if q1 is None else q1), float(median if q3 is None else q3)


def to_target(results: dict[str, Any], metric: str, higher_is_better: bool, loaded: bool = False
              ) -> ToTarget | None:
    """The decomposition of a run that reached its target (None otherwise, or without a step time);
    `loaded`: the run ran on a loaded machine (its step time is then the unloaded estimate)."""
    summary = results.get("summary") or {}
    target = summary.get("target") or {}
    curve = [p for p in results.get("curve") or [] if p.get(metric) is not None]
    step = step_times(summary, loaded)
    if not target.get("reached") or not curve or step is None:
        return None
    units_key = "tokens" if "tokens" in curve[-1] else "samples"
    value = float(target["value"])

    def met(p: dict[str, Any]) -> bool:
        return p[metric] >= value if higher_is_better else p[metric] <= value

    i = next((k for k, p in enumerate(curve) if met(p)), None)
    if i is None:  # the summary's target and the curve's evaluations disagree: nothing to read
        return None
    hit = curve[i]
    if i == 0:  # reached at the first evaluation: somewhere between the start and it
        units, resolution = float(hit[units_key]), float(hit[units_key])
    else:
        miss = curve[i - 1]
        gap = miss[metric] - hit[metric]
        share = (miss[metric] - value) / gap if gap else 1.0
        resolution = float(hit[units_key] - miss[units_key])
        units = float(miss[units_key]) + share * resolution
    last = curve[-1]
    per_step = float(last[units_key]) / max(1, int(last["step"]))
    return ToTarget(units, resolution, per_step, *step)
