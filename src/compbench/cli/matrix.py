"""A resumable matrix of `compbench train` runs, shared by `compbench claims` and `compbench race`:
each job is a run folder and its overrides, run one after another through compbench.cli.run.train (the
same config check, launcher and results.json as any run). A folder whose results.json says
completed is skipped, so a matrix stopped half-way (Ctrl-C, a reboot) continues where it stopped; a
half-written folder is removed and run again; a finished folder made with other settings is refused
(pass another output folder) rather than mixed in."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from compbench.base.errors import INTERRUPTED_EXIT

Job = tuple[Path, list[str]]


def summary_of(run_dir: Path) -> dict | None:
    """The run's results.json summary (None: no readable results)."""
    try:
        summary = json.loads((run_dir / "results.json").read_text())["summary"]
    except (OSError, ValueError, KeyError, TypeError):  # missing, half-written or damaged
        return None
    return summary if isinstance(summary, dict) else None


def completed(run_dir: Path) -> bool:
    summary = summary_of(run_dir)
    return summary is not None and summary.get("status") == "completed"


def overrides_of(run_dir: Path) -> list[str]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        return [str(o) for o in OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")]
    except (OSError, ValueError, TypeError, YAMLError, OmegaConfBaseException):  # missing or damaged
        return []


def check_jobs(jobs: list[Job], scratch: Path) -> None:
    """Every job checked before any runs (a typo in the last one should not cost the matrix): a
    finished run must have been made with these overrides; the others pass the config check."""
    from compbench.compose import config

    for run_dir, overrides in jobs:
        if completed(run_dir):
            if overrides_of(run_dir) != [*overrides, f"output_dir={run_dir}"]:
                raise ValueError(f"{run_dir} holds a finished run made with other settings; "
                                 f"pass --out NEW_DIR (or remove {run_dir})")
        else:
            config.check(config.compose([*overrides, f"output_dir={scratch}"]))


def run_jobs(jobs: list[Job], label: str) -> int:
    """Run the jobs not finished yet; 0, 1 when a run failed, 130 on Ctrl-C (the next call continues).
    Each run's wall seconds go to its folder's wall_s.txt."""
    from compbench.cli.run import train

    todo = [(d, o) for d, o in jobs if not completed(d)]
    print(f"{label}: {len(jobs)} runs, {len(jobs) - len(todo)} already finished, {len(todo)} to run",
          flush=True)
    failed = 0
    for i, (run_dir, overrides) in enumerate(todo):
        if run_dir.exists():  # a run stopped half-way: start it again from scratch
            shutil.rmtree(run_dir)
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        print(f"[{i + 1}/{len(todo)}] {run_dir.name}: {' '.join(overrides)}", flush=True)
        start = time.monotonic()
        code = train([*overrides, f"output_dir={run_dir}"])
        if code == INTERRUPTED_EXIT:
            print(f"{label}: interrupted; run again to continue ({len(todo) - i - 1} runs left)", flush=True)
            return code
        failed += code != 0
        (run_dir / "wall_s.txt").write_text(f"{time.monotonic() - start:.1f}\n")
    return 1 if failed else 0
