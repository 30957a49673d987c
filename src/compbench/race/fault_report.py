"""race.md's section on fault scenarios (`compbench race --faults`, compbench.race.scenarios) and
goodput, and plots/goodput.png (compbench.race.goodput_plot).

Goodput (results.json summary.goodput, compbench.records.goodput): the share of the workers' time
that ended up in the model, Σ (compute + optimizer) less the work discarded, over the workers x the
training loop's wall time; beside it the share discarded (outer gradients a quorum mode dropped as
too stale) and the rest, idle (waiting, communication, evaluations). The section ranks the methods
per link and scenario by time to target (the report's decomposed time on the step clock, among the
methods that reached the target in every seed; its verdict's load rules apply), each with its mean
goodput beside; then the methods that did not reach it in every seed, and those not run under the
scenario with why. Under a straggler it sets each method's measured step and goodput beside the
what-if's (compbench.race.under_fault), predicted from the method's run without a fault on the same
link (else its fastest one's, at this link's rate); the prediction's goodput is over the steps' time,
so it is set beside the run's `step_goodput` (evaluations left out).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from compbench.comm.cost_model import Fit
from compbench.race.model import Profile
from compbench.race.scenarios import SCENARIOS
from compbench.race.suites import Link, Race
from compbench.race.under_fault import under_straggler

# compbench.race.report's Run and Cell: report imports this module, so they are not imported here
Run = Any
Cell = Any

GOODPUT_KEYS = ("goodput", "idle_share", "discarded_share", "step_goodput")


def goodput_of(run: Run, key: str = "goodput") -> float | None:
    """A finished run's summary.goodput figure (`key`: one of GOODPUT_KEYS); None where not recorded."""
    value = (run.measured.get("goodput") or {}).get(key)
    return None if value is None else float(value)


def mean_goodput(cell: Cell, key: str = "goodput") -> float | None:
    values = [g for r in cell.done if (g := goodput_of(r, key)) is not None]
    return statistics.fmean(values) if values else None


def goodput_text(cell: Cell) -> str:
    """`0.62 (idle 0.38, discarded 0)`: the seeds' means; `-` where no run recorded goodput."""
    good = mean_goodput(cell)
    if good is None:
        return "-"
    idle, lost = mean_goodput(cell, "idle_share"), mean_goodput(cell, "discarded_share")
    return f"{good:.2f} (idle {_f(idle)}, discarded {_f(lost)})"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2g}"


def fault_lines(folder: Path, race: Race, runs: Sequence[Run], table: Mapping[tuple[str, Link], Cell],
                methods: Sequence[str], links: Sequence[Link], verdicts: Mapping[Link, str],
                not_run: Mapping[str, Mapping[str, str]], fit: Fit, footnote: str) -> list[str]:
    """The section (see the module) and plots/goodput.png; nothing where every link ran without a
    fault and no method was left out."""
    if not any(x.scenario for x in links) and not not_run:
        return []
    scenarios = list(dict.fromkeys(x.fault for x in links))
    lines = ["## Under faults: time to target and goodput", "",
             "Fault scenarios (`--faults`, compbench.race.scenarios): "
             + "; ".join(f"**{s}**: {SCENARIOS[s].text} (`{' '.join(SCENARIOS[s].overrides) or '-'}`)"
                         for s in scenarios) + ". Goodput (summary.goodput): the share of the workers' time "
             "that ended up in the model, their forward, backward and optimizer seconds less the work "
             "discarded, over the workers x the training loop's wall time; the share discarded (outer "
             "gradients too stale to merge) and the rest, idle (waiting for others, communication, "
             "evaluations), beside it. Each link and scenario ranks the methods that reached the target in "
             "every seed by their time to target (step clock, mean over the seeds), goodput beside; the "
             "verdict is the report's (no verdict where loaded runs' estimates are not validated). Figure: "
             "plots/goodput.png.", ""]
    rows = []
    for link in links:
        here = [(m, c) for m in methods if (c := table.get((m, link))) is not None and c.done]
        ranked = sorted(((statistics.fmean(c.seconds()), m, c) for m, c in here
                         if c.decomposed and len(c.decomposed) == len(c.done)), key=lambda x: x[0])
        order = " < ".join(f"{m} {t:.1f} s (goodput {_f(mean_goodput(c))})" for t, m, c in ranked) or "-"
        missed = ", ".join(f"{m} ({len(c.decomposed)}/{len(c.done)}; goodput {_f(mean_goodput(c))})"
                           for m, c in here if not (c.decomposed and len(c.decomposed) == len(c.done)))
        left_out = ", ".join(not_run.get(link.fault, {})) or "-"
        rows.append((str(link), link.fault, order, missed or "-", left_out, verdicts.get(link, "-")))
    lines += [tabulate(rows, headers=("link", "fault scenario", "order by time to target, goodput beside",
                                      "not reached in every seed", "not run under it", "verdict"),
                       tablefmt="github", disable_numparse=True), ""]
    for scenario, skipped in not_run.items():
        if skipped:
            lines += [f"Not run under {scenario}: " + "; ".join(f"{m}: {why}" for m, why in skipped.items())
                      + ".", ""]
    lines += _prediction_lines(race, runs, table, methods, links, fit)
    _plot(folder, race, table, methods, links, footnote)
    return lines


