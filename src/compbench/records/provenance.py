"""Where a run's figures come from: compbench's commit (and whether its tree had changes), the CPU,
its cores, and how loaded the machine was around the run. A time measured in wall-clock seconds on a
shared machine measures the machine too: results.json records the load average before and after,
and what other work did while the run trained (compbench.train.machine): its runnable tasks on the
average (`others_runnable`: its demand for the cores) and the cores it used (`others_cores`). A run
where other work's demand exceeded the cores the run leaves free by half a core is flagged `loaded`
(in its summary, the race's report and CSV). Where that is not known (ranks on machines of their own,
an elastic run), the load average at the end less the run's own compute threads stands for it."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any


def load_average() -> float:
    """The machine's 1-minute load average (runnable processes, ours included)."""
    return os.getloadavg()[0]


_STAT = Path("/proc/stat")


def busy_seconds() -> float | None:
    """CPU seconds every core of the machine has been busy since boot (user, nice, system, interrupts
    and the time a hypervisor gave the cores to others, `steal`; /proc/stat), None without it."""
    if not _STAT.exists():
        return None
    fields = [int(x) for x in _STAT.read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


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


# Other work that flags a run: half a core on average (a busy loop half the time); a shell, an
# editor or a short command stays below it.
OTHER_LOAD = 0.5


def loaded(load_before: float, load_after: float, own_threads: int, cores: int,
           others_runnable: float | None = None) -> bool:
    """Whether other work competed for the cores: other processes' runnable tasks while the run
    trained (compbench.train.machine, where known) on the average, or else the 1-minute load average
    at the run's end less the run's own compute threads, above the cores the run leaves free by
    OTHER_LOAD. The load average counts a job's own communication threads too (it flagged 3 of 32
    runs of an idle race: Streaming DiLoCo's), and the load before is not judged: in a matrix of runs
    one after another it is the previous run's own workers (the average lags by a minute)."""
    del load_before
    others = load_after - own_threads if others_runnable is None else others_runnable
    return others > max(0, cores - own_threads) + OTHER_LOAD


def runnable_tasks() -> int | None:
    """Tasks runnable on the machine now, running ones included (/proc/stat), None without it."""
    if not _STAT.exists():
        return None
    for line in _STAT.read_text().splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


def running_threads(pid: int) -> int:
    """How many threads of process `pid` are runnable now (state R; 0 once it is gone)."""
    count = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            count += (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
    return count


def machine(load_before: float, load_after: float, own_threads: int, others_runnable: float | None = None,
            others_cores: float | None = None) -> dict[str, Any]:
    """The record of the machine around a run (results.json's `environment` takes it)."""
    from compbench.kernels.cpu import cpu_model

    cores = os.cpu_count() or 1
    return {"cpu": cpu_model(), "cores": cores, **source(), "load_before": round(load_before, 2),
            "load_after": round(load_after, 2), "own_threads": own_threads,
            "others_runnable": None if others_runnable is None else round(others_runnable, 3),
            "others_cores": None if others_cores is None else round(others_cores, 3),
            "loaded": loaded(load_before, load_after, own_threads, cores, others_runnable)}
