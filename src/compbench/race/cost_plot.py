"""The race's cost figure (plots/cost_to_target.png, with `--prices`): per link, per method, the cost
to target in US dollars (compbench.race.cost) as a stacked bar of the seeds' means, the devices' part
filled and the egress part hatched above it (which of the two a method pays for), each seed's total
a point, k/n above every bar (the seeds that reached the target and are costed), a triangle at 0
where none did. Drawn from plain figures, so that it knows nothing of the report's tables."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compbench.race.stacked_bars import finish, group_ticks

# (method, link label) -> (each costed seed's (devices, egress) USD, the seeds that ran)
Bars = Mapping[tuple[str, str], tuple[Sequence[tuple[float, float]], int]]


def draw_cost(path: Path, bars: Bars, methods: Sequence[str], links: Sequence[str], colors: Mapping[str, str],
              title: str, footnote: str) -> None:
    """Write the figure to `path` (see the module)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(9.0, 0.55 * len(methods) * len(links) + 5.5), 4.8))
    top = 0.0
    for i, link in enumerate(links):
        for j, m in enumerate(methods):
            if (m, link) not in bars:
                continue
            seeds, n = bars[(m, link)]
            x = i * (len(methods) + 1) + j
            if not seeds:  # ran, and no seed reached the target (or none is costed)
                ax.plot([x], [0], marker="v", ms=9, color=colors[m], ls="", clip_on=False)
                ax.annotate(f"0/{n}", (x, 0), textcoords="offset points", xytext=(0, 7), ha="center",
                            fontsize=7, color=colors[m])
                continue
            device = statistics.fmean(d for d, _ in seeds)
            egress = statistics.fmean(e for _, e in seeds)
            ax.bar(x, device, width=0.8, color=colors[m], alpha=0.6, edgecolor=colors[m])
            ax.bar(x, egress, bottom=device, width=0.8, fill=False, hatch="///", edgecolor=colors[m])
            totals = [d + e for d, e in seeds]
            ax.plot([x] * len(totals), totals, marker="o", ms=4, color="0.15", ls="")
            high = max(device + egress, *totals)
            top = max(top, high)
            ax.annotate(f"{len(seeds)}/{n}", (x, high), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=7, color=colors[m])
    if top == 0.0:
        ax.text(0.5, 0.5, "no method reached the target at a known cost", transform=ax.transAxes,
                ha="center", va="center")
    group_ticks(ax, list(links), len(methods))
    ax.set_xlabel("link (rate each way, one-way delay; or a trace)")
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.set_ylabel("cost to the target (USD)\ndevices' time + egress")
    ax.set_title(title, fontsize=8)
    handles: list[Any] = [Patch(facecolor=colors[m], alpha=0.6, label=f"{m}: devices' cost") for m in methods]
    handles += [Patch(facecolor="none", edgecolor="0.4", hatch="///", label="egress cost (above it)"),
                Line2D([], [], color="0.15", marker="o", ms=4, ls="", label="a seed's total"),
                Line2D([], [], color="0.4", marker="v", ms=8, ls="", label="no seed reached it")]
    finish(fig, ax, handles, footnote, path)