def _profile(runs: Sequence[Run], method: str, link: Link) -> tuple[Profile, Link] | None:
    """The profile of the method's run without a fault on `link`'s shaped link, else on its fastest
    shaped link without a fault (and that link)."""
    plain = [r for r in runs if r.method == method and r.ok and not r.link.scenario and not r.link.trace
             and r.summary.get("step_ms")]
    same = [r for r in plain if r.link == link.shaped]
    pick = same or sorted(plain, key=lambda r: (r.mbps, -r.link.delay_ms))[-1:]
    return (Profile.of(pick[0].view), pick[0].link) if pick else None


def _prediction_lines(race: Race, runs: Sequence[Run], table: Mapping[tuple[str, Link], Cell],
                      methods: Sequence[str], links: Sequence[Link], fit: Fit) -> list[str]:
    rows = []
    for link in links:
        slow = SCENARIOS[link.fault].slow_factor
        if slow == 1 or link.trace:
            continue
        for m in methods:
            c = table.get((m, link))
            source = _profile(runs, m, link)
            if c is None or not c.done or source is None:
                continue
            p, from_link = source
            pred = under_straggler(p, fit, link.mbps / 1e3, slow, latency_ms=link.delay_ms)
            step = c.mean("step_ms")
            rows.append((m, str(link), link.fault, "-" if step is None else f"{step:.1f}",
                         f"{pred.step_ms:.1f}",
                         _f(mean_goodput(c, "step_goodput")), f"{pred.goodput:.2f}",
                         _f(mean_goodput(c, "discarded_share")), f"{pred.discarded_share:.2g}",
                         "yes" if pred.lock_step else "no", from_link.label))
    if not rows:
        return []
    return ["Under a straggler, measured and predicted (compbench.race.under_fault): rank 0's step (step "
            "clock) and the steps' goodput (step_goodput: evaluations left out, as the prediction leaves "
            "them); a lock-step round waits for the straggler; a quorum's, a round whose straggler trains "
            "fewer steps (inner_steps_per_worker) and HALoS's workers need not.", "",
            tabulate(rows, headers=("method", "link", "fault scenario", "step ms", "step ms predicted",
                                    "step goodput", "goodput predicted", "discarded", "discarded predicted",
                                    "waits for the straggler (predicted)", "predicted from its run on"),
                     tablefmt="github", disable_numparse=True), ""]


def _plot(folder: Path, race: Race, table: Mapping[tuple[str, Link], Cell], methods: Sequence[str],
          links: Sequence[Link], footnote: str) -> None:
    from compbench.race.goodput_plot import draw_goodput

    labels = {x: f"{x}, {x.fault}" for x in links}
    bars = {(m, labels[x]): [(g, goodput_of(r, "discarded_share") or 0.0) for r in c.done
                             if (g := goodput_of(r)) is not None]
            for m in methods for x in links if (c := table.get((m, x))) is not None and c.done}
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}
    draw_goodput(folder / "goodput.png", bars, methods, [labels[x] for x in links], colors,
                 f"{race.name} race: goodput per method, link and fault scenario (the seeds' mean, "
                 "written above each bar;\nhatched: discarded; the rest of the way to 1: idle)", footnote)

