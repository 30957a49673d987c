"""The race's report: race.md, race.csv (one row per run), race_curves.csv (one row per evaluation),
plots/ and the what-if model's predictions beside the measurements (compbench.race.model).

What ran first, as the runs recorded it (results.json environment and config: workers, compute
threads, CPU priority, the budget's clock, seeds, the load), never the race's defaults. Per link:
each method's time to target decomposed (compbench.race.to_target: the tokens or samples it took,
read off its curve, times the step time on the link; mean +- half the range over the seeds that
reached it) with the crossing's resolution beside it (+- half the interval between the evaluations
around it, in seconds and steps), the raw wall-clock training seconds to it; its tokens or samples per
second against the baseline's; the step time (median, quartiles) measured and predicted; its compute
utilization, bytes per token (or sample), the most bytes it sent in one step and the communication
its step waited for per exchange against the wire time of that exchange; how many of its runs ran on
a loaded machine.

Two clocks, named wherever a time is: the wall clock, and a loaded run's unloaded estimate (its CPU
time over its compute threads, compbench.records.stats.StepStats.unloaded_ms), which the verdicts use
for loaded runs. The estimate is a claim: the report sets each method's estimate beside its wall
clock and the load around it, and ranks the methods on a link (the verdict per link) only where
every loaded run's estimate is validated for its family at its load (compbench.race.to_target.
VALIDATED) and the two clocks do not order two methods the other way round by more than the seeds'
spread; otherwise it says "no verdict at this load". A race in which no method reached the target
says so (no verdict) instead of rating figures from a handful of steps.

Then the model: fitted on the race's runs where they span two bandwidths or more (else its prior,
and no crossover or extrapolation), its coefficients and the range it saw (bandwidths, delays,
workers), its step times predicted from each method's run on another link, the bandwidth below which
each method reaches the target before the baseline and the round trip above which it does (each said
to lie within or beyond the runs' range), and a what-if table (compbench.race.model.WhatIf: time to
target at other workers and machines, each method's memory per worker and whether it fits; a step's
time and the memory at other model sizes), its headers naming what lies beyond the runs. A target the
race has no data for is no verdict (compbench.race.targets). Plots, each with the seeds and the load
under it: the metric against training seconds (wall clock) per link (every evaluation a marker, every
seed its own line, a loaded run's dashed), utilization against bandwidth (each seed a point, the
model's line over the fitted bandwidths, dotted beyond them), time to target per link (each seed a
point with the crossing's resolution, a loaded seed's a cross; the mean a bar outline, dashed where
not every seed reached it; k/n above every bar, a triangle where none did).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from compbench.comm.cost_model import Fit
from compbench.race.cost import Prices
from compbench.race.fault_report import GOODPUT_KEYS, fault_lines, goodput_of, goodput_text
from compbench.race.model import (
    MIN_BANDWIDTHS,
    PRIOR,
    Profile,
    WhatIf,
    crossover_gbps,
    crossover_rtt_ms,
    fit_model,
)
from compbench.race.on_trace import load_link_trace, mean_delay_ms, mean_mbps, stretches, time_on_trace_ms
from compbench.race.stacked_bars import group_ticks
from compbench.race.suites import Link, Race
from compbench.race.to_target import (
    MIN_MEASURED_STEPS,
    VALIDATED,
    ToTarget,
    family,
    load_level,
    others_per_core,
    step_times,
    to_target,
    validated,
)
from compbench.records import provenance
from compbench.records.results import WARMUP_STEPS


@dataclass
class Run:
    method: str
    link: Link
    seed: int
    results: dict | None

    @property
    def mbps(self) -> float:
        return self.link.mbps

    @property
    def measured(self) -> dict:
        """The summary as the run recorded it (wall-clock step times)."""
        return (self.results or {}).get("summary") or {}

    @property
    def summary(self) -> dict:
        """The summary as the race's verdicts read it: on a loaded machine, the step time and its
        quartiles are the run's unloaded estimate (compbench.race.to_target.step_times) and its
        samples or tokens per second scaled to it; otherwise as measured."""
        s = self.measured
        step = step_times(s, self.loaded)
        if not self.loaded or step is None or not s.get("step_ms"):
            return s
        scale = float(s["step_ms"]) / step[0]
        return {**s, "step_ms": step[0], "step_ms_q1": step[1], "step_ms_q3": step[2],
                **{k: float(s[k]) * scale for k in ("throughput", "tokens_per_s") if s.get(k) is not None}}

    @property
    def view(self) -> dict:
        """results.json with the verdicts' summary (what the model's profile reads)."""
        return {**(self.results or {}), "summary": self.summary}

    @property
    def ok(self) -> bool:
        return self.measured.get("status") == "completed"

    def to_target(self, race: Race) -> ToTarget | None:
        if not self.ok:
            return None
        return to_target(self.results or {}, race.metric, race.higher_is_better, self.loaded,
                         on_trace=bool(self.link.trace))

    @property
    def loaded(self) -> bool:
        """Whether other work competed for the cores, judged by today's rule on the loads the run
        recorded (compbench.records.provenance.loaded), so that a race resumed across versions is
        judged one way; the run's own flag where it recorded no loads."""
        env = (self.results or {}).get("environment") or {}
        if any(env.get(k) is None for k in ("load_before", "load_after", "own_threads", "cores")):
            return bool(self.measured.get("loaded"))
        return provenance.loaded(env["load_before"], env["load_after"], env["own_threads"], env["cores"],
                                 env.get("others_runnable"))

    @property
    def measured_steps(self) -> int:
        """Steps after the warm-up ones: what the medians are taken over."""
        return max(0, int(self.summary.get("steps") or 0) - WARMUP_STEPS)

    @property
    def environment(self) -> dict:
        return (self.results or {}).get("environment") or {}

    @property
    def workers(self) -> int:
        """The workers it trained on (environment.world_size): whose devices and bytes its cost counts."""
        return int(self.environment["world_size"])

    @property
    def family(self) -> str:
        """Its method family for the estimate's validation (compbench.race.to_target.family)."""
        return family(self.results or {})

    @property
    def estimated(self) -> bool:
        """Whether its verdicts' step is the unloaded estimate (a loaded run that recorded one), not
        the wall clock."""
        s = self.measured
        return self.loaded and bool(s.get("step_unloaded_ms")) and bool(s.get("step_ms"))

    @property
    def wall_step_ms(self) -> float | None:
        """Its measured median step (wall clock), whatever the verdicts use."""
        step = self.measured.get("step_ms")
        return float(step) if step else None

    def load_gap(self) -> tuple[str, int | None] | None:
        """Why its step cannot rank methods at its load: (its family, its load in busy loops per core)
        where its unloaded estimate is not validated there (compbench.race.to_target.VALIDATED), or
        (NO_ESTIMATE, None) for a loaded run without one; None where it can rank (an idle run: the
        wall clock; a loaded one whose estimate is validated for its family at its load)."""
        if not self.loaded:
            return None
        if not self.estimated:
            return NO_ESTIMATE, None
        level = load_level(self.environment)
        return None if validated(self.family, level) else (self.family, level)


def _niceness(table: Mapping[tuple[str, Link], Cell]) -> str:
    """The CPU priority the runs recorded (environment.nice: what ran, not the race's default)."""
    values = sorted({(r.results or {}).get("environment", {}).get("nice") for c in table.values()
                     for r in c.done} - {None})
    if not values:
        return "a CPU priority they did not record"
    return "nice " + ", ".join(f"{v:+d}" if v else "0" for v in values)


NO_ESTIMATE = "no estimate"


def gaps_text(gaps: Iterable[tuple[str, int | None] | None]) -> list[str]:
    """Runs' load gaps (Run.load_gap) in words, one phrase per kind: `the unloaded estimate is not
    validated for per-step methods at 1 and 2 busy loops per core, sharded methods at 2 busy loops
    per core`."""
    levels: dict[str, set[int | None]] = {}
    for gap in gaps:
        if gap is not None:
            levels.setdefault(gap[0], set()).add(gap[1])
    out = []
    if levels.pop(NO_ESTIMATE, None) is not None:
        out.append("a loaded run without an unloaded estimate (its wall clock is the machine's as much as "
                   "the method's)")
    parts = []
    for fam, at in sorted(levels.items()):
        known = sorted(x for x in at if x is not None)
        where = " and ".join(map(str, known))
        if known:
            where += f" busy loop{'' if known == [1] else 's'} per core"
        if None in at:
            where = f"{where} and an unrecorded load" if known else "an unrecorded load"
        parts.append(f"{fam} methods at {where}")
    if parts:
        out.append("the unloaded estimate is not validated for " + ", ".join(parts))
    return out


def load(entries: Sequence[tuple[str, Link, int, Path]]) -> list[Run]:
    runs = []
    for method, link, seed, run_dir in entries:
        try:
            results = json.loads((run_dir / "results.json").read_text())
        except (OSError, ValueError):
            results = None
        runs.append(Run(method, link, seed, results))
    return runs


