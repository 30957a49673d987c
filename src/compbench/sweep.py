"""`compbench train -m a=1,2 b=x,y`: run every combination, one job after another.

Each job starts its own workers in `outputs/multirun/DATE/TIME/<job>/`; a job that fails is recorded
with its error and the sweep goes on; a one-screen summary closes the sweep.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path


def expand(overrides: list[str]) -> list[list[str]]:
    """Cartesian product of the sweep overrides (Hydra's syntax: a=1,2 or a=range(1,3))."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    axes = []
    for o in parsed:
        key = o.get_key_element()
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*axes)]


def plan_jobs(overrides: list[str]) -> list[list[str]]:
    """The sweep's jobs: the command line's axes, plus an experiment's `sweep` axes (unless the
    command line sets the same key) or its explicit `jobs` list."""
    from omegaconf import OmegaConf

    from compbench import config

    single = [o for o in overrides if "," not in o.partition("=")[2]]  # compose once without the axes
    base = config.compose(single)
    axes = list(overrides)
    given = {o.partition("=")[0] for o in overrides}
    for key, values in OmegaConf.to_container(base.sweep).items():
        if key not in given:
            axes.append(f"{key}={values}")
    if base.jobs:
        return [[*expanded, *map(str, job)] for job in base.jobs for expanded in expand(axes)]
    return expand(axes)


def run_sweep(overrides: list[str]) -> int:
    from compbench import config
    from compbench.cli import train

    jobs = plan_jobs(overrides)
    # Check every job before running any: a typo in the last combination should not cost a sweep.
    cfgs = [config.check(config.compose(job)) for job in jobs]
    sweep_dir = (Path(cfgs[0].outputs_root) / "multirun" / time.strftime("%Y-%m-%d")
                 / time.strftime("%H-%M-%S"))
    rows = []
    for i, job in enumerate(jobs):
        job_dir = sweep_dir / str(i)
        print(f"[{i + 1}/{len(jobs)}] {' '.join(job)}", flush=True)
        code = train([*job, f"output_dir={job_dir}"])
        rows.append((i, " ".join(job), code, _summary(job_dir)))
    print(_table(rows))
    print(f"sweep: {sweep_dir}  (compbench report {sweep_dir})")
    return 0 if all(code == 0 for *_, code, _ in rows) else 1


def _summary(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "results.json").read_text())["summary"]
    except (OSError, ValueError, KeyError):
        return {"status": "failed", "error": "no results.json"}


def _table(rows) -> str:
    lines = [f"{'job':>3}  {'overrides':<48} {'status':<9} {'acc1':>6} {'samples/s':>9} {'ratio':>7}"]
    for i, job, _, s in rows:
        acc = f"{s['final_acc1']:.2f}" if s.get("final_acc1") is not None else "-"
        thr = f"{s['throughput']:.0f}" if s.get("throughput") else "-"
        ratio = f"{s['ratio_effective']:.1f}" if s.get("ratio_effective") else "-"
        lines.append(f"{i:>3}  {job[:48]:<48} {s.get('status', '?'):<9} {acc:>6} {thr:>9} {ratio:>7}")
        if s.get("status") == "failed":
            lines.append(f"{'':>5}{s.get('error', '')}")
    return "\n".join(lines)
