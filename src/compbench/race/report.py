"""The race's report: race.md, race.csv (one row per run), race_curves.csv (one row per evaluation),
plots/ and the what-if model's predictions beside the measurements (compbench.race.model).

Per link: each method's time to target decomposed (compbench.race.to_target: the tokens or samples it
took, read off its curve, times the step time on the link; mean +- half the range over the seeds
that reached it), beside the raw wall-clock training seconds to it; its tokens or samples per second
against the baseline's; the step time (median, quartiles) measured and predicted; its compute
utilization, bytes per token (or sample), the most bytes it sent in one step and the communication
its step waited for per exchange against the wire time of that exchange; how many of its runs ran on
a loaded machine. The decomposed figure is the one a loaded machine cannot fool: the tokens do not
depend on the load, and a loaded run's step time (its rates too) is its estimate of an unloaded step
from its CPU time (compbench.records.stats.StepStats.unloaded_ms). A race in which no method reached
the target says so (no verdict) instead of rating figures from a handful of steps. Then the model:
its fitted coefficients, its step times beside the measured ones, the bandwidth below which each
method reaches the target before the baseline, and a what-if table (compbench.race.model.WhatIf:
time to target at other workers and machines, each method's memory per worker and whether it fits;
a step's time and the memory at other model sizes). Plots: the metric against training
seconds per link (every evaluation a marker, every seed its own line), utilization against bandwidth
(each seed a point, the model's line), time to target per link (each seed a point, the mean a bar
outline: seeds are never stacked).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

from compbench.comm.cost_model import Fit
from compbench.race.model import Profile, WhatIf, crossover_gbps, crossover_rtt_ms, fit_model
from compbench.race.suites import Link, Race
from compbench.race.to_target import MIN_MEASURED_STEPS, ToTarget, step_times, to_target
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
        return to_target(self.results or {}, race.metric, race.higher_is_better, self.loaded)

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


def _niceness(table: Mapping[tuple[str, Link], Cell]) -> str:
    """The CPU priority the runs recorded (environment.nice: what ran, not the race's default)."""
    values = sorted({(r.results or {}).get("environment", {}).get("nice") for c in table.values()
                     for r in c.done} - {None})
    if not values:
        return "a CPU priority they did not record"
    return "nice " + ", ".join(f"{v:+d}" if v else "0" for v in values)


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
        return [t for r in self.done if (t := r.to_target(self.race)) is not None]

    @property
    def steps_to_target(self) -> float | None:
        steps = [t.steps for t in self.decomposed]
        return statistics.fmean(steps) if steps else None

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

def fitted(runs: list[Run]) -> tuple[Fit, list[tuple[Run, Profile]]] | None:
    rows = [(r, Profile.of(r.view)) for r in runs if r.ok and r.summary.get("step_ms")]
    if len(rows) < 5:
        return None
    return fit_model([(p, r.mbps / 1e3, r.link.delay_ms, float(r.summary["step_ms"]), in_warmup(r, p))
                      for r, p in rows]), rows


def in_warmup(run: Run, profile: Profile) -> bool:
    """Whether the run's median step is a warm-up's (dense) one: the warm-up took most of its steps."""
    return int(run.summary.get("steps", 0)) < 2 * profile.warmup_steps


def predictions(fit: Fit, rows: list[tuple[Run, Profile]]) -> list[tuple[Run, float, float]]:
    """(run, step ms predicted from its own profile, from its method's run on the fastest link, the
    one without delay where there is one)."""
    fastest: dict[tuple[str, int], tuple[tuple[float, float], Profile]] = {}
    for r, p in rows:
        rank = (r.mbps, -r.link.delay_ms)
        if (r.method, r.seed) not in fastest or rank > fastest[(r.method, r.seed)][0]:
            fastest[(r.method, r.seed)] = (rank, p)

    def predict(r: Run, p: Profile) -> float:
        return p.step_ms(fit, r.mbps / 1e3, latency_ms=r.link.delay_ms, dense=in_warmup(r, p))

    return [(r, predict(r, p), predict(r, fastest[(r.method, r.seed)][1])) for r, p in rows]


# -- writing ---------------------------------------------------------------------------------------


def _header(race: Race) -> tuple[str, ...]:
    u = race.units[:-1]  # token, sample
    return ("method", "link (Mbit/s[:one-way ms])", "time to target (s)", "wall-clock to target (s)",
            f"{race.units} to target", f"{race.units}/s", "x baseline", "step ms (q1-q3)",
            "step ms predicted", "utilization", f"bytes per {u}", "peak kB/step", "exposed comm ms/exchange",
            "of it waiting for the last rank", "wire ms/exchange", "loaded runs")


Checks = Callable[[Table], list[tuple[str, bool | None, str]]]
Predicted = dict[tuple[str, Link, int], tuple[float, float]]  # (method, link, seed) -> (own, cross) ms


def write(out: Path, race: Race, runs: list[Run], quick: bool, checks: Checks | None,
          whatif: WhatIf | None = None) -> str:
    """race.md, race.csv, race_curves.csv and plots/ into `out`; race.md's text. `whatif`: the
    configuration the model's what-if predicts (default: WhatIf's, 8 workers)."""
    whatif = whatif or WhatIf()
    table = cells(runs, race)
    methods = list(dict.fromkeys(r.method for r in runs))
    links = sorted({r.link for r in runs})
    model = fitted(runs)
    predicted: Predicted = {}
    if model is not None:
        predicted = {(r.method, r.link, r.seed): (own, cross) for r, own, cross in predictions(*model)}
    rows = [_row(race, table, c, method, link, predicted) for method in methods for link in links
            if (c := table.get((method, link))) is not None]
    config: dict = next(((r.results or {})["config"] for r in runs if r.ok), {})
    budget = config.get("max_train_s")
    target = f"{race.metric} {'>=' if race.higher_is_better else '<='} {race_target_value(race, runs):g}"
    lines = [f"# Race: {race.name}{' (quick: not evidence)' if quick else ''}", "",
             f"Target {target}, budget {budget} s of training per run, links "
             f"{'; '.join(x.label for x in links)} (rate each way, one-way delay), units: {race.units}. "
             "Time to target: the "
             f"{race.units} each run took to reach it (interpolated between its evaluations) times its "
             "median step on the link (a run on a loaded machine: its estimate of that step on an unloaded "
             "one, from its CPU time), mean +- half the range over the seeds that reached it; beside it "
             "the raw wall-clock training seconds (evaluations and start-up left out), which a loaded "
             "machine changes.", ""]
    if not any(c.decomposed for c in table.values()):
        lines += [f"**No verdict: no method reached the target within the budget ({budget} s of "
                  "training); the budget is too small for this target: raise max_train_s or take a nearer "
                  "target.**", ""]
    loaded = sum(c.loaded for c in table.values())
    if loaded:
        lines += [f"**{loaded} of {sum(len(c.done) for c in table.values())} runs ran on a loaded machine** "
                  "(the load at their end, less their own threads, above the cores those leave free by half "
                  f"a core: the `loaded runs` column). Their workers ran at {_niceness(table)} and "
                  "their budget counted the unloaded clock (budget_clock=unloaded), but their wall-clock "
                  "figures are the machine's as much as the method's, so their step times, rates and times "
                  "to target are the estimates of an unloaded step (communication's wall time plus the "
                  "rest's CPU time over the compute threads; race.csv: `step ms measured` beside `step ms "
                  "unloaded estimate`).", ""]
    lines += [tabulate(rows, headers=_header(race), tablefmt="github", disable_numparse=True), ""]
    lines += _model_lines(race, table, methods, links, model, predicted, whatif)
    if checks is not None:
        lines += ["## Targets", "",
                  tabulate([(text, "no verdict" if met is None else "yes" if met else "NO", figures)
                            for text, met, figures in checks(table)],
                           headers=("target", "met?", "figures"), tablefmt="github", disable_numparse=True),
                  ""]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "race.md").write_text(text + "\n")
    _write_csv(out / "race.csv", *_run_table(race, runs, predicted))
    _write_csv(out / "race_curves.csv", *_curve_table(race, runs))
    _plots(out / "plots", race, runs, table, methods, links, model, quick)
    return text


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A tidy CSV: numbers as numbers (a missing one empty), so that a spreadsheet or
    pandas.read_csv reads numeric columns."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
                           for v in row] for row in rows])