@dataclass
class Cell:
    """One method at one link, over its seeds."""

    runs: list[Run]
    race: Race

    @property
    def done(self) -> list[Run]:
        return [r for r in self.runs if r.ok]

    def mean(self, key: str) -> float | None:
        values = [float(r.summary[key]) for r in self.done if r.summary.get(key) is not None]
        return statistics.fmean(values) if values else None

    def _at_target(self, key: str) -> list[float]:
        return [r.summary["target"][key] for r in self.done if (r.summary.get("target") or {}).get("reached")]

    @property
    def reached(self) -> list[float]:
        """The raw wall-clock training seconds to the target of the seeds that reached it."""
        return self._at_target("train_s")

    @property
    def decomposed(self) -> list[ToTarget]:
        """The seeds' decomposed ways to the target (those that reached it)."""
        return [t for _, t in self.reached_runs]

    @property
    def reached_runs(self) -> list[tuple[Run, ToTarget]]:
        """The seeds that reached the target, each with its decomposed way there."""
        return [(r, t) for r in self.done if (t := r.to_target(self.race)) is not None]

    def seconds(self, clock: str = "step") -> list[float]:
        """The decomposed seconds to the target of the seeds that reached it: at the verdicts' step
        (`step`: the wall clock, a loaded run's unloaded estimate) or at the measured one (`wall`)."""
        return [t.wall_seconds(r.wall_step_ms) if clock == "wall" and r.wall_step_ms else t.seconds()
                for r, t in self.reached_runs]

    def resolution(self) -> str:
        """The crossing's resolution: +- half the interval between the evaluations around it, in
        seconds (at the verdicts' step) and steps, the mean over the seeds that reached it."""
        reached = self.decomposed
        if not reached:
            return "-"
        seconds = statistics.fmean(t.resolution_s() for t in reached) / 2
        steps = statistics.fmean(t.resolution_steps for t in reached) / 2
        return f"+-{seconds:.1f} s, +-{steps:.0f} steps"

    def clock(self) -> str:
        """Which clock its step times are on: the wall clock, or (loaded runs) the unloaded estimate."""
        k, n = sum(r.estimated for r in self.done), len(self.done)
        if not k:
            return "wall clock"
        return "unloaded estimate" if k == n else f"wall clock; {k}/{n} unloaded estimate"

    def load_reasons(self) -> list[str]:
        """Why its runs cannot rank it at their load, in words (none: they can)."""
        return gaps_text(r.load_gap() for r in self.done)

    @property
    def steps_to_target(self) -> float | None:
        steps = [t.steps for t in self.decomposed]
        return statistics.fmean(steps) if steps else None

    def costs(self, prices: Prices) -> list[tuple[float, float] | None]:
        """Each seed that reached the target: its cost to it, (devices, egress) USD at its time on the
        step clock (compbench.race.cost); None for a seed whose bytes are not known while egress is
        charged."""
        return [prices.split_usd(r.workers, t.seconds(), t.bytes_sent) for r, t in self.reached_runs]

    def bytes_to_target(self) -> float | None:
        """The bytes one worker had sent at the crossing, the mean over the seeds that reached the
        target and recorded them (what a prediction's egress counts: they do not depend on the link)."""
        sent = [t.bytes_sent for t in self.decomposed if t.bytes_sent is not None]
        return statistics.fmean(sent) if sent else None

    def cost_to_target(self, prices: Prices) -> str:
        """The cost to the target: mean +- half the range over the seeds that reached it, k/n, as the
        time to target is given."""
        if not self.done:
            return "no data"
        costs, n = [sum(c) for c in self.costs(prices) if c is not None], len(self.done)
        if not costs:
            return f"not reached (0/{n})" if not self.decomposed else "no bytes recorded"
        k = len(costs)
        if k < n:
            return f"{statistics.fmean(costs):.3g} USD by {k}/{n}; the others not reached or without bytes"
        if n == 1:
            return f"{costs[0]:.3g} USD (1/1)"
        return f"{statistics.fmean(costs):.3g} +- {(max(costs) - min(costs)) / 2:.2g} USD ({n}/{n})"

    @property
    def loaded(self) -> int:
        """How many of its runs ran on a loaded machine (compbench.records.provenance)."""
        return sum(r.loaded for r in self.done)

    @property
    def too_short(self) -> bool:
        """Its runs measured too few steps after the warm-up for a throughput verdict."""
        return not self.done or min(r.measured_steps for r in self.done) < MIN_MEASURED_STEPS

    def time_to_target(self) -> str:
        """The decomposed seconds to the target: mean +- half the range over the seeds that reached it
        (one seed: no spread), or, where some missed it, their best."""
        if not self.done:
            return "no data"
        t, n = [d.seconds() for d in self.decomposed], len(self.done)
        if len(t) < n:  # the best of the seeds that missed it, and what those that reached it took
            missed = [r for r in self.done if not (r.summary.get("target") or {}).get("reached")]
            best = [b for r in missed if (b := _best(r, self.race)) is not None]
            top = (max(best) if self.race.higher_is_better else min(best)) if best else None
            best_text = f"{statistics.fmean(t):.1f} s by {len(t)}, the others' best" if t else "best"
            return f"not reached ({len(t)}/{n}; {best_text} {_fmt(top, '.3f')})"
        if n == 1:
            return f"{t[0]:.1f} s (1/1)"
        return f"{statistics.fmean(t):.1f} +- {(max(t) - min(t)) / 2:.1f} s ({n}/{n})"

    @property
    def every(self) -> int:
        return int(((self.done[0].results or {}).get("exchange") or {}).get("every", 1)) if self.done else 1

    def exposed_per_exchange_ms(self) -> float | None:
        """The communication the step waited for per exchange (decoding left out)."""
        exposed, decode = self.mean("comm_exposed_ms"), self.mean("decompress_ms") or 0.0
        return None if exposed is None else max(0.0, exposed - decode) * self.every

    def skew_per_exchange_ms(self) -> float | None:
        """The part of it rank 0 waited for the last rank to get to the exchange (compbench.train.skew)."""
        skew = self.mean("comm_skew_ms")
        return None if skew is None else skew * self.every

    def exposed_less_skew_per_exchange_ms(self) -> float | None:
        """The exposed communication per exchange that was neither decoding nor the wait for the last
        rank, taken step by step (summary comm_exposed_less_skew_ms: the difference of the medians
        would keep the wait, which about half the steps hold); where the ranks share no clock, no wait
        is known and the exposed communication is all of it."""
        less = self.mean("comm_exposed_less_skew_ms")
        return self.exposed_per_exchange_ms() if less is None else less * self.every

    def wire_per_exchange_ms(self, mbps: float) -> float | None:
        """One worker's bytes of an exchange at the link's rate (each way); of a sharded run's own
        collectives, booked as ZeRO++ counts volume (a unit's whole buffer), the (g-1)/g of it a
        worker sends in a shard group of g."""
        sent = self.mean("bytes_sent_per_step")
        if sent is None:
            return None
        sharded = [r.summary.get("sharded") or {} for r in self.done]
        if sharded and all(x.get("shard_group") for x in sharded):
            own = statistics.fmean((x["shard_group"] - 1) / x["shard_group"]
                                   * (float(x.get("bytes_gathered_per_step") or 0.0)
                                      + float(x.get("bytes_scattered_per_step") or 0.0)) for x in sharded)
            volume = statistics.fmean(float(x.get("bytes_gathered_per_step") or 0.0)
                                      + float(x.get("bytes_scattered_per_step") or 0.0) for x in sharded)
            sent += own - volume
        return sent * self.every * 8 / (mbps * 1e6) * 1e3

    def per_unit_bytes(self) -> float | None:
        """Bytes all workers sent per token (or sample) trained on."""
        sent, rate = self.mean("bytes_sent_per_step"), self.mean(_rate_key(self.race))
        step = self.mean("step_ms")
        if not (sent and rate and step):
            return None
        results = self.done[0].results
        assert results is not None  # a done run has its results
        workers = int(results["environment"]["world_size"])
        return sent * workers / (rate * step / 1e3)


def _rate_key(race: Race) -> str:
    return "tokens_per_s" if race.units == "tokens" else "throughput"


def _best(run: Run, race: Race) -> float | None:
    values = [p[race.metric] for p in (run.results or {}).get("curve", []) if p.get(race.metric) is not None]
    if not values:
        return None
    return max(values) if race.higher_is_better else min(values)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, spec)


Table = dict[tuple[str, Link], Cell]


def cells(runs: list[Run], race: Race) -> Table:
    out: Table = {}
    for r in runs:
        out.setdefault((r.method, r.link), Cell([], race)).runs.append(r)
    return out


# -- the model -------------------------------------------------------------------------------------

@dataclass
class Model:
    """The race's model: its coefficients, the runs it read (each with its profile), whether they
    were fitted on these runs (else: the prior, compbench.race.model.PRIOR) and the range they saw."""

    fit: Fit
    rows: list[tuple[Run, Profile]]
    fitted: bool
    mbps: tuple[float, float]         # the runs' lowest and highest bandwidth
    delays: tuple[float, ...]         # their one-way delays (ms)
    workers: tuple[int, ...]          # their worker counts

    def range_text(self) -> str:
        lo, hi = self.mbps
        return f"{lo:g} Mbit/s" if lo == hi else f"{lo:g}-{hi:g} Mbit/s"

    def beyond_mbps(self, mbps: float) -> bool:
        lo, hi = self.mbps
        return not lo * (1 - 1e-9) <= mbps <= hi * (1 + 1e-9)

    def unvalidated(self) -> list[str]:
        """Why the runs it read cannot rank methods at their load (compbench.race.to_target)."""
        return gaps_text(r.load_gap() for r, _ in self.rows)


