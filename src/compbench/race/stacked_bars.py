"""What the race's grouped-bar figures (time and cost to target, goodput) share: a tick under each group,
the legend beside the axes, the footnote under them, and the file written."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TICK_CHARS = 22  # a group's label wrapped to this width: a trace's label beside the next one's overlapped


def group_ticks(ax: Any, labels: Sequence[str], methods: int, fontsize: float | None = None) -> None:
    """A tick under each group of `methods` bars (each group `methods` + 1 bar widths apart), its label
    wrapped onto lines of at most TICK_CHARS characters."""
    ax.set_xticks([i * (methods + 1) + (methods - 1) / 2 for i in range(len(labels))],
                  [textwrap.fill(x, TICK_CHARS) for x in labels], fontsize=fontsize)


def finish(fig: Any, ax: Any, handles: list[Any], footnote: str, path: Path) -> None:
    """Legend to the right of `ax`, `footnote` at the bottom, `fig` saved to `path` and closed."""
    import matplotlib.pyplot as plt

    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.text(0.01, 0.01, footnote, fontsize=6.5, color="0.3", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
