"""Where a run's figures come from: compbench's commit (and whether its tree had changes), the CPU,
its cores, and how loaded the machine was around the run. A time measured in wall-clock seconds on a
shared machine measures the machine too: results.json records the load before and after, and a run
whose load at its end, less its own compute threads, exceeded the cores they leave free (by half a
core) is flagged `loaded` (in its summary, the race's report and CSV)."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any


def load_average() -> float:
    """The machine's 1-minute load average (runnable processes, ours included)."""
    return os.getloadavg()[0]


@cache
def source() -> dict[str, Any]:
    """compbench's commit and whether its checkout had uncommitted changes (None where it is not a git
    checkout: an installed wheel)."""
    root = Path(__file__).resolve().parents[3]

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}


# Other work's load above the cores the run leaves free that flags a run: a busy loop of half a core
# on average; a shell, an editor or a short command stays below it.
OTHER_LOAD = 0.5


def loaded(load_before: float, load_after: float, own_threads: int, cores: int) -> bool:
    """Whether other work competed for the cores: the 1-minute load average at the run's end less the
    run's own compute threads, above the cores those leave free by OTHER_LOAD. The load before is
    recorded, not judged: in a matrix of runs one after another it is the previous run's own workers
    (the average lags by a minute), which flagged every run but the first of an idle race."""
    del load_before
    return load_after - own_threads > max(0, cores - own_threads) + OTHER_LOAD


def machine(load_before: float, load_after: float, own_threads: int) -> dict[str, Any]:
    """The record of the machine around a run (results.json's `environment` takes it)."""
    from compbench.kernels.cpu import cpu_model

    cores = os.cpu_count() or 1
    return {"cpu": cpu_model(), "cores": cores, **source(), "load_before": round(load_before, 2),
            "load_after": round(load_after, 2), "own_threads": own_threads,
            "loaded": loaded(load_before, load_after, own_threads, cores)}