def fitted(runs: list[Run]) -> Model | None:
    """The model of the race's finished runs (None with fewer than 5): fitted on them where they span
    MIN_BANDWIDTHS bandwidths or more, else the prior (compbench.race.model.fit_model)."""
    # a run on a trace has no one rate: the fit reads the shaped links' (compbench.race.on_trace predicts it);
    # a run under a fault waited for it (compbench.race.under_fault predicts that)
    rows = [(r, Profile.of(r.view)) for r in runs if r.ok and r.summary.get("step_ms") and not r.link.trace
            and not r.link.scenario]
    if len(rows) < 5:
        return None
    fit = fit_model([(p, r.mbps / 1e3, r.link.delay_ms, float(r.summary["step_ms"]), in_warmup(r, p))
                     for r, p in rows])
    rates = sorted({r.mbps for r, _ in rows})
    return Model(fit, rows, len(rates) >= MIN_BANDWIDTHS, (rates[0], rates[-1]),
                 tuple(sorted({r.link.delay_ms for r, _ in rows})),
                 tuple(sorted({p.workers for _, p in rows})))


def in_warmup(run: Run, profile: Profile) -> bool:
    """Whether the run's median step is a warm-up's (dense) one: the warm-up took most of its steps."""
    return int(run.summary.get("steps", 0)) < 2 * profile.warmup_steps


def predictions(fit: Fit, rows: list[tuple[Run, Profile]]) -> list[tuple[Run, float, float, Link]]:
    """(run, step ms predicted from its own profile, from its method's run on the fastest link (the
    one without delay where there is one), that link)."""
    fastest: dict[tuple[str, int], tuple[tuple[float, float], Profile, Link]] = {}
    for r, p in rows:
        rank = (r.mbps, -r.link.delay_ms)
        if (r.method, r.seed) not in fastest or rank > fastest[(r.method, r.seed)][0]:
            fastest[(r.method, r.seed)] = (rank, p, r.link)

    def predict(r: Run, p: Profile) -> float:
        return p.step_ms(fit, r.mbps / 1e3, latency_ms=r.link.delay_ms, dense=in_warmup(r, p))

    return [(r, predict(r, p), predict(r, fastest[(r.method, r.seed)][1]), fastest[(r.method, r.seed)][2])
            for r, p in rows]


@dataclass(frozen=True)
class OnTrace:
    """A trace run's predicted mean step (ms), walking its trace's schedule over its steps (to the
    target, or all it took; compbench.race.on_trace): from its own profile, from its method's run on
    the fastest shaped link (`source`), and that run's at the trace's mean rate and delay held
    constant (what walking the schedule changes)."""

    own_ms: float
    cross_ms: float
    flat_ms: float
    source: Link
    steps: float


def trace_predictions(model: Model, runs: list[Run], race: Race
                      ) -> tuple[dict[tuple[str, Link, int], OnTrace], dict[Link, str]]:
    """Each trace run's OnTrace (where its method ran on a shaped link too), and the trace links whose
    file no longer reads (their reason)."""
    fastest: dict[tuple[str, int | None], tuple[tuple[float, float], Profile, Link]] = {}
    for r, p in model.rows:
        rank = (r.mbps, -r.link.delay_ms)
        for key in ((r.method, r.seed), (r.method, None)):  # its seed's, else any seed's
            if key not in fastest or rank > fastest[key][0]:
                fastest[key] = (rank, p, r.link)
    out: dict[tuple[str, Link, int], OnTrace] = {}
    unread: dict[Link, str] = {}
    for r in runs:
        source = fastest.get((r.method, r.seed)) or fastest.get((r.method, None))
        # a trace run under a fault waited for it: not the trace's walk (compbench.race.under_fault's)
        traced = r.ok and r.link.trace and not r.link.scenario and r.summary.get("step_ms")
        if not traced or source is None or r.link in unread:
            continue
        try:
            trace = load_link_trace(r.link, r.workers)
        except ValueError as e:
            unread[r.link] = str(e)
            continue
        t = r.to_target(race)
        steps = t.steps if t is not None else float(r.summary.get("steps") or 0)
        if steps <= 0:
            continue
        fit, profile = model.fit, source[1]
        flat = profile.time_ms(steps, fit, mean_mbps(trace) / 1e3, latency_ms=mean_delay_ms(trace))
        out[(r.method, r.link, r.seed)] = OnTrace(
            time_on_trace_ms(Profile.of(r.view), steps, fit, trace) / steps,
            time_on_trace_ms(profile, steps, fit, trace) / steps, flat / steps, source[2], steps)
    return out, unread


# -- writing ---------------------------------------------------------------------------------------


def _header(race: Race, priced: bool = False) -> tuple[str, ...]:
    u = race.units[:-1]  # token, sample
    return ("method", "link (Mbit/s[:one-way ms])", "time to target (s, step clock)",
            *(("cost to target (USD, step clock)",) if priced else ()),
            "crossing's resolution (+- s, steps)", "step clock", "wall-clock to target (s)",
            f"{race.units} to target", f"{race.units}/s (step clock)", "x baseline",
            "step ms (q1-q3, step clock)", "step ms predicted", "utilization (wall clock)", f"bytes per {u}",
            "peak kB/step", "exposed comm ms/exchange", "of it waiting for the last rank", "wire ms/exchange",
            "fault scenario", "goodput (wall clock)", "loaded runs")


Checks = Callable[[Table], list[tuple[str, bool | None, str]]]
Predicted = dict[tuple[str, Link, int], tuple[float, float]]  # (method, link, seed) -> (own, cross) ms


