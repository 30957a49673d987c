"""A run's time to target, decomposed (Pollux's goodput, OSDI 2021: throughput x statistical
efficiency): the tokens (or samples) it took to reach the target, read off its curve, times the step
time on its link. The first factor does not depend on how loaded the machine was; the second is
measured (the median step, with its quartiles) and predicted by the what-if model, so a race's verdict
holds on a shared machine. The raw wall-clock time to target stays beside it.

Tokens to target: the curve's evaluations bracket the crossing; it is interpolated linearly between
the last evaluation that missed the target and the first that reached it, and the interval between
the two is its resolution (before the first evaluation: from 0). The bytes one worker had sent at the
crossing (what its cost's egress counts, compbench.race.cost) are interpolated the same way.

The step time: the measured median (wall clock) of a run on an idle machine; of a run on a loaded one
(compbench.records.provenance.loaded), the estimate of its step on an unloaded machine that a CPU
run records (`step_unloaded_ms`: its communication's wall time plus the CPU time of the rest over
its compute threads), since other work stretches the wall time and not the CPU time.

That estimate is a claim about the machine, not a measurement: it holds where the CPU time of a step
does not grow with the load (no cache or memory-bandwidth contention, threads that keep busy) and
where its communication's wall time is the wire's. Whether it holds is measured per method family
(`family`: per-step, periodic, sharded) and load (busy loops per core, `load_level`) by
scripts/validate_unloaded.py: the estimate at that load over the same method's wall-clock step on the
idle machine. `VALIDATED` keeps those ratios; a family and load without one (None: not measured) or
off by more than `ESTIMATE_TOLERANCE` is not validated, and a race whose loaded runs rest on it gives
no verdict at that load (compbench.race.report).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_MEASURED_STEPS = 20  # after the warm-up steps: fewer make no throughput verdict (no spread to trust)

FAMILIES = ("per-step", "periodic", "sharded")
# (family, busy loops per core) -> the unloaded estimate's median step at that load over the same
# method's wall-clock median step on the idle machine (scripts/validate_unloaded.py's table: the 2-core
# AMD EPYC VM, 2026-12-06, 2 repeats of 95 steps each, docs/results.md "Does a loaded machine fool the
# race?"). None: not measured. Beyond 2 busy loops per core nothing is validated.
VALIDATED: dict[tuple[str, int], float | None] = {
    ("per-step", 1): 0.981, ("per-step", 2): 0.954,
    ("periodic", 1): 0.943, ("periodic", 2): 0.964,
    ("sharded", 1): 0.97, ("sharded", 2): 1.032,
}
ESTIMATE_TOLERANCE = 0.10  # a ratio within 1 +- this validates the estimate at that load


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
    # the bytes one worker had sent at the crossing (its curve's bytes_sent, interpolated as the units
    # are); None where its curve recorded none
    bytes_sent: float | None = None
    # a run on a link that changes (a trace): its training seconds at the crossing, interpolated, on
    # the step clock (a loaded run's unloaded clock) and on the wall clock; None on a constant link
    clock_s: float | None = None
    wall_s: float | None = None

    @property
    def steps(self) -> float:
        return self.units / self.per_step

    def seconds(self, step_ms: float | None = None) -> float:
        """Steps to the target times a step's time (the measured median, or `step_ms`: a prediction);
        on a trace, measured: its training seconds to the crossing (a median step would hide the link's
        slow stretches)."""
        if step_ms is None and self.clock_s is not None:
            return self.clock_s
        return self.steps * (self.step_ms if step_ms is None else step_ms) / 1e3

    def wall_seconds(self, wall_step_ms: float) -> float:
        """The same on the wall clock: steps x the measured (wall) median step; on a trace, the
        training seconds on the wall clock to the crossing."""
        return self.wall_s if self.wall_s is not None else self.steps * wall_step_ms / 1e3

    @property
    def resolution_steps(self) -> float:
        """The interval between the evaluations around the crossing, in steps (the crossing lies in
        it: +- half of it about the interpolated figure)."""
        return self.resolution / self.per_step

    def resolution_s(self, step_ms: float | None = None) -> float:
        """The same interval in seconds at the step time (the measured median, or `step_ms`)."""
        return self.resolution_steps * (self.step_ms if step_ms is None else step_ms) / 1e3

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


def to_target(results: dict[str, Any], metric: str, higher_is_better: bool, loaded: bool = False,
              on_trace: bool = False) -> ToTarget | None:
    """The decomposition of a run that reached its target (None otherwise, or without a step time);
    `loaded`: the run ran on a loaded machine (its step time is then the unloaded estimate);
    `on_trace`: its link changed over time (a trace), so its time to target is the training seconds
    its curve reached the crossing in (train_unloaded_s where loaded and recorded, else train_s),
    not steps x a median step."""
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
    miss = curve[i - 1] if i else {units_key: 0}  # before the first evaluation: from the start (0)
    gap = miss[metric] - hit[metric] if i else 0.0
    share = (miss[metric] - value) / gap if gap else 1.0
    resolution = float(hit[units_key] - miss[units_key])
    units = float(miss[units_key]) + share * resolution
    def at(key: str) -> float | None:  # a curve's figure at the crossing, interpolated as the units are
        if hit.get(key) is None or (i and miss.get(key) is None):
            return None
        before = float(miss.get(key) or 0.0)
        return before + share * (float(hit[key]) - before)

    clock_s = wall_s = None
    if on_trace:
        wall_s = at("train_s")
        clock_s = at("train_unloaded_s") if loaded and hit.get("train_unloaded_s") is not None else wall_s
    last = curve[-1]
    per_step = float(last[units_key]) / max(1, int(last["step"]))
    return ToTarget(units, resolution, per_step, *step, bytes_sent=at("bytes_sent"), clock_s=clock_s,
                    wall_s=wall_s)


def family(results: dict[str, Any]) -> str:
    """A run's method family for the unloaded estimate's validation: `sharded` (sharding=fsdp|hsdp:
    collectives every step inside the step's compute), `periodic` (one exchange every several steps:
    the DiLoCo family) or `per-step` (an exchange every step: DDP, the compressors, DeMo, 1-bit Adam)."""
    if ((results.get("summary") or {}).get("sharded") or {}).get("layout") in ("fsdp", "hsdp"):
        return "sharded"
    return "periodic" if int((results.get("exchange") or {}).get("every", 1)) > 1 else "per-step"


def others_per_core(environment: dict[str, Any]) -> float | None:
    """Other work's demand for the cores while the run trained, in busy loops per core: its
    runnable tasks (environment.others_runnable), or else the load average at the end less the run's
    own threads, over the cores; None where the run recorded neither."""
    cores = environment.get("cores")
    others = environment.get("others_runnable")
    after, own = environment.get("load_after"), environment.get("own_threads")
    if others is None and after is not None and own is not None:
        others = max(0.0, float(after) - float(own))
    if others is None or not cores:
        return None
    return float(others) / float(cores)


def load_level(environment: dict[str, Any]) -> int | None:
    """The validation's load nearest a loaded run's: busy loops per core, rounded, at least 1."""
    per_core = others_per_core(environment)
    return None if per_core is None else max(1, round(per_core))


def validated(family_: str, level: int | None) -> bool:
    """Whether the validation measured the estimate of `family_` at `level` busy loops per core
    within ESTIMATE_TOLERANCE of the idle machine's wall clock (not measured: not validated)."""
    ratio = VALIDATED.get((family_, level)) if level is not None else None
    return ratio is not None and abs(ratio - 1) <= ESTIMATE_TOLERANCE
