"""The values of a Hydra launcher plugin's settings (`hydra.launcher.*`), checked before a sweep's folder
exists: the plugins take any value and fail inside the sweep (joblib's `n_jobs=0`), accept one that
cannot hold here (a GPU per node on a machine without one, several nodes for local jobs) or start more
processes than the machine can carry (`n_jobs=100000` started ~1000 loky workers). Each rule is data:
which values a key takes and the fix; `check` reads them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from compbench.base.values import show

Rule = Callable[[Any], str | None]  # None: the value is good; else what it must be


def _whole(low: int, high: int | None = None, null: bool = False) -> Rule:
    def rule(v: Any) -> str | None:
        if v is None and null:
            return None
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        return None if ok else f"a whole number {span}" + (" (or null)" if null else "")
    return rule


def _positive(null: bool = True) -> Rule:
    def rule(v: Any) -> str | None:
        if v is None and null:
            return None
        ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
        return None if ok else "a number > 0" + (" (or null)" if null else "")
    return rule


def _one_of(*choices: str | None) -> Rule:
    return lambda v: None if v in choices else "one of " + ", ".join(show(c) for c in choices)


def _n_jobs(v: Any) -> str | None:
    """joblib's n_jobs: N parallel jobs, or -k for all cores but k - 1; never more than the cores (each
    job starts its own workers, which share them)."""
    cores = os.cpu_count() or 1
    ok = isinstance(v, int) and not isinstance(v, bool) and (1 <= v <= cores or -cores <= v <= -1)
    return None if ok else f"a whole number from 1 to {cores} (this machine's cores), or -1 for all of them"


def _local_gpus(v: Any) -> str | None:
    from compbench.engines.device import visible_gpus

    gpus = visible_gpus()
    wrong = _whole(0, gpus, null=True)(v)
    return None if wrong is None else f"null, or a whole number up to this machine's {gpus} GPU(s)"


_SUBMITIT = {"timeout_min": _whole(1), "tasks_per_node": _whole(1), "cpus_per_task": _whole(1, null=True),
             "mem_gb": _positive()}
RULES: Mapping[str, Mapping[str, Rule]] = {
    "joblib": {"n_jobs": _n_jobs,
               "backend": _one_of(None, "loky", "multiprocessing", "threading", "sequential"),
               "prefer": _one_of(None, "processes", "threads"), "verbose": _whole(0)},
    "submitit_local": {**_SUBMITIT, "nodes": _whole(1, 1), "gpus_per_node": _local_gpus},
    "submitit_slurm": {**_SUBMITIT, "nodes": _whole(1), "gpus_per_node": _whole(0, null=True)},
}
# What a plugin needs on this machine besides itself: (program, why)
NEEDS = {"submitit_slurm": ("sbatch", "submits the jobs to SLURM with sbatch")}


def check(name: str, launcher: Mapping[str, Any]) -> None:
    """ValueError (one line naming the key and the fix) where plugin `name`'s resolved settings
    `launcher` hold a value it cannot run with here."""
    for key, rule in RULES.get(name, {}).items():
        if key in launcher and (want := rule(launcher[key])) is not None:
            raise ValueError(f"hydra.launcher.{key}={show(launcher[key])} must be {want} "
                             f"(hydra/launcher={name})")
    if name in NEEDS and shutil.which(NEEDS[name][0]) is None:
        program, why = NEEDS[name]
        raise ValueError(f"hydra/launcher={name} {why}, which this machine lacks; run the sweep where SLURM "
                         "is, or use hydra/launcher=joblib here")