def write(out: Path, race: Race, runs: list[Run], quick: bool, checks: Checks | None,
          whatif: WhatIf | None = None, not_run: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """race.md, race.csv, race_curves.csv and plots/ into `out`; race.md's text. `whatif`: the
    configuration the model's what-if predicts (default: WhatIf's, 8 workers); `not_run`: the
    methods not run under each fault scenario, with why (compbench.race.scenarios)."""
    whatif = whatif or WhatIf()
    table = cells(runs, race)
    methods = list(dict.fromkeys(r.method for r in runs))
    links = sorted({r.link for r in runs})
    model = fitted(runs)
    predicted: Predicted = {}
    sources: dict[tuple[str, Link, int], Link] = {}
    if model is not None:
        for r, own, cross, source in predictions(model.fit, model.rows):
            predicted[(r.method, r.link, r.seed)] = (own, cross)
            sources[(r.method, r.link, r.seed)] = source
    prices = whatif.prices
    on_trace, unread = trace_predictions(model, runs, race) if model is not None else ({}, {})
    # the tables' predictions: the shaped links' (the model's check reads those alone) and the traces'
    shown: Predicted = {**predicted, **{k: (p.own_ms, p.cross_ms) for k, p in on_trace.items()}}
    rows = [_row(race, table, c, method, link, shown, prices) for method in methods for link in links
            if (c := table.get((method, link))) is not None]
    config: dict = next(((r.results or {})["config"] for r in runs if r.ok), {})
    budget = config.get("max_train_s")
    target = f"{race.metric} {'>=' if race.higher_is_better else '<='} {race_target_value(race, runs):g}"
    lines = [f"# Race: {race.name}{' (quick: not evidence)' if quick else ''}", "",
             f"Target {target}, budget {budget} s of training per run, links "
             f"{'; '.join(x.label for x in links)} (rate each way, one-way delay), units: {race.units}. "
             "Time to target: the "
             f"{race.units} each run took to reach it (interpolated between its evaluations: the crossing's "
             "resolution, +- half the interval between the evaluations around it, stands beside every time "
             "to target) times its median step on the link, mean +- half the range over the seeds that "
             "reached it. Two clocks: the **wall clock** (a run's measured step, and the raw wall-clock "
             "training seconds to the target, evaluations and start-up left out), and the **unloaded "
             "estimate** (a loaded run's step on an unloaded machine, from its CPU time: communication's "
             "wall time plus the rest's CPU time over the compute threads). The `step clock` column says "
             "which a row's times and rates are on: the wall clock of the runs on an idle machine, the "
             "estimate of the loaded ones.", "",
             *_ran_lines(runs, table, config), "", *_price_lines(prices)]
    if not any(c.decomposed for c in table.values()):
        lines += [f"**No verdict: no method reached the target within the budget ({budget} s of "
                  "training); the budget is too small for this target: raise max_train_s or take a nearer "
                  "target.**", ""]
    loaded = sum(c.loaded for c in table.values())
    if loaded:
        lines += [f"**{loaded} of {sum(len(c.done) for c in table.values())} runs ran on a loaded machine** "
                  "(other work's runnable tasks above the cores the run leaves free by half a core: the "
                  f"`loaded runs` column). Their workers ran at {_niceness(table)}, but their wall-clock "
                  "figures are the machine's as much as the method's, so their step times, rates and times "
                  "to target are the estimates of an unloaded step (race.csv: `step ms measured` beside "
                  "`step ms unloaded estimate`); where that estimate is not validated at their load, the "
                  "race ranks nothing there (below: the two clocks, and the verdict per link).", ""]
    lines += [tabulate(rows, headers=_header(race, prices is not None), tablefmt="github",
                       disable_numparse=True), ""]
    lines += _clock_lines(table, methods, links)
    plain = [x for x in links if not x.scenario]  # the links without a fault: the verdicts and the model's
    lines += _verdict_lines(race, table, methods, plain)
    lines += fault_lines(out / "plots", race, runs, table, methods, links,
                         {x: _verdict(race, table, methods, x)[3] for x in links}, not_run or {},
                         model.fit if model is not None else PRIOR,
                         f"seeds per method and link: {_seeds_text(table)}; {_load_text(runs)}")
    lines += _trace_lines(out / "plots", race, runs, table, methods, [x for x in links if x.trace], on_trace,
                          unread)
    lines += _model_lines(race, table, methods, plain, model, predicted, sources, whatif)
    if checks is not None:
        lines += ["## Targets", "",
                  tabulate([(text, "no verdict" if met is None else "yes" if met else "NO", figures)
                            for text, met, figures in checks(table)],
                           headers=("target", "met?", "figures"), tablefmt="github", disable_numparse=True),
                  ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "race.md").write_text(text + "\n")
    _write_csv(out / "race.csv", *_run_table(race, runs, shown, prices))
    _write_csv(out / "race_curves.csv", *_curve_table(race, runs))
    _plots(out / "plots", race, runs, table, methods, links, model, quick)
    if prices is not None:
        _cost_plot(out / "plots" / "cost_to_target.png", race, runs, table, methods, links, prices, quick)
    return text


def _price_lines(prices: Prices | None) -> list[str]:
    """What the costs are (compbench.race.cost), said once above the table."""
    if prices is None:
        return []
    return [f"Cost to target at `--prices {prices}` ({prices.text()}; compbench.race.cost): the workers x "
            "the time to target (step clock) x the device-hour price, plus the bytes every worker had sent "
            "at the crossing (its curve's bytes_sent, interpolated as the tokens are) x the GB price. On "
            "this machine's emulated links each worker sits behind its own shaped link, so every byte a "
            "worker sends counts as leaving its node.", ""]


def _span(values: Sequence[float], spec: str) -> str:
    """`a` or `a-b`: the range of recorded values."""
    if not values:
        return "not recorded"
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _seeds_text(table: Table) -> str:
    """The seeds each method ran (the most of any of its links): `2`, or `2 (onebit-adam 3)`."""
    per: dict[str, int] = {}
    for (method, _), c in table.items():
        per[method] = max(per.get(method, 0), len(c.runs))
    if not per:
        return "none"
    common = statistics.mode(per.values())
    others = [f"{m} {n}" for m, n in per.items() if n != common]
    return f"{common}" + (f" ({', '.join(others)})" if others else "")


def _load_text(runs: Sequence[Run]) -> str:
    """The load the finished runs recorded: how many were loaded, other work's demand (busy loops per
    core) and the 1-minute load average around them."""
    done = [r for r in runs if r.ok]
    per_core = [x for r in done if (x := others_per_core(r.environment)) is not None]
    averages = [float(r.environment[k]) for r in done for k in ("load_before", "load_after")
                if r.environment.get(k) is not None]
    cores = sorted({int(r.environment["cores"]) for r in done if r.environment.get("cores")})
    on = f" on {'/'.join(map(str, cores))} cores" if cores else ""
    others = (f"other work {_span(per_core, '.2f')} busy loops per core" if per_core
              else "other work not recorded")
    average = f", load average {_span(averages, '.1f')}{on}" if averages else ""
    return f"{sum(r.loaded for r in done)} of {len(done)} runs loaded; {others}{average}"


def _ran_lines(runs: Sequence[Run], table: Table, config: dict) -> list[str]:
    """What ran, as the runs recorded it (results.json environment and config), not the race's
    defaults: workers, compute threads, CPU priority, the budget's clock, seeds and the load."""
    done = [r for r in runs if r.ok]
    workers = sorted({int(r.environment["world_size"]) for r in done if r.environment.get("world_size")})
    threads = sorted({int(r.environment["threads_per_rank"]) for r in done
                      if r.environment.get("threads_per_rank") is not None})
    clocks = sorted({str(c) for r in done
                     if (c := ((r.results or {}).get("config") or {}).get("budget_clock"))})
    return [f"What ran (the runs' results.json): {'/'.join(map(str, workers)) or 'an unrecorded number of'} "
            f"workers of {'/'.join(map(str, threads)) or 'an unrecorded number of'} compute thread(s) each, "
            f"at {_niceness(table)}, the budget on the {'/'.join(clocks) or 'wall'} clock; seeds "
            f"{_seeds_text(table)}; {_load_text(runs)}."]


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A tidy CSV: numbers as numbers (a missing one empty), so that a spreadsheet or
    pandas.read_csv reads numeric columns."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
                           for v in row] for row in rows])


def _run_table(race: Race, runs: list[Run], predicted: Predicted, prices: Prices | None = None
               ) -> tuple[list[str], list[list[Any]]]:
    """race.csv: one row per run, each column one figure with its unit in the header."""
    u = race.units[:-1]
    header = ["method", "link (Mbit/s)", "one-way delay (ms)", "seed", "reached", f"{race.units} to target",
              f"{race.units} to target resolution", "steps to target", "step ms", "step ms q1", "step ms q3",
              "step ms measured", "step ms unloaded estimate",
              "step ms predicted", "time to target (s)", "time to target predicted (s)",
              "wall-clock to target (s)", f"{race.units}/s", "utilization", f"bytes per {u}",
              "peak bytes/step", "exposed comm ms/exchange", "waiting for the last rank ms/exchange",
              "wire ms/exchange", "steps", "loaded",
              "load before", "load after", "commit",
              # the clocks: which the step ms and time to target are on, the same tokens at the measured
              # step, the crossing's interval in steps, the load the estimate's validation reads
              "step clock", "time to target at the measured step (s)", "steps to target resolution",
              "family", "other work (busy loops per core)", "nice", "threads per worker",
              # the cost (compbench.race.cost): empty without --prices; the bytes whatever the prices
              "workers", "bytes per worker to target", "cost to target (USD)",
              "devices' cost to target (USD)", "egress cost to target (USD)",
              "cost to target predicted (USD)", "device-hour price (USD)", "egress price (USD/GB)",
              # a link replayed from a trace (compbench.race.on_trace): its name or file; link (Mbit/s) is
              # then its slowest worker's mean rate
              "trace",
              # the fault scenario (compbench.race.scenarios) and summary.goodput (compbench.records.goodput)
              "fault scenario", *(k.replace("_", " ") for k in GOODPUT_KEYS)]
    rows = []
    for r in runs:
        if not r.ok:
            rows.append([r.method, r.mbps, r.link.delay_ms, r.seed, False,
                         *[None] * (len(header) - 7 - len(GOODPUT_KEYS)), r.link.trace or None, r.link.fault,
                         *[None] * len(GOODPUT_KEYS)])
            continue
        one, t = Cell([r], race), r.to_target(race)
        target, env = r.summary.get("target") or {}, (r.results or {}).get("environment") or {}
        pred = predicted.get((r.method, r.link, r.seed), (None, None))[1]
        rows.append([r.method, r.mbps, r.link.delay_ms, r.seed, bool(target.get("reached")),
                     _round(t.units if t else None),
                     _round(t.resolution if t else None), _round(t.steps if t else None),
                     _round(r.summary.get("step_ms")),
                     _round(r.summary.get("step_ms_q1")), _round(r.summary.get("step_ms_q3")),
                     _round(r.measured.get("step_ms")), _round(r.measured.get("step_unloaded_ms")),
                     _round(pred),
                     _round(t.seconds() if t else None), _round(t.seconds(pred) if t and pred else None),
                     _round(target.get("train_s") if target.get("reached") else None),
                     _round(r.summary.get(_rate_key(race))),
                     _round(r.summary.get("utilization")), _round(one.per_unit_bytes()),
                     r.summary.get("peak_bytes_per_step"), _round(one.exposed_per_exchange_ms()),
                     _round(one.skew_per_exchange_ms()),
                     _round(None if r.link.trace else one.wire_per_exchange_ms(r.mbps)),
                     r.summary.get("steps"),
                     r.loaded, env.get("load_before"), env.get("load_after"),
                     env.get("commit"), "unloaded estimate" if r.estimated else "wall clock",
                     _round(t.wall_seconds(r.wall_step_ms) if t and r.wall_step_ms else None),
                     _round(t.resolution_steps if t else None), r.family,
                     _round(others_per_core(env)), env.get("nice"), env.get("threads_per_rank"),
                     *_cost_columns(r, t, pred, prices), r.link.trace or None, r.link.fault,
                     *(goodput_of(r, k) for k in GOODPUT_KEYS)])
    return header, rows


def _cost_columns(r: Run, t: ToTarget | None, predicted_ms: float | None, prices: Prices | None
                  ) -> list[Any]:
    """race.csv's cost columns of a finished run: workers, bytes per worker to target, the cost to
    target and its two parts (devices, egress), the predicted cost (the predicted time, the same
    bytes) and the prices (the cost columns empty without prices or without a crossing)."""
    sent = t.bytes_sent if t else None
    if prices is None or t is None:
        return [r.workers, _round(sent), None, None, None, None, *(
            (prices.device_hour, prices.egress_gb) if prices else (None, None))]
    split = prices.split_usd(r.workers, t.seconds(), sent)
    pred = prices.cost_usd(r.workers, t.seconds(predicted_ms), sent) if predicted_ms else None
    device, egress = split if split else (None, None)
    return [r.workers, _round(sent), _round(sum(split) if split else None), _round(device), _round(egress),
            _round(pred), prices.device_hour, prices.egress_gb]


