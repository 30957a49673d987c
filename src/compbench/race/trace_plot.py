"""The race's figure of a trace link (plots/trace_NAME.png): the trace above, the runs' throughput
below, on one time axis from the workers' start. Above: each worker's link rate over time (thin
steps), the effective rate the model takes (the slowest worker's: thick) and, on the right axis, the
effective one-way delay between two workers (dashed); the trace's end marked, after which its last
settings hold. Below: each run's tokens (or samples) per second between its evaluations against the
evaluation's wall seconds, a line per seed in its method's colour, so that a slow stretch of the link
lines up with the throughput it cost. Drawn from plain figures (compbench.race.on_trace for the
trace's stretches)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compbench.network.trace import Trace
from compbench.race.on_trace import stretches

# method -> each seed's (wall seconds, units per second) between consecutive evaluations
Rates = Mapping[str, Sequence[Sequence[tuple[float, float]]]]


def throughput(curve: Sequence[Mapping[str, Any]], units: str) -> list[tuple[float, float]]:
    """(wall s at an evaluation, units per training second since the one before): the rate over each
    interval between evaluations, on the training clock (evaluations left out), placed at its end."""
    out = []
    for a, b in zip(curve, curve[1:], strict=False):
        dt = float(b["train_s"]) - float(a["train_s"])
        if dt > 0 and b.get(units) is not None and a.get(units) is not None:
            out.append((float(b["wall_s"]), (float(b[units]) - float(a[units])) / dt))
    return out


def draw_trace(path: Path, trace: Trace, label: str, rates: Rates, units: str, colors: Mapping[str, str],
               title: str, footnote: str) -> None:
    """Write the figure to `path` (see the module)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    seen = max((t for seeds in rates.values() for seed in seeds for t, _ in seed), default=0.0)
    end = max(trace.duration_s, seen) * 1.05 or 1.0
    fig, (top, low) = plt.subplots(2, 1, figsize=(8.0, 6.4), sharex=True, height_ratios=(1, 1.2))
    for rank in range(trace.world):
        times = [*trace.times[rank], end]
        mbps = [s.mbps for s in trace.states[rank]]
        top.step(times, [*mbps, mbps[-1]], where="post", lw=0.8, alpha=0.6, label=f"rank {rank}'s link")
    parts = stretches(trace)
    times = [*(t for t, _, _ in parts), end]
    top.step(times, [*(m for _, m, _ in parts), parts[-1][1]], where="post", lw=2.2, color="0.15",
             label="effective rate (the slowest link)")
    top.set_yscale("log")
    top.set_ylabel("link rate (Mbit/s, log)")
    delay_ax = top.twinx()
    delay_ax.step(times, [*(d for _, _, d in parts), parts[-1][2]], where="post", ls="--", color="C3", lw=1)
    delay_ax.set_ylabel("one-way delay between\ntwo workers (ms, dashed)", color="C3")
    delay_ax.set_ylim(bottom=0)
    if trace.duration_s < end:
        # named in the legend: a label beside the line would cross the curves or the delay axis's label
        top.axvline(trace.duration_s, color="0.5", ls=":", lw=1,
                    label="the trace ends (its last settings hold)")
    top.legend(fontsize=7, loc="lower left")
    top.set_title(title, fontsize=9)
    handles: list[Any] = []
    for method, seeds in rates.items():
        drawn = False
        for seed in seeds:
            if seed:
                low.plot(*zip(*seed, strict=True), marker="o", ms=3, lw=1, color=colors[method])
                drawn = True
        if drawn:
            handles.append(Line2D([], [], color=colors[method], marker="o", ms=3, lw=1, label=method))
    if handles:
        low.legend(handles=handles, fontsize=7, loc="upper right")
    else:
        low.text(0.5, 0.5, "no run recorded two evaluations", transform=low.transAxes, ha="center",
                 va="center")
    low.set_ylim(bottom=0)
    low.set_xlim(0, end)
    low.set_xlabel(f"seconds since the workers started (wall clock; the trace's clock), {label}")
    low.set_ylabel(f"{units}/s between evaluations\n(training clock)")
    fig.text(0.01, 0.01, footnote, fontsize=6.5, color="0.3", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