def _run_table(race: Race, runs: list[Run], predicted: Predicted
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
              "load before", "load after", "commit"]
    rows = []
    for r in runs:
        if not r.ok:
            rows.append([r.method, r.mbps, r.link.delay_ms, r.seed, False, *[None] * (len(header) - 5)])
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
                     _round(one.skew_per_exchange_ms()), _round(one.wire_per_exchange_ms(r.mbps)),
                     r.summary.get("steps"),
                     r.loaded, env.get("load_before"), env.get("load_after"),
                     env.get("commit")])
    return header, rows


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


def _row(race: Race, table: Table, c: Cell, method: str, link: Link, predicted: Predicted) -> tuple[str, ...]:
    base = table.get((race.baseline, link))
    rate, base_rate = c.mean(_rate_key(race)), base.mean(_rate_key(race)) if base else None
    preds = [predicted[(method, link, r.seed)][1] for r in c.done if (method, link, r.seed) in predicted]
    units = [t.units for t in c.decomposed]
    q1, q3 = c.mean("step_ms_q1"), c.mean("step_ms_q3")
    spread = f" ({q1:.1f}-{q3:.1f})" if q1 is not None and q3 is not None else ""
    return (method, str(link), c.time_to_target(),
            _fmt(statistics.fmean(c.reached) if c.reached else None, ".1f"),
            _fmt(statistics.fmean(units) if units else None, ",.0f"), _fmt(rate, ",.0f"),
            _fmt(rate / base_rate if rate and base_rate else None, ".2f"),
            _fmt(c.mean("step_ms"), ".1f") + spread,
            _fmt(statistics.fmean(preds) if preds else None, ".1f"), _fmt(c.mean("utilization"), ".2f"),
            _fmt(c.per_unit_bytes(), ".3g"), _fmt((c.mean("peak_bytes_per_step") or 0) / 1e3, ".1f"),
            _fmt(c.exposed_per_exchange_ms(), ".1f"), _fmt(c.skew_per_exchange_ms(), ".1f"),
            _fmt(c.wire_per_exchange_ms(link.mbps), ".1f"),
            f"{c.loaded}/{len(c.done)}")