def _curve_table(race: Race, runs: list[Run]) -> tuple[list[str], list[list[Any]]]:
    """race_curves.csv: one row per evaluation of every run."""
    metrics = list(dict.fromkeys(k for r in runs for p in (r.results or {}).get("curve", [])
                                 for k in p if k.startswith("eval/")))
    header = ["method", "link (Mbit/s)", "one-way delay (ms)", "seed", "step", race.units, "training s",
              "wall s", "bytes sent", *metrics]
    rows = [[r.method, r.mbps, r.link.delay_ms, r.seed, p.get("step"), p.get(race.units), p.get("train_s"),
             p.get("wall_s"), p.get("bytes_sent"), *(p.get(m) for m in metrics)]
            for r in runs for p in (r.results or {}).get("curve", [])]
    return header, rows


def _round(v: float | None) -> float | None:
    return None if v is None else round(float(v), 6)


def _row(race: Race, table: Table, c: Cell, method: str, link: Link, predicted: Predicted,
         prices: Prices | None = None) -> tuple[str, ...]:
    base = table.get((race.baseline, link))
    rate, base_rate = c.mean(_rate_key(race)), base.mean(_rate_key(race)) if base else None
    preds = [predicted[(method, link, r.seed)][1] for r in c.done if (method, link, r.seed) in predicted]
    units = [t.units for t in c.decomposed]
    q1, q3 = c.mean("step_ms_q1"), c.mean("step_ms_q3")
    spread = f" ({q1:.1f}-{q3:.1f})" if q1 is not None and q3 is not None else ""
    return (method, str(link), c.time_to_target(), *((c.cost_to_target(prices),) if prices else ()),
            c.resolution(), c.clock() if c.done else "-",
            _fmt(statistics.fmean(c.reached) if c.reached else None, ".1f"),
            _fmt(statistics.fmean(units) if units else None, ",.0f"), _fmt(rate, ",.0f"),
            _fmt(rate / base_rate if rate and base_rate else None, ".2f"),
            _fmt(c.mean("step_ms"), ".1f") + spread,
            _fmt(statistics.fmean(preds) if preds else None, ".1f"), _fmt(c.mean("utilization"), ".2f"),
            _fmt(c.per_unit_bytes(), ".3g"), _fmt((c.mean("peak_bytes_per_step") or 0) / 1e3, ".1f"),
            _fmt(c.exposed_per_exchange_ms(), ".1f"), _fmt(c.skew_per_exchange_ms(), ".1f"),
            _fmt(None if link.trace else c.wire_per_exchange_ms(link.mbps), ".1f"),  # a trace: no one rate
            link.fault, goodput_text(c), f"{c.loaded}/{len(c.done)}")


def _validation_text() -> str:
    """What compbench.race.to_target.VALIDATED holds, in words."""
    measured = {k: v for k, v in VALIDATED.items() if v is not None}
    if not measured:
        return ("not measured yet for any method family at any load (compbench.race.to_target.VALIDATED is "
                "empty; scripts/validate_unloaded.py measures it): no loaded run can rank methods")
    return "measured: " + ", ".join(f"{f} at {n} busy loop(s) per core {v:.2f}x the idle wall clock"
                                    for (f, n), v in sorted(measured.items()))


def _clock_lines(table: Table, methods: list[str], links: list[Link]) -> list[str]:
    """The two clocks side by side per method and link: the measured step (wall clock) and the
    unloaded estimate, their ratio, the load around the runs, and whether the estimate is validated
    there for the method's family; none where no run recorded an estimate."""
    rows = []
    for m in methods:
        for link in links:
            c = table.get((m, link))
            if c is None or not c.done:
                continue
            estimates = [float(r.measured["step_unloaded_ms"]) for r in c.done
                         if r.measured.get("step_unloaded_ms")]
            if not estimates:
                continue
            wall = [w for r in c.done if (w := r.wall_step_ms) is not None]
            ratio = statistics.fmean(estimates) / statistics.fmean(wall) if wall else None
            per_core = [x for r in c.done if (x := others_per_core(r.environment)) is not None]
            reasons = c.load_reasons()
            state = ("idle: the wall clock ranks" if not c.loaded else
                     "no: " + "; ".join(reasons) if reasons else "yes")
            rows.append((m, str(link), c.done[0].family, f"{c.loaded}/{len(c.done)}", _span(per_core, ".2f"),
                         _fmt(statistics.fmean(wall) if wall else None, ".1f"),
                         _fmt(statistics.fmean(estimates), ".1f"), _fmt(ratio, ".2f"), state))
    if not rows:
        return []
    return ["## The two clocks", "",
            "Each method's measured step (wall clock) beside its unloaded estimate (CPU time), the load "
            "around its runs (other work's runnable tasks per core while they trained) and whether the "
            "estimate is validated for its family at that load. The validation: " + _validation_text() + ".",
            "",
            tabulate(rows, headers=("method", "link", "family", "loaded runs", "other work (busy loops/core)",
                                    "step ms, wall clock", "step ms, unloaded estimate", "estimate / wall",
                                    "estimate validated at this load?"),
                     tablefmt="github", disable_numparse=True), ""]


