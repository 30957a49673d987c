"""The race's goodput figure (plots/goodput.png): per link and fault scenario, per method, the share
of its workers' time that ended up in the model (summary.goodput, compbench.records.goodput) as a bar
from 0 to 1 (the seeds' mean, its value written above it), the share discarded stacked hatched on it,
the rest of the way to 1 idle; each seed's goodput a point; a cross at 0 where a method ran and no
run recorded goodput, nothing where it did not run under the scenario. Drawn from plain figures, so
that it knows nothing of the report's tables."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compbench.race.stacked_bars import finish, group_ticks

# (method, condition label) -> each finished seed's (goodput, discarded share); empty: none recorded
Bars = Mapping[tuple[str, str], Sequence[tuple[float, float]]]


def draw_goodput(path: Path, bars: Bars, methods: Sequence[str], conditions: Sequence[str],
                 colors: Mapping[str, str], title: str, footnote: str) -> None:
    """Write the figure to `path` (see the module)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(9.0, 0.55 * len(methods) * len(conditions) + 5.5), 4.8))
    for i, condition in enumerate(conditions):
        for j, m in enumerate(methods):
            if (m, condition) not in bars:
                continue
            seeds = bars[(m, condition)]
            x = i * (len(methods) + 1) + j
            if not seeds:
                ax.plot([x], [0], marker="x", ms=8, color=colors[m], ls="", clip_on=False)
                continue
            good = statistics.fmean(g for g, _ in seeds)
            lost = statistics.fmean(d for _, d in seeds)
            ax.bar(x, good, width=0.8, color=colors[m], alpha=0.6, edgecolor=colors[m])
            if lost:
                ax.bar(x, lost, bottom=good, width=0.8, fill=False, hatch="///", edgecolor=colors[m])
            ax.plot([x] * len(seeds), [g for g, _ in seeds], marker="o", ms=3, color="0.15", ls="")
            ax.annotate(f"{good:.2f}", (x, good + lost), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=7, color=colors[m])
    group_ticks(ax, list(conditions), len(methods), fontsize=7)
    ax.set_xlabel("link and fault scenario")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("goodput: the workers' useful compute\nover their time (0 to 1)")
    ax.set_title(title, fontsize=8)
    handles: list[Any] = [Patch(facecolor=colors[m], alpha=0.6, label=f"{m}: goodput") for m in methods]
    handles += [Patch(facecolor="none", edgecolor="0.4", hatch="///", label="discarded (above it)"),
                Line2D([], [], color="0.15", marker="o", ms=3, ls="", label="a seed's goodput"),
                Line2D([], [], color="0.4", marker="x", ms=8, ls="", label="ran, no goodput recorded")]
    finish(fig, ax, handles, footnote, path)
