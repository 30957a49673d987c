"""What the race's stacked-bar figures (cost to target, goodput) share: the legend beside the axes, the
footnote under them, and the file written."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def finish(fig: Any, ax: Any, handles: list[Any], footnote: str, path: Path) -> None:
    """Legend to the right of `ax`, `footnote` at the bottom, `fig` saved to `path` and closed."""
    import matplotlib.pyplot as plt

    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.text(0.01, 0.01, footnote, fontsize=6.5, color="0.3", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