RTT_RATE_MBPS = 200.0  # the rate of the round-trip crossover where the race has no link with delay


def _model_lines(race: Race, table: Table, methods: list[str], links: list[Link],
                 model: tuple[Fit, list[tuple[Run, Profile]]] | None, predicted: Predicted,
                 whatif: WhatIf) -> list[str]:
    if model is None:
        return ["The model needs at least 5 finished runs.", ""]
    fit, rows = model
    measured = {(r.method, r.link, r.seed): float(r.summary["step_ms"]) for r, _ in rows}
    errors = [abs(cross / measured[k] - 1) for k, (_, cross) in predicted.items()]
    delayed = [abs(cross / measured[k] - 1) for k, (_, cross) in predicted.items() if k[1].delay_ms]
    within = sum(e <= 0.15 for e in errors)
    delays = sorted({r.link.delay_ms for r, _ in rows})
    latency = (f"{fit.latency_factor:.2f} ms per ms of one-way delay per round (fitted on runs at "
               f"{', '.join(f'{d:g}' for d in delays)} ms)" if len(delays) >= 2 else
               "1 ms per ms of one-way delay per round (not fitted: the runs had one delay)")
    lines = ["## The model", "",
             f"Fitted on these runs (compbench.race.model): {fit.ms_per_queued:.3f} ms per queued and "
             f"{fit.ms_per_waited:.3f} ms per waited collective, {fit.ms_per_round:.3f} ms per message "
             f"round, link factor {fit.link_factor:.2f}, {latency}. Each run's step time predicted from its "
             f"method's run on the fastest link without delay: {within} of {len(errors)} within 15% of the "
             "measured one (target: 80%)"
             + (f"; of the runs with delay, {sum(e <= 0.15 for e in delayed)} of {len(delayed)}" if delayed
                else "") + ".", ""]
    profiles = {(r.method, r.link): p for r, p in rows}
    # each method's profile: its run on the fastest link, the one without delay where there is one
    fastest = {m: max((x for x in links if (m, x) in profiles), key=lambda x: (x.mbps, -x.delay_ms),
                      default=None) for m in methods}
    base_link = fastest.get(race.baseline)
    base_steps = table[(race.baseline, base_link)].steps_to_target if base_link is not None else None
    rtt_rates = sorted({x.mbps for x in links if x.delay_ms}) or [RTT_RATE_MBPS]
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
        p, base = profiles[(m, link)], profiles[(race.baseline, base_link)]
        gbps, where = crossover_gbps(p, steps, base, base_steps, fit)
        verdict = {"everywhere": "at every bandwidth from 0.1 Mbit/s to 100 Gbit/s",
                   "nowhere": "at no bandwidth from 0.1 Mbit/s to 100 Gbit/s",
                   "below": f"below {gbps * 1e3:.3g} Mbit/s" if gbps else "",
                   "mixed": f"up to {gbps * 1e3:.3g} Mbit/s, not everywhere below" if gbps else ""}[where]
        rtts = []
        for mbps in rtt_rates:
            rtt, at = crossover_rtt_ms(p, steps, base, base_steps, fit, mbps / 1e3)
            rtts.append({"everywhere": "at every round trip", "nowhere": "at no round trip up to 2 s",
                         "above": f"above {rtt:.3g} ms" if rtt else "",
                         "mixed": f"from {rtt:.3g} ms, not everywhere above" if rtt else ""}[at])
        verdicts.append((m, verdict, *rtts, whatif_time, memory))
    where = _whatif_place(whatif)
    header = ("method", "reaches the target before the baseline (no delay)",
              *(f"... at {x:g} Mbit/s, round trips" for x in rtt_rates),
              f"time to target at 10 / 100 / 1000 Mbit/s, {where} (model)",
              f"memory per worker, {whatif.workers} workers (model): fits {whatif.memory_gb:g} GB?")
    lines = [*lines, tabulate(verdicts, headers=header, tablefmt="github", disable_numparse=True), ""]
    sized = []
    for m in methods:
        link = fastest.get(m)
        own = profiles[(m, link)] if link is not None else None
        if own is None or own.memory is None:
            continue
        for numel in (float(own.memory.numel), *whatif.params):
            q = own.scaled(numel)
            label = f"{numel:.3g}" + (" (its run)" if numel == own.memory.numel else "")
            sized.append((m, label, _whatif_times(q, None, fit, whatif),
                          whatif.fits(_memory(q, whatif))))
    if sized:
        lines += [f"What-if by model size, {where}: a step's time and a worker's memory (parameters, "
                  "gradients and optimizer state over its shard group, the activations its run measured and "
                  "the weights a sharded worker holds gathered; compbench.race.model), the model grown in "
                  "depth and width together from its run's; the tokens a step as in the race.", "",
                  tabulate(sized, headers=("method", "parameters",
                                           "step ms at 10 / 100 / 1000 Mbit/s (model)",
                                           f"memory per worker (model): fits {whatif.memory_gb:g} GB?"),
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


def _plots(folder: Path, race: Race, runs: list[Run], table: Table,
           methods: list[str], links: list[Link],
           model: tuple[Fit, list[tuple[Run, Profile]]] | None, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    unit = "nats/token" if race.metric == "eval/loss" else "%"
    note = " (quick: not evidence)" if quick else ""
    target = float(race_target_value(race, runs))
    for link in links:  # the metric against training seconds: every evaluation a marker, every seed a line
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for r in runs:
            if r.link == link and r.ok:
                curve = [(p["train_s"], p[race.metric]) for p in (r.results or {}).get("curve", [])
                         if p.get(race.metric) is not None]
                if curve:
                    first = r.seed == min(x.seed for x in runs if x.method == r.method)
                    ax.plot(*zip(*curve, strict=True), "o-", ms=3, color=colors[r.method], lw=1,
                            label=r.method if first else None)
        ax.axhline(target, ls="--", color="gray", lw=1, label=f"target {target:g}")
        ax.set_xlim(left=0)
        ax.set_xlabel("training seconds")
        ax.set_ylabel(f"{race.metric} ({unit})")
        ax.set_title(f"{race.name} race, {link.label}{note}", fontsize=10)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"curves_{link.folder}.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4))  # utilization against bandwidth
    for m in methods:
        for delayed in (False, True):  # a link with delay: a hollow marker
            xs = [(r.mbps, r.summary["utilization"]) for r in runs if r.method == m and r.ok
                  and r.summary.get("utilization") and bool(r.link.delay_ms) == delayed]
            if xs:
                ax.plot(*zip(*xs, strict=True), "o", color=colors[m], label=None if delayed else m,
                        mfc="none" if delayed else colors[m])
        if model is not None:
            fit, rows = model
            prof = next((p for r, p in sorted(rows, key=lambda rp: (-rp[0].mbps, rp[0].link.delay_ms))
                         if r.method == m), None)
            if prof is not None:
                grid = [10 ** (k / 10) for k in range(0, 41)]
                ax.plot(grid, [prof.utilization(fit, g / 1e3) for g in grid], "-", color=colors[m], lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("link (Mbit/s)")
    ax.set_ylabel("compute utilization (compute / step)")
    ax.set_ylim(0, 1.05)
    hollow = " (hollow: with delay)" if any(x.delay_ms for x in links) else ""
    ax.set_title(f"{race.name} race: points measured{hollow}, lines modelled without delay{note}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "utilization.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(0.6 * len(methods) * len(links) + 3, 4))  # time to target
    for i, link in enumerate(links):
        for j, m in enumerate(methods):
            c = table.get((m, link))
            x = i * (len(methods) + 1) + j
            if c is None or not c.done:
                continue
            reached = [t.seconds() for t in c.decomposed]
            if len(reached) < len(c.done):  # a partial mean must not pass for everyone's
                ax.annotate(f"{len(reached)}/{len(c.done)}", (x, max(reached, default=0.0)),
                            textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7,
                            color=colors[m])
            if not reached:
                continue
            ax.plot([x] * len(reached), reached, ".", color=colors[m], ms=8)
            ax.bar(x, statistics.fmean(reached), fill=False, edgecolor=colors[m],
                   linestyle="-" if len(reached) == len(c.done) else "--")
    if not any(c.decomposed for c in table.values()):
        ax.text(0.5, 0.5, "no method reached the target within the budget", transform=ax.transAxes,
                ha="center", va="center")
    ax.set_xticks([i * (len(methods) + 1) + (len(methods) - 1) / 2 for i in range(len(links))],
                  [x.label for x in links])
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"seconds to the target ({race.units} x step time)")
    ax.set_title(f"each seed a point, the mean a bar (dashed, k/n: k of n seeds reached it){note}",
                 fontsize=8)
    ax.legend([plt.Line2D([], [], color=colors[m], marker=".", ls="") for m in methods], methods, fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "time_to_target.png", dpi=100)
    plt.close(fig)


def race_target_value(race: Race, runs: list[Run]) -> Any:
    """The target value the runs were made with (their summaries record it)."""
    for r in runs:
        target = r.summary.get("target")
        if target:
            return target["value"]
    return float("nan")