def _spread(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half the range)."""
    return statistics.fmean(values), (max(values) - min(values)) / 2


def _verdict(race: Race, table: Table, methods: list[str], link: Link) -> tuple[str, str, str, str]:
    """One link's verdict: (the order by the step clock, by the wall clock, loaded runs, verdict).
    The methods that reached the target in every seed are ranked, first to the target first, each
    time with its crossing's resolution. No verdict at this load where a loaded run's estimate is not
    validated for its family at its load, or where the two clocks order two methods the other way
    round by more than the seeds' spread (half the range, both methods' together)."""
    here = [(m, c) for m in methods if (c := table.get((m, link))) is not None and c.done]
    ranked = [(m, c) for m, c in here if c.decomposed and len(c.decomposed) == len(c.done)]
    step = {m: _spread(c.seconds()) for m, c in ranked}
    wall = {m: _spread(c.seconds("wall")) for m, c in ranked}
    res = {m: statistics.fmean(t.resolution_s() for t in c.decomposed) / 2 for m, c in ranked}

    def order(times: dict[str, tuple[float, float]]) -> str:
        return " < ".join(f"{m} {times[m][0]:.1f} +- {times[m][1]:.1f} s (crossing +-{res[m]:.1f})"
                          for m in sorted(times, key=lambda k: times[k][0])) or "-"

    flips = []
    for i, (a, _) in enumerate(ranked):
        for b, _ in ranked[i + 1:]:
            d_step, d_wall = step[a][0] - step[b][0], wall[a][0] - wall[b][0]
            beyond = (abs(d_step) > step[a][1] + step[b][1]) or (abs(d_wall) > wall[a][1] + wall[b][1])
            if d_step * d_wall < 0 and beyond:
                first, second = (a, b) if d_wall < 0 else (b, a)
                flips.append(f"by the wall clock {first} before {second}, beyond the seeds' spread")
    reasons = gaps_text(r.load_gap() for _, c in here for r in c.done)
    loaded = f"{sum(c.loaded for _, c in here)}/{sum(len(c.done) for _, c in here)}"
    missed = [m for m, c in here if (m, c) not in ranked]
    if reasons or flips:
        verdict = "**no verdict at this load**: " + "; ".join([*reasons, *flips])
    elif not ranked:
        verdict = "no verdict: no method reached the target in every seed"
    else:
        verdict = " < ".join(m for m in sorted(step, key=lambda k: step[k][0]))
    if missed and ranked:
        verdict += f" (not reached in every seed: {', '.join(missed)})"
    return order(step), order(wall), loaded, verdict


def _verdict_lines(race: Race, table: Table, methods: list[str], links: list[Link]) -> list[str]:
    if not links:  # every link ran under a fault: the fault section's verdicts
        return []
    rows = [(str(link), *_verdict(race, table, methods, link)) for link in links]
    return ["## The verdict per link", "",
            "First to the target first, among the methods that reached it in every seed: the decomposed "
            "time to target (s, mean +- half the range over the seeds, and the crossing's resolution) on the "
            "step clock (the wall clock of idle runs, the unloaded estimate of loaded ones) and on the wall "
            "clock (the same tokens at each run's measured step).", "",
            tabulate(rows, headers=("link", "order, step clock", "order, wall clock", "loaded runs",
                                    "verdict"), tablefmt="github", disable_numparse=True), ""]


def _trace_lines(folder: Path, race: Race, runs: list[Run], table: Table, methods: list[str],
                 trace_links: list[Link], on_trace: dict[tuple[str, Link, int], OnTrace],
                 unread: dict[Link, str]) -> list[str]:
    """Each trace link: the trace in figures (its length, the effective link's range and mean, what
    happened after its end), each method's time to target on it measured and predicted by walking the
    schedule (compbench.race.on_trace) beside the prediction at its mean held constant, and its figure
    (plots/trace_NAME.png, compbench.race.trace_plot)."""
    if not trace_links:
        return []
    from compbench.race.trace_plot import draw_trace, throughput

    lines = ["## Links that change: traces", "",
             "A trace link replays a trace on the runs' links (net.trace: each worker's rate, one-way delay "
             "and loss over time from the workers' start; compbench.network.trace). The model takes the "
             "effective link at each moment, the slowest worker's rate and the longest one-way delay between "
             "two workers (loss left out), and walks the schedule: each step at the model's step time on the "
             "link in force when it starts, from the method's run on the fastest shaped link (and from the "
             "trace run's own profile, its compute as measured there). Two approximations: the walk's "
             "clock is the training clock, while the trace's clock runs from the workers' start "
             "(evaluations and start-up come between), and a periodic mode's exchange is spread over its "
             "round. Beside it, the same run's prediction at the trace's mean rate and delay held "
             "constant: where the two differ, the link's changes, not its mean, decided the time.", ""]
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    for link in trace_links:
        done = [r for r in runs if r.link == link and r.ok]
        name = f"trace_{link.trace_name}.png"
        try:
            trace = load_link_trace(link, max((r.workers for r in done), default=1))
        except ValueError as e:
            lines += [f"**{link.label}** (`--links {link}`): its trace no longer reads "
                      f"({unread.get(link, e)}), so the race shows and predicts nothing of it.", ""]
            continue
        parts = stretches(trace)
        walls = [float(curve[-1]["wall_s"]) for r in done if (curve := (r.results or {}).get("curve"))]
        past = sum(w > trace.duration_s for w in walls)
        lost = max(s.loss for states in trace.states for s in states)
        low, high = min(p[1] for p in parts), max(p[1] for p in parts)
        lines += [f"**{link.label}** (`--links {link}`): {trace.duration_s:g} s, {len(parts) - 1} changes "
                  f"of the effective link, {low:.4g}-{high:.4g} Mbit/s "
                  f"(time-weighted mean {mean_mbps(trace):.4g}), one-way delay between two workers "
                  f"{min(p[2] for p in parts):g}-{max(p[2] for p in parts):g} ms, loss up to {lost:g}. After "
                  f"its {trace.duration_s:g} s its last settings hold: {past} of {len(walls)} runs trained "
                  f"past its end (the longest to {max(walls, default=0.0):.0f} s on the wall clock). "
                  f"Figure: plots/{name}.", ""]
        rows = []
        for m in methods:
            c = table.get((m, link))
            if c is None or not c.done:
                continue
            preds = [(r, t, on_trace.get((m, link, r.seed))) for r, t in c.reached_runs]
            walked = [t.seconds(p.cross_ms) for _, t, p in preds if p is not None]
            flat = [t.seconds(p.flat_ms) for _, t, p in preds if p is not None]
            steps = [p for r in c.done if (p := on_trace.get((m, link, r.seed))) is not None]
            sources = sorted({p.source.label for p in steps})
            rows.append((m, c.time_to_target(), _fmt(statistics.fmean(walked) if walked else None, ".1f"),
                         _fmt(statistics.fmean(flat) if flat else None, ".1f"),
                         _fmt(c.mean("step_ms"), ".1f"),
                         _fmt(statistics.fmean(p.own_ms for p in steps) if steps else None, ".1f"),
                         _fmt(statistics.fmean(p.cross_ms for p in steps) if steps else None, ".1f")
                         + (f" (from {', '.join(sources)})" if sources else "")))
        lines += [tabulate(rows, headers=("method", "time to target (s, step clock)",
                                          "predicted walking the trace (s)",
                                          "predicted at its mean held constant (s)",
                                          "step ms (step clock)", "step ms predicted, its own run",
                                          "step ms predicted from a shaped link's run"),
                           tablefmt="github", disable_numparse=True), ""]
        rates = {m: [throughput((r.results or {}).get("curve") or [], race.units) for r in done
                     if r.method == m] for m in methods}
        draw_trace(folder / name, trace, link.label, {m: v for m, v in rates.items() if v}, race.units,
                   colors, f"{race.name} race on {link.label}: the trace and the runs' throughput",
                   f"seeds per method and link: {_seeds_text(table)}; {_load_text(runs)}")
    return lines


RTT_RATE_MBPS = 200.0  # the rate of the round-trip crossover where the race has no link with delay


def _bandwidth_verdict(where: str, gbps: float | None, model: Model) -> str:
    """The bandwidth crossover in words, saying where it lies beyond the bandwidths the runs had."""
    seen = model.range_text()
    if where in ("everywhere", "nowhere"):
        some = "every" if where == "everywhere" else "no"
        return (f"at {some} bandwidth the runs had ({seen}); extrapolated: at {some} bandwidth from "
                "0.1 Mbit/s to 100 Gbit/s")
    assert gbps is not None
    mbps = gbps * 1e3
    text = (f"below {mbps:.3g} Mbit/s" if where == "below"
            else f"up to {mbps:.3g} Mbit/s, not everywhere below")
    return text + (f" (extrapolated beyond the runs' {seen})" if model.beyond_mbps(mbps)
                   else f" (within the runs' {seen})")


def _rtt_verdict(where: str, rtt: float | None, model: Model) -> str:
    """The round-trip crossover in words, saying where it lies beyond the round trips the runs had."""
    most = 2 * max(model.delays)
    beyond = (lambda x: x > most * (1 + 1e-9)) if most else (lambda x: True)
    seen = f"the runs' round trips up to {most:g} ms" if most else "no run had a delay"
    if where == "everywhere":
        return "at every round trip up to 2 s" + (f" (extrapolated: {seen})" if beyond(2000) else "")
    if where == "nowhere":
        return f"at no round trip up to 2 s (extrapolated: {seen})"
    assert rtt is not None
    text = f"above {rtt:.3g} ms" if where == "above" else f"from {rtt:.3g} ms, not everywhere above"
    return text + (f" (extrapolated: {seen})" if beyond(rtt) else "")


def _whatif_beyond(model: Model, whatif: WhatIf, rates: Sequence[float] = (10, 100, 1000)) -> str:
    """What of the what-if lies beyond the runs: `model, extrapolated beyond what the runs had: ...`
    or `model, within the runs' range`."""
    beyond = []
    if any(w != whatif.workers for w in model.workers):
        beyond.append(f"{'/'.join(map(str, model.workers))} workers")
    if whatif.per_node > 1:
        beyond.append("each its own machine")
    if whatif.latency_ms > max(model.delays):
        beyond.append(f"one-way delays of {', '.join(f'{d:g}' for d in model.delays)} ms")
    if any(model.beyond_mbps(x) for x in rates):
        beyond.append(model.range_text())
    if not beyond:
        return "model, within the runs' range"
    return f"model, extrapolated beyond what the runs had: {', '.join(beyond)}"


def _model_lines(race: Race, table: Table, methods: list[str], links: list[Link], model: Model | None,
                 predicted: Predicted, sources: dict[tuple[str, Link, int], Link],
                 whatif: WhatIf) -> list[str]:
    if model is None:
        return ["## The model", "", "The model needs at least 5 finished runs.", ""]
    fit, rows = model.fit, model.rows
    if not model.fitted:
        return ["## The model", "",
                f"**Not fitted: the race's runs are on one bandwidth ({model.range_text()}); a fit needs "
                f"links of {MIN_BANDWIDTHS} bandwidths or more** (`--links`: on one link a per-byte cost "
                "cannot be told from a per-collective one). The model keeps its prior "
                "(compbench.race.model.PRIOR: each link at its shaped rate, a delay waited once per "
                "message round, nothing per collective or round); the table's predicted steps are the "
                "prior's on each run's own link. No crossover and no extrapolation to other bandwidths, "
                "delays, workers or model sizes from one link.", ""]
    measured = {(r.method, r.link, r.seed): float(r.summary["step_ms"]) for r, _ in rows}
    # out of sample: a run predicted from its method's run on another link (a run is its own source
    # on the fastest link)
    other = {k: abs(cross / measured[k] - 1) for k, (_, cross) in predicted.items() if sources[k] != k[1]}
    delayed = [e for k, e in other.items() if k[1].delay_ms]
    source_links = sorted(set(sources.values()))
    source_text = ("the fastest link without delay" if all(not x.delay_ms for x in source_links)
                   else "the fastest link (with delay: the race has no faster link without one)")
    if other:
        within = sum(e <= 0.15 for e in other.values())
        check = (f"Each run's step time predicted from its method's run on {source_text}: {within} of "
                 f"{len(other)} runs on the other links within 15% of the measured one (target: 80%)"
                 + (f"; of the runs with delay, {sum(e <= 0.15 for e in delayed)} of {len(delayed)}"
                    if delayed else "") + ".")
    else:
        check = ("Prediction from another link: no verdict (no method ran on a link besides its fastest, "
                 "so every run would be predicted from itself).")
    delays = model.delays
    latency = (f"{fit.latency_factor:.2f} ms per ms of one-way delay per round (fitted on runs at "
               f"{', '.join(f'{d:g}' for d in delays)} ms)" if len(delays) >= 2 else
               "1 ms per ms of one-way delay per round (not fitted: the runs had one delay)")
    unvalidated = model.unvalidated()
    lines = ["## The model", "",
             f"Fitted on these runs (compbench.race.model; {model.range_text()}, one-way delays "
             f"{', '.join(f'{d:g}' for d in delays)} ms, {'/'.join(map(str, model.workers))} workers): "
             f"{fit.ms_per_queued:.3f} ms per queued and {fit.ms_per_waited:.3f} ms per waited collective, "
             f"{fit.ms_per_round:.3f} ms per message round, link factor {fit.link_factor:.2f}, {latency}. "
             + check, ""]
    if unvalidated:
        lines += ["**The fit read loaded runs' unloaded estimates that are not validated at their load** ("
                  + "; ".join(unvalidated) + "): its crossovers give no verdict at this load.", ""]
    profiles = {(r.method, r.link): p for r, p in rows}
    # each method's profile: its run on the fastest link, the one without delay where there is one
    fastest = {m: max((x for x in links if (m, x) in profiles), key=lambda x: (x.mbps, -x.delay_ms),
                      default=None) for m in methods}
    base_link = fastest.get(race.baseline)
    base_steps = table[(race.baseline, base_link)].steps_to_target if base_link is not None else None
    rtt_rates = sorted({x.mbps for x in links if x.delay_ms}) or [RTT_RATE_MBPS]
    beyond = _whatif_beyond(model, whatif)
    memory_beyond = ("model" if whatif.workers in model.workers and whatif.per_node == 1 else
                     f"model, extrapolated beyond what the runs had: {'/'.join(map(str, model.workers))} "
                     "workers, each its own machine")
    verdicts = []
    for m in methods:
        link = fastest.get(m)
        steps = _steps(table, m, links)
        memory = whatif.fits(_memory(profiles[(m, link)], whatif)) if link is not None else "-"
        whatif_time = "-"
        if link is not None and steps is not None:
            whatif_time = _whatif_times(profiles[(m, link)], steps, fit, whatif)
        if m == race.baseline:
            verdicts.append((m, "- (the baseline)", *["-"] * len(rtt_rates), whatif_time, memory))
            continue
        if link is None or steps is None or base_steps is None or base_link is None:
            verdicts.append((m, "- (the target was not reached)", *["-"] * len(rtt_rates), "-", memory))
            continue
        if unvalidated:
            verdicts.append((m, "no verdict at this load", *["no verdict at this load"] * len(rtt_rates),
                             whatif_time, memory))
            continue
        p, base = profiles[(m, link)], profiles[(race.baseline, base_link)]
        gbps, where_gbps = crossover_gbps(p, steps, base, base_steps, fit)
        verdict = _bandwidth_verdict(where_gbps, gbps, model)
        rtts = []
        for mbps in rtt_rates:
            rtt, where_rtt = crossover_rtt_ms(p, steps, base, base_steps, fit, mbps / 1e3)
            rtts.append(_rtt_verdict(where_rtt, rtt, model))
        verdicts.append((m, verdict, *rtts, whatif_time, memory))
    where = _whatif_place(whatif)
    header = ("method", "reaches the target before the baseline (no delay)",
              *(f"... at {x:g} Mbit/s, round trips" + (" (model, beyond the runs' bandwidths)"
                                                      if model.beyond_mbps(x) else "") for x in rtt_rates),
              f"time to target at 10 / 100 / 1000 Mbit/s, {where} ({beyond})",
              f"memory per worker, {whatif.workers} workers ({memory_beyond}): fits {whatif.memory_gb:g} GB?")
    if whatif.prices is not None:  # the cost at the what-if's predicted times, each row's last cell
        costs = [_whatif_costs(profiles[(m, x)], steps, _bytes_to_target(table, m, links), fit, whatif)
                 if (x := fastest.get(m)) is not None and (steps := _steps(table, m, links)) is not None
                 else "-" for m in methods]
        verdicts = [(*row, cost) for row, cost in zip(verdicts, costs, strict=True)]
        header = (*header, f"cost to target at 10 / 100 / 1000 Mbit/s, {whatif.workers} workers, USD at "
                           f"`--prices {whatif.prices}` ({beyond}; every byte leaves its node)")
    lines = [*lines, tabulate(verdicts, headers=header, tablefmt="github", disable_numparse=True), ""]
    sized = []
    for m in methods:
        link = fastest.get(m)
        own = profiles[(m, link)] if link is not None else None
        if own is None or own.memory is None:
            continue
        for numel in (float(own.memory.numel), *whatif.params):
            q = own.scaled(numel)
            label = f"{numel:.3g}" + (" (its run)" if numel == own.memory.numel else " (extrapolated)")
            sized.append((m, label, _whatif_times(q, None, fit, whatif),
                          whatif.fits(_memory(q, whatif))))
    if sized:
        lines += [f"What-if by model size, {where}: a step's time and a worker's memory (parameters, "
                  "gradients and optimizer state over its shard group, the activations its run measured and "
                  "the weights a sharded worker holds gathered; compbench.race.model), the model grown in "
                  "depth and width together from its run's; the tokens a step as in the race.", "",
                  tabulate(sized, headers=("method", "parameters",
                                           f"step ms at 10 / 100 / 1000 Mbit/s ({beyond})",
                                           f"memory per worker ({memory_beyond}): fits "
                                           f"{whatif.memory_gb:g} GB?"),
                           tablefmt="github", disable_numparse=True), ""]
    return lines


def _whatif_place(whatif: WhatIf) -> str:
    per = "each its own machine" if whatif.per_node == 1 else f"{whatif.per_node} to a machine"
    return f"{whatif.workers} workers ({per}), {whatif.latency_ms:g} ms per message round"


def _whatif_times(p: Profile, steps: float | None, fit: Fit, whatif: WhatIf) -> str:
    """Seconds to `steps` steps (None: a step's ms) at 10 / 100 / 1000 Mbit/s in the what-if's
    configuration; '-' where its workers do not make the method's shard groups."""
    try:
        times = [p.step_ms(fit, g / 1e3, whatif.workers, whatif.latency_ms, per_node=whatif.per_node)
                 if steps is None else
                 p.time_ms(steps, fit, g / 1e3, whatif.workers, whatif.latency_ms, whatif.per_node) / 1e3
                 for g in (10, 100, 1000)]
    except ValueError:
        return "-"
    if steps is None:
        return " / ".join(f"{t:,.0f}" if t >= 100 else f"{t:.1f}" for t in times)
    return " / ".join(f"{t:.0f} s" for t in times)


def _whatif_costs(p: Profile, steps: float, bytes_per_worker: float | None, fit: Fit, whatif: WhatIf) -> str:
    """USD to the target at 10 / 100 / 1000 Mbit/s in the what-if's configuration: its N workers x the
    predicted time x the device-hour price + N x the bytes per worker to target x the GB price
    (compbench.race.cost); '-' where the time or the bytes are not known."""
    assert whatif.prices is not None
    try:
        seconds = [p.time_ms(steps, fit, g / 1e3, whatif.workers, whatif.latency_ms, whatif.per_node) / 1e3
                   for g in (10, 100, 1000)]
    except ValueError:  # its workers do not make the method's shard groups
        return "-"
    costs = [whatif.prices.cost_usd(whatif.workers, t, bytes_per_worker) for t in seconds]
    return " / ".join("-" if c is None else f"{c:.3g}" for c in costs)


def _bytes_to_target(table: Table, method: str, links: list[Link]) -> float | None:
    """The bytes one worker sent to the target, over the links where the method reached it (they do
    not depend on the link)."""
    sent = [b for x in links if (c := table.get((method, x))) is not None and (b := c.bytes_to_target())
            is not None]
    return statistics.fmean(sent) if sent else None


def _memory(p: Profile, whatif: WhatIf) -> dict[str, float] | None:
    try:
        return p.memory_bytes(whatif.workers, whatif.per_node)
    except ValueError:  # the what-if's workers do not make the run's shard groups
        return None


def _steps(table: Table, method: str, links: list[Link]) -> float | None:
    """Steps to the target, over the links where the method reached it (the steps do not depend on
    the link; the time does)."""
    steps = [s for x in links if (c := table.get((method, x))) is not None and (s := c.steps_to_target)]
    return statistics.fmean(steps) if steps else None


MARKERS = "osD^P*<>ph"  # a method's marker (with its colour); x: a loaded seed, v: no seed reached it


def _footnote(fig: Any, runs: Sequence[Run], table: Table) -> None:
    """The seeds and the load under every figure (a reader of the figure alone knows what ran)."""
    fig.text(0.01, 0.01, f"seeds per method and link: {_seeds_text(table)}; {_load_text(runs)}", fontsize=6.5,
             color="0.3", ha="left", va="bottom", wrap=True)


def _plots(folder: Path, race: Race, runs: list[Run], table: Table,
           methods: list[str], links: list[Link], model: Model | None, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    folder.mkdir(parents=True, exist_ok=True)
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    markers = {m: MARKERS[i % len(MARKERS)] for i, m in enumerate(methods)}
    unit = "nats/token" if race.metric == "eval/loss" else "%"
    note = " (quick: not evidence)" if quick else ""
    target = float(race_target_value(race, runs))
    for link in links:  # the metric against training seconds: every evaluation a marker, every seed a line
        fig, ax = plt.subplots(figsize=(6.5, 4.3))
        shown: list[str] = []
        any_loaded = False
        for r in runs:
            if r.link == link and r.ok:
                curve = [(p["train_s"], p[race.metric]) for p in (r.results or {}).get("curve", [])
                         if p.get(race.metric) is not None]
                if curve:
                    shown += [r.method] if r.method not in shown else []
                    any_loaded |= r.loaded
                    ax.plot(*zip(*curve, strict=True), ls="--" if r.loaded else "-", marker=markers[r.method],
                            ms=3, color=colors[r.method], lw=1)
        target_line = ax.axhline(target, ls=":", color="gray", lw=1, label=f"target {target:g}")
        ax.set_xlim(left=0)
        ax.set_xlabel("training seconds, wall clock (s)")
        ax.set_ylabel(f"{race.metric} ({unit})")
        ax.set_title(f"{race.name} race, {link.label}{note}", fontsize=10)
        # every seed its line, named by its method's colour and marker; a loaded run's dashed (its wall
        # clock is the machine's as much as the method's)
        handles: list[Any] = [Line2D([], [], color=colors[m], marker=markers[m], ms=3, lw=1, label=m)
                              for m in shown]
        handles.append(target_line)
        if any_loaded:
            handles.append(Line2D([], [], color="0.4", ls="--", lw=1,
                                  label="dashed: a loaded run (its wall clock\nstretched by other work)"))
        ax.legend(handles=handles, fontsize=7)
        _footnote(fig, runs, table)
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        fig.savefig(folder / f"curves_{link.folder}.png", dpi=100)
        plt.close(fig)
    _utilization_plot(plt, folder, race, runs, table, methods, links, model, note, colors, markers)
    _time_to_target_plot(plt, folder, race, runs, table, methods, links, note, colors, markers)


def _utilization_plot(plt: Any, folder: Path, race: Race, runs: list[Run], table: Table, methods: list[str],
                      links: list[Link], model: Model | None, note: str, colors: dict[str, str],
                      markers: dict[str, str]) -> None:
    """Compute utilization against bandwidth: each run a point (hollow: a link with delay), each
    method's model line over the bandwidths the fit saw (dotted beyond them; none without a fit)."""
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    handles: list[Any] = []
    for m in methods:
        shown = False
        for delayed in (False, True):  # a link with delay: a hollow marker
            xs = [(r.mbps, r.summary["utilization"]) for r in runs if r.method == m and r.ok
                  and not r.link.trace and not r.link.scenario  # no one rate to place it at; a fault's wait
                  and r.summary.get("utilization") is not None and bool(r.link.delay_ms) == delayed]
            if xs:
                shown = True
                ax.plot(*zip(*xs, strict=True), ls="", marker=markers[m], color=colors[m], alpha=0.8,
                        mfc="none" if delayed else colors[m])
        lined = False
        if model is not None and model.fitted:
            fit, rows = model.fit, model.rows
            fastest_first = sorted(rows, key=lambda rp: (-rp[0].mbps, rp[0].link.delay_ms))
            run_prof = next(((r, p) for r, p in fastest_first if r.method == m), None)
            if run_prof is not None:
                prof, scale = run_prof[1], _compute_scale(*run_prof)
                lo, hi = model.mbps
                grid = [10 ** (k / 10) for k in range(0, 41)]
                inside = [g for g in grid if lo <= g <= hi] or [lo, hi]
                inside = sorted({lo, *inside, hi})
                ax.plot(inside, [scale * prof.utilization(fit, g / 1e3) for g in inside], "-",
                        color=colors[m], lw=1)
                for part in ([g for g in grid if g <= lo], [g for g in grid if g >= hi]):
                    if len(part) > 1:
                        ax.plot(part, [scale * prof.utilization(fit, g / 1e3) for g in part], ":",
                                color=colors[m], lw=1)
                lined = True
        if shown or lined:
            handles.append(Line2D([], [], color=colors[m], marker=markers[m], ls="-" if lined else "",
                                  label=m))
    if any(x.delay_ms for x in links):
        handles.append(Line2D([], [], color="0.4", marker="o", mfc="none", ls="",
                              label="hollow: a link with delay"))
    if model is not None and model.fitted:
        estimated = any(r.estimated for r, _ in model.rows)
        handles += [Line2D([], [], color="0.4", ls="-",
                           label=f"model, fitted on {model.range_text()} (no delay)"
                           + (";\na loaded run's on its unloaded estimate" if estimated else "")),
                    Line2D([], [], color="0.4", ls=":", label="model, extrapolated beyond them")]
    ax.set_xscale("log")
    ax.set_xlabel("link rate each way (Mbit/s, log scale)")
    step_clock = any(r.estimated for r in runs if r.ok)
    ax.set_ylabel("compute utilization, compute time / step time\n"
                  + ("(points: wall clock; lines: the step clock)" if step_clock and model is not None
                     and model.fitted else "(wall clock)"))
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{race.name} race: compute utilization against bandwidth{note}", fontsize=10)
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left")
    else:
        ax.text(0.5, 0.5, "no run recorded its utilization", transform=ax.transAxes, ha="center", va="center")
    _footnote(fig, runs, table)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(folder / "utilization.png", dpi=100)
    plt.close(fig)


def _compute_scale(run: Run, profile: Profile) -> float:
    """What puts a run's compute on the clock of its step: a loaded run's step is its unloaded estimate
    while its phases were timed on the wall clock, so its compute shrinks as the rest of the step
    outside communication did (else compute / step, its utilization, would pass 1); 1 for others."""
    wall, comm = run.wall_step_ms, float(run.measured.get("comm_ms") or 0.0)
    if not run.estimated or not wall or wall <= comm:
        return 1.0
    return max(0.0, profile.fixed_ms) / (wall - comm)


def _time_to_target_plot(plt: Any, folder: Path, race: Race, runs: list[Run], table: Table,
                         methods: list[str], links: list[Link], note: str, colors: dict[str, str],
                         markers: dict[str, str]) -> None:
    """Time to target per link: each seed a point (a cross: a loaded run's, on the unloaded estimate),
    its error bar the crossing's resolution, the mean of the seeds that reached it a bar outline
    (dashed: not every seed did), k/n above every bar, and a triangle at 0 where no seed reached it."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(9.0, 0.55 * len(methods) * len(links) + 5.5), 4.8))
    top = max((t.seconds() + t.resolution_s() / 2 for c in table.values() for t in c.decomposed), default=1.0)
    for i, link in enumerate(links):
        for j, m in enumerate(methods):
            c = table.get((m, link))
            x = i * (len(methods) + 1) + j
            if c is None or not c.done:
                continue
            reached = c.reached_runs
            n = len(c.done)
            if not reached:  # a mark at the axis: the method ran and missed the target in every seed
                ax.plot([x], [0], marker="v", ms=9, color=colors[m], ls="", clip_on=False)
                ax.annotate(f"0/{n}", (x, 0), textcoords="offset points", xytext=(0, 7), ha="center",
                            fontsize=7, color=colors[m])
                continue
            seconds = [t.seconds() for _, t in reached]
            mean = statistics.fmean(seconds)
            ax.bar(x, mean, width=0.8, fill=False, edgecolor=colors[m], lw=1.2,
                   linestyle="-" if len(reached) == n else "--")
            for (r, t), sec in zip(reached, seconds, strict=True):
                ax.errorbar([x], [sec], yerr=[[t.resolution_s() / 2], [t.resolution_s() / 2]],
                            marker="x" if r.estimated else markers[m], ms=6, color=colors[m], ls="",
                            capsize=2, elinewidth=0.8)
            high = max(sec + t.resolution_s() / 2 for (_, t), sec in zip(reached, seconds, strict=True))
            ax.annotate(f"{len(reached)}/{n}", (x, max(mean, high)), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize=7, color=colors[m])
    if not any(c.decomposed for c in table.values()):
        ax.text(0.5, 0.5, "no method reached the target within the budget", transform=ax.transAxes,
                ha="center", va="center")
    group_ticks(ax, [x.label for x in links], len(methods))
    ax.set_xlabel("link (rate each way, one-way delay)")
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.set_ylabel(f"seconds to the target (s)\n{race.units} to it x the step time")
    ax.set_title(f"{race.name} race: time to target{note}\neach seed a point (error bar: the crossing's "
                 "resolution), the mean a bar\n(dashed: not every seed reached it); k/n: seeds that reached "
                 "it, a triangle at 0: none did", fontsize=8)
    handles: list[Any] = [Line2D([], [], color=colors[m], marker=markers[m], ls="",
                                 label=f"{m}: a seed (wall clock)") for m in methods]
    handles += [Line2D([], [], color="0.4", marker="x", ls="", label="a loaded seed (unloaded estimate)"),
                Patch(facecolor="none", edgecolor="0.4", label="mean of the seeds that reached it"),
                Patch(facecolor="none", edgecolor="0.4", linestyle="--",
                      label="... where not every seed did"),
                Line2D([], [], color="0.4", marker="v", ms=8, ls="", label="no seed reached it")]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _footnote(fig, runs, table)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(folder / "time_to_target.png", dpi=100)
    plt.close(fig)


def _cost_plot(path: Path, race: Race, runs: list[Run], table: Table, methods: list[str], links: list[Link],
               prices: Prices, quick: bool) -> None:
    """plots/cost_to_target.png (compbench.race.cost_plot): each method's cost to target per link."""
    from compbench.race.cost_plot import draw_cost

    bars = {(m, link.label): ([c for c in cell.costs(prices) if c is not None], len(cell.done))
            for m in methods for link in links if (cell := table.get((m, link))) is not None and cell.done}
    quick_note = " (quick: not evidence)" if quick else ""
    title = (f"{race.name} race: cost to target at --prices {prices}{quick_note}\nworkers x time to target "
             "(step clock) x device-hour price (filled) + bytes every worker sent x GB price (hatched)\n"
             "each seed's total a point; k/n: seeds that reached it, a triangle at 0: none did")
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    draw_cost(path, bars, methods, [x.label for x in links], colors, title,
              f"seeds per method and link: {_seeds_text(table)}; {_load_text(runs)}")


def race_target_value(race: Race, runs: list[Run]) -> Any:
    """The target value the runs were made with (their summaries record it)."""
    for r in runs:
        target = r.summary.get("target")
        if target:
            return target["value"]
    return float("nan")
