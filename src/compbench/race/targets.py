"""The text race's throughput targets, checked on its runs (each line: what, met or not, figures):
1-bit Adam and DeMo at >= 1.0x DDP-AdamW's tokens/s at 1 Gbit/s and >= 1.4x at 100 Mbit/s; the
communication a step waits for per exchange, less its wait for the last rank to get there (the ranks'
different speeds: compbench.train.skew), at most its wire time + 2 ms, for every method on every link
without delay (a delay adds its round trips, which the model's fit accounts for);
DiLoCo with the eager update at 10 Mbit/s computing >= 95% of its step; Streaming DiLoCo (eager,
4-bit outer gradients) at 1 Mbit/s >= 90% (a 1 Mbit/s link is not in the default race: `--links
1,10,100,1000`).

A check the race has no data for is no verdict, never a pass: a throughput ratio without a run of
both methods on the link, or from too few steps, or from loaded runs whose unloaded estimate is not
validated at their load (compbench.race.to_target.VALIDATED); the exposed-communication check in a
race without a link without delay, or without a figure on one."""

from __future__ import annotations

from compbench.race.report import Table
from compbench.race.suites import Link
from compbench.race.to_target import MIN_MEASURED_STEPS

Check = tuple[str, bool | None, str]


def text_targets(table: Table) -> list[Check]:
    """The checks of the methods that ran (a method the race did not run has no line); a throughput
    figure from runs of fewer than MIN_MEASURED_STEPS steps after their warm-up is no verdict (a
    handful of steps measures their start, not their speed)."""
    out: list[Check] = []
    ran = {method for method, _ in table}
    for method in ("onebit-adam", "demo"):
        if method not in ran:
            continue
        for mbps, bound in ((1000.0, 1.0), (100.0, 1.4)):
            c, base = table.get((method, Link(mbps))), table.get(("ddp-adamw", Link(mbps)))
            what = f"{method} tokens/s >= {bound:g}x ddp-adamw's at {mbps:g} Mbit/s"
            if c is None or base is None:
                out.append((what, None, "no run on that link"))
                continue
            if c.too_short or base.too_short:
                steps = min(r.measured_steps for r in [*c.done, *base.done]) if c.done and base.done else 0
                out.append((what, None, f"budget too small: {steps} steps after the warm-up "
                                        f"(< {MIN_MEASURED_STEPS})"))
                continue
            unvalidated = sorted({*c.load_reasons(), *base.load_reasons()})
            if unvalidated:
                out.append((what, None, "no verdict at this load: " + "; ".join(unvalidated)))
                continue
            rate, base_rate = c.mean("tokens_per_s"), base.mean("tokens_per_s")
            ratio = rate / base_rate if rate and base_rate else None
            out.append((what, None if ratio is None else ratio >= bound,
                        "-" if ratio is None else f"{ratio:.2f}x"))
    over, checked = [], 0
    # a trace's link has no one rate to take a wire time at (nor, mostly, no delay)
    undelayed = [(key, c) for key, c in sorted(table.items()) if not key[1].delay_ms and not key[1].trace
                 and c.done]
    for (method, link), c in undelayed:
        exposed, wire = c.exposed_less_skew_per_exchange_ms(), c.wire_per_exchange_ms(link.mbps)
        if exposed is None or wire is None:
            continue
        checked += 1
        if exposed > wire + 2.0:
            over.append(f"{method} at {link}: {exposed:.1f} > {wire:.1f} + 2")
    if table:
        what = ("exposed communication per exchange, less the wait for the last rank step by step, "
                "<= its wire time + 2 ms (every method and link without delay)")
        if not undelayed:
            out.append((what, None, "no link without delay in this race"))
        elif not checked:
            out.append((what, None, "no run recorded its exposed communication and bytes"))
        else:
            unchecked = len(undelayed) - checked
            out.append((what, not over, ("; ".join(over) or f"all {checked} within")
                        + (f" ({unchecked} without figures)" if unchecked else "")))
    for method, mbps, bound in (("diloco", 10.0, 0.95), ("streaming", 1.0, 0.90)):
        c = table.get((method, Link(mbps)))
        if c is None:
            continue
        util = c.mean("utilization")
        out.append((f"{method} (eager) at {mbps:g} Mbit/s computes >= {bound:.0%} of its step",
                    None if util is None or c.too_short else util >= bound,
                    "-" if util is None else f"{util:.1%}"))
    return out


TARGETS = {"text": text_targets}
