"""The race's report: race.md and race.csv, plots/ and the what-if model's predictions beside the
measurements (compbench.race.model).

Per link: each method's time to target (training seconds, mean +- half the range over seeds, and
how many seeds reached it), its tokens or samples per second against the baseline's, its compute
utilization, bytes per token (or sample), the most bytes it sent in one step (a round's exchange)
and the communication its step waited for per exchange against the wire time of that exchange.
Then the model: its fitted coefficients, its step times beside the measured ones, the bandwidth
below which each method reaches the target before the baseline, and a what-if table. Plots: the
metric against training seconds per link (every seed its own line), utilization against bandwidth
(each seed a point, the model's line), time to target per link (each seed a point, the mean a bar
outline: seeds are never stacked).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compbench.comm.cost_model import Fit
from compbench.race.model import Profile, crossover_gbps, fit_model
from compbench.race.suites import Race


@dataclass
class Run:
    method: str
    mbps: float
    seed: int
    results: dict | None

    @property
    def summary(self) -> dict:
        return (self.results or {}).get("summary") or {}

    @property
    def ok(self) -> bool:
        return self.summary.get("status") == "completed"


def load(entries: Sequence[tuple[str, float, int, Path]]) -> list[Run]:
    runs = []
    for method, mbps, seed, run_dir in entries:
        try:
            results = json.loads((run_dir / "results.json").read_text())
        except (OSError, ValueError):
            results = None
        runs.append(Run(method, mbps, seed, results))
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
        """The training seconds to the target of the seeds that reached it."""
        return self._at_target("train_s")

    @property
    def steps_to_target(self) -> float | None:
        steps = self._at_target("step")
        return statistics.fmean(steps) if steps else None

    def time_to_target(self) -> str:
        if not self.done:
            return "no data"
        t, n = self.reached, len(self.done)
        if len(t) < n:  # the best of the seeds that missed it, and what those that reached it took
            missed = [r for r in self.done if not (r.summary.get("target") or {}).get("reached")]
            best = [b for r in missed if (b := _best(r, self.race)) is not None]
            top = (max(best) if self.race.higher_is_better else min(best)) if best else None
            best_text = f"{statistics.fmean(t):.1f} s by {len(t)}, the others' best" if t else "best"
            return f"not reached ({len(t)}/{n}; {best_text} {_fmt(top, '.3f')})"
        spread = (max(t) - min(t)) / 2
        return f"{statistics.fmean(t):.1f} +- {spread:.1f} s ({n}/{n})"

    @property
    def every(self) -> int:
        return int(((self.done[0].results or {}).get("exchange") or {}).get("every", 1)) if self.done else 1

    def exposed_per_exchange_ms(self) -> float | None:
        """The communication the step waited for per exchange (decoding left out)."""
        exposed, decode = self.mean("comm_exposed_ms"), self.mean("decompress_ms") or 0.0
        return None if exposed is None else max(0.0, exposed - decode) * self.every

    def wire_per_exchange_ms(self, mbps: float) -> float | None:
        """One worker's bytes of an exchange at the link's rate (each way)."""
        sent = self.mean("bytes_sent_per_step")
        return None if sent is None else sent * self.every * 8 / (mbps * 1e6) * 1e3

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


def cells(runs: list[Run], race: Race) -> dict[tuple[str, float], Cell]:
    out: dict[tuple[str, float], Cell] = {}
    for r in runs:
        out.setdefault((r.method, r.mbps), Cell([], race)).runs.append(r)
    return out


# -- the model -------------------------------------------------------------------------------------

def fitted(runs: list[Run]) -> tuple[Fit, list[tuple[Run, Profile]]] | None:
    rows = [(r, Profile.of(r.results or {})) for r in runs if r.ok and r.summary.get("step_ms")]
    if len(rows) < 5:
        return None
    return fit_model([(p, r.mbps / 1e3, float(r.summary["step_ms"]), in_warmup(r, p)) for r, p in rows]), rows


def in_warmup(run: Run, profile: Profile) -> bool:
    """Whether the run's median step is a warm-up's (dense) one: the warm-up took most of its steps."""
    return int(run.summary.get("steps", 0)) < 2 * profile.warmup_steps


def predictions(fit: Fit, rows: list[tuple[Run, Profile]]) -> list[tuple[Run, float, float]]:
    """(run, step ms predicted from its own profile, from its method's fastest link's run)."""
    fastest: dict[tuple[str, int], tuple[float, Profile]] = {}
    for r, p in rows:
        if r.mbps > fastest.get((r.method, r.seed), (-1.0, p))[0]:
            fastest[(r.method, r.seed)] = (r.mbps, p)
    def predict(r: Run, p: Profile) -> float:
        return p.step_ms(fit, r.mbps / 1e3, dense=in_warmup(r, p))

    return [(r, predict(r, p), predict(r, fastest[(r.method, r.seed)][1])) for r, p in rows]


# -- writing ---------------------------------------------------------------------------------------

HEADER = ("method", "link (Mbit/s)", "time to target", "units/s", "x baseline", "step ms measured",
          "step ms predicted", "utilization", "bytes per unit", "peak kB/step", "exposed comm ms/exchange",
          "wire ms/exchange")


Checks = Callable[[dict[tuple[str, float], Cell]], list[tuple[str, bool | None, str]]]


def write(out: Path, race: Race, runs: list[Run], quick: bool, checks: Checks | None) -> str:
    table = cells(runs, race)
    methods = list(dict.fromkeys(r.method for r in runs))
    links = sorted({r.mbps for r in runs})
    model = fitted(runs)
    predicted = {}
    if model is not None:
        predicted = {(r.method, r.mbps, r.seed): (own, cross) for r, own, cross in predictions(*model)}
    rows = [_row(race, table, c, method, mbps, predicted) for method in methods for mbps in links
            if (c := table.get((method, mbps))) is not None]
    config: dict = next(((r.results or {})["config"] for r in runs if r.ok), {})
    target = f"{race.metric} {'>=' if race.higher_is_better else '<='} {race_target_value(race, runs):g}"
    lines = [f"# Race: {race.name}{' (quick: not evidence)' if quick else ''}", "",
             f"Target {target}, budget {config.get('max_train_s')} s of training per run, links "
             f"{', '.join(f'{x:g}' for x in links)} Mbit/s, units: {race.units}. Time to target in training "
             "seconds (evaluations and start-up left out), mean +- half the range over seeds.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER),
             *("| " + " | ".join(row) + " |" for row in rows), ""]
    lines += _model_lines(race, table, methods, links, model, predicted)
    if checks is not None:
        lines += ["## Targets", "", "| target | met? | figures |", "|---|---|---|"]
        for text, met, figures in checks(table):
            lines.append(f"| {text} | {'no run' if met is None else 'yes' if met else 'NO'} | {figures} |")
        lines.append("")
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "race.md").write_text(text + "\n")
    with open(out / "race.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)
    _plots(out / "plots", race, runs, table, methods, links, model)
    return text


def _row(race: Race, table: dict[tuple[str, float], Cell], c: Cell, method: str, mbps: float,
         predicted: dict[tuple[str, float, int], tuple[float, float]]) -> tuple[str, ...]:
    base = table.get((race.baseline, mbps))
    rate, base_rate = c.mean(_rate_key(race)), base.mean(_rate_key(race)) if base else None
    preds = [predicted[(method, mbps, r.seed)][1] for r in c.done if (method, mbps, r.seed) in predicted]
    return (method, f"{mbps:g}", c.time_to_target(), _fmt(rate, ",.0f"),
            _fmt(rate / base_rate if rate and base_rate else None, ".2f"), _fmt(c.mean("step_ms"), ".1f"),
            _fmt(statistics.fmean(preds) if preds else None, ".1f"), _fmt(c.mean("utilization"), ".2f"),
            _fmt(c.per_unit_bytes(), ".3g"), _fmt((c.mean("peak_bytes_per_step") or 0) / 1e3, ".1f"),
            _fmt(c.exposed_per_exchange_ms(), ".1f"), _fmt(c.wire_per_exchange_ms(mbps), ".1f"))


def _model_lines(race: Race, table: dict[tuple[str, float], Cell], methods: list[str], links: list[float],
                 model: tuple[Fit, list[tuple[Run, Profile]]] | None,
                 predicted: dict[tuple[str, float, int], tuple[float, float]]) -> list[str]:
    if model is None:
        return ["The model needs at least 5 finished runs.", ""]
    fit, rows = model
    measured = {(r.method, r.mbps, r.seed): float(r.summary["step_ms"]) for r, _ in rows}
    errors = [abs(cross / measured[k] - 1) for k, (_, cross) in predicted.items()]
    within = sum(e <= 0.15 for e in errors)
    lines = ["## The model", "",
             f"Fitted on these runs (compbench.race.model): {fit.ms_per_queued:.3f} ms per queued and "
             f"{fit.ms_per_waited:.3f} ms per waited collective, {fit.ms_per_round:.3f} ms per message "
             "round, "
             f"link factor {fit.link_factor:.2f}. Each run's step time predicted from its method's run on "
             f"the fastest link: {within} of {len(errors)} within 15% of the measured one "
             f"(target: 80%).", ""]
    profiles = {(r.method, r.mbps): p for r, p in rows}
    fastest = {m: max((x for x in links if (m, x) in profiles), default=None) for m in methods}
    base_link = fastest.get(race.baseline)
    base_steps = table[(race.baseline, base_link)].steps_to_target if base_link is not None else None
    lines += ["| method | reaches the target before the baseline | time to target at 10 / 100 / 1000 "
              "Mbit/s, 8 workers, 10 ms per message round (model) |", "|---|---|---|"]
    for m in methods:
        link = fastest.get(m)
        steps = _steps(table, m, links)
        if m == race.baseline:
            lines.append(f"| {m} | - (the baseline) | - |")
            continue
        if link is None or steps is None or base_steps is None or base_link is None:
            lines.append(f"| {m} | - (the target was not reached) | - |")
            continue
        p, base = profiles[(m, link)], profiles[(race.baseline, base_link)]
        gbps, where = crossover_gbps(p, steps, base, base_steps, fit)
        verdict = {"everywhere": "at every bandwidth from 0.1 Mbit/s to 100 Gbit/s",
                   "nowhere": "at no bandwidth from 0.1 Mbit/s to 100 Gbit/s",
                   "below": f"below {gbps * 1e3:.3g} Mbit/s" if gbps else "",
                   "mixed": f"up to {gbps * 1e3:.3g} Mbit/s, not everywhere below" if gbps else ""}[where]
        whatif = " / ".join(f"{p.time_ms(steps, fit, g / 1e3, 8, 10.0) / 1e3:.0f} s" for g in (10, 100, 1000))
        lines.append(f"| {m} | {verdict} | {whatif} |")
    return [*lines, ""]


def _steps(table: dict[tuple[str, float], Cell], method: str, links: list[float]) -> float | None:
    """Steps to the target, over the links where the method reached it (the steps do not depend on
    the link; the time does)."""
    steps = [s for x in links if (c := table.get((method, x))) is not None and (s := c.steps_to_target)]
    return statistics.fmean(steps) if steps else None


def _plots(folder: Path, race: Race, runs: list[Run], table: dict[tuple[str, float], Cell],
           methods: list[str], links: list[float],
           model: tuple[Fit, list[tuple[Run, Profile]]] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    colors = {m: f"C{i}" for i, m in enumerate(methods)}
    for mbps in links:  # the metric against training seconds, every seed its own line
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for r in runs:
            if r.mbps == mbps and r.ok:
                curve = [(p["train_s"], p[race.metric]) for p in (r.results or {}).get("curve", [])]
                if curve:
                    ax.plot(*zip(*curve, strict=True), color=colors[r.method], lw=1,
                            label=r.method if r.seed == 0 else None)
        target = float(race_target_value(race, runs))
        ax.axhline(target, ls="--", color="gray", lw=1)
        ax.set_xlabel("training seconds")
        ax.set_ylabel(race.metric)
        ax.set_title(f"{race.name}: {mbps:g} Mbit/s")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"curves_{mbps:g}mbps.png", dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4))  # utilization against bandwidth
    for m in methods:
        xs = [(r.mbps, r.summary["utilization"]) for r in runs
              if r.method == m and r.ok and r.summary.get("utilization")]
        if xs:
            ax.plot(*zip(*xs, strict=True), "o", color=colors[m], label=m)
        if model is not None:
            fit, rows = model
            prof = next((p for r, p in sorted(rows, key=lambda rp: -rp[0].mbps) if r.method == m), None)
            if prof is not None:
                grid = [10 ** (k / 10) for k in range(0, 41)]
                ax.plot(grid, [prof.utilization(fit, g / 1e3) for g in grid], "-", color=colors[m], lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("link (Mbit/s)")
    ax.set_ylabel("compute utilization")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "utilization.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(0.6 * len(methods) * len(links) + 3, 4))  # time to target
    for i, mbps in enumerate(links):
        for j, m in enumerate(methods):
            c = table.get((m, mbps))
            x = i * (len(methods) + 1) + j
            if c is None or not c.done:
                continue
            if len(c.reached) < len(c.done):  # a partial mean must not pass for everyone's
                top = max(c.reached, default=0.0)
                ax.annotate(f"{len(c.reached)}/{len(c.done)}", (x, top), textcoords="offset points",
                            xytext=(0, 4), ha="center", fontsize=7, color=colors[m])
            if not c.reached:
                continue
            ax.plot([x] * len(c.reached), c.reached, ".", color=colors[m], ms=8)
            ax.bar(x, statistics.fmean(c.reached), fill=False, edgecolor=colors[m],
                   linestyle="-" if len(c.reached) == len(c.done) else "--")
    ax.set_xticks([i * (len(methods) + 1) + (len(methods) - 1) / 2 for i in range(len(links))],
                  [f"{x:g} Mbit/s" for x in links])
    ax.set_ylabel("training seconds to the target")
    ax.set_title("each seed a point, the mean a bar (dashed, k/n: only k of n seeds reached it)", fontsize=8)
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
