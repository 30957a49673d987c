"""`compbench train -m a=1,2 b=x,y`: run every combination, one job after another.

Each job starts its own workers in `outputs/multirun/DATE/TIME/<job>/` (or `hydra.sweep.dir=DIR`),
<job> being the overrides that differ between the jobs (`compressor=dgc,ratio=0.01`);
a job that fails is recorded with its error and the sweep goes on; Ctrl-C stops the whole sweep
(exit 130); a one-screen summary closes the sweep. Two sweeps started in the same second get
distinct folders (`TIME-1`, ...).
"""

from __future__ import annotations

import itertools
import json
import shutil
import textwrap
from pathlib import Path
from typing import Any, cast

from compbench.records.results import headline
from compbench.records.rundir import hydra_quoted


def _parse(overrides: list[str]) -> list[Any]:
    """Hydra's own override parser (its grammar: a,b  range()  choice()  glob()  interval() ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        first = str(e).strip().splitlines()[0]
        raise ValueError(f"{first} (sweep syntax: a,b  range(1,4)  choice(a,b)  glob(*))") from None


def _values(o: Any) -> list[str]:
    """The values one sweep override stands for, as override strings (Hydra's encoding)."""
    from hydra.core.override_parser.types import Glob

    from compbench.compose.config import GROUPS

    key, value = o.get_key_element(), o.value()
    if not o.is_sweep_override():
        if not o.is_delete() and o.input_line.endswith("="):  # `-m ratio=`: a list with nothing in it
            raise ValueError(f"{o.input_line} gives no values to sweep; give at least one, e.g. "
                             f"{key}=a,b (or {key}='' for an empty string)")
        return [o.get_value_element_as_str()]
    if not o.is_discrete_sweep():  # interval(a,b): a range to sample from, not values to run
        raise ValueError(f"{key}={o.input_line.partition('=')[2]}: interval() needs a sampling sweeper "
                         f"(Optuna, Nevergrad), which compbench has not; list the values, e.g. "
                         f"{key}=0.1,0.01, or step through them with {key}=range(START,STOP,STEP)")
    if isinstance(value, Glob):
        if o.key_or_group not in GROUPS:
            raise ValueError(f"{key}=glob(...) picks options of a config group; {key} is not one "
                             f"({', '.join(GROUPS)})")
        from compbench.catalog import registry

        values = value.filter(registry.options(o.key_or_group))
    else:
        try:
            values = list(o.sweep_string_iterator())
        except ValueError as e:  # range(0,3,0)
            raise ValueError(f"{o.input_line}: {e}; e.g. {key}=range(0,3)") from None
    if not values:
        raise ValueError(f"{o.input_line} gives no values to sweep; give at least one, e.g. "
                         f"{key}=a,b or {key}=range(1,4)")
    return values


def expand(overrides: list[str]) -> list[list[str]]:
    """Cartesian product of the sweep overrides (Hydra's syntax: a=1,2 a=range(1,3) a=choice(x,y)
    group=glob(*)); a plain key=value is one value."""
    axes = [[f"{o.get_key_element()}={v}" for v in _values(o)] for o in _parse(overrides)]
    return [list(combo) for combo in itertools.product(*axes)]


def plan_jobs(overrides: list[str]) -> list[list[str]]:
    """The sweep's jobs: the command line's axes, plus an experiment's `sweep` axes (unless the
    command line sets the same key) or its explicit `jobs` list."""
    from omegaconf import OmegaConf

    from compbench.compose import config

    # Compose once without the axes (Hydra's compose refuses a sweep), for the experiment's sweep.
    single = [text for text, o in zip(overrides, _parse(overrides), strict=True) if not o.is_sweep_override()]
    base = config.compose(single)
    axes = list(overrides)
    given = {o.partition("=")[0] for o in overrides}
    for key, values in cast(dict[str, Any], OmegaConf.to_container(base.sweep)).items():
        if key not in given:
            if values is None or str(values).strip() == "":
                raise ValueError(f"sweep.{key} is empty; give its values, e.g. sweep.{key}='a,b', "
                                 f"or remove it")
            axes.append(f"{key}={values}")
    if base.jobs:
        return [[*expanded, *map(str, job)] for job in base.jobs for expanded in expand(axes)]
    return expand(axes)


def run_sweep(overrides: list[str], sweep_dir: str | None = None, launcher: list[str] | None = None) -> int:
    """Run every job of the sweep in `sweep_dir` (default: a fresh outputs_root/multirun/DATE/TIME),
    one after another, or through the Hydra launcher plugin `launcher` picks (compbench.cli.sweep_launcher:
    `hydra/launcher=joblib hydra.launcher.n_jobs=2`)."""
    from compbench.base.errors import INTERRUPTED_EXIT
    from compbench.cli.run import train
    from compbench.cli.sweep_launcher import prepare
    from compbench.compose import config
    from compbench.records.rundir import job_names, split_overrides

    jobs = plan_jobs(overrides)
    # Check every job before running any: a typo in the last combination should not cost a sweep.
    cfgs = [config.check(config.compose(job)) for job in jobs]
    plugin = prepare(launcher or [])
    root = _claim_sweep_dir(sweep_dir, Path(cfgs[0].outputs_root))
    own, common = split_overrides(jobs)
    names = job_names(jobs)
    if plugin is not None:
        print(f"sweep: {len(jobs)} jobs through hydra/launcher={plugin.name} in {root}", flush=True)
        try:
            codes = plugin.launch(jobs, names, root)
        except KeyboardInterrupt:
            print(f"sweep: interrupted; {root}", flush=True)
            return INTERRUPTED_EXIT
        rows = [(i + 1, " ".join(own[i]), code, _summary(root / name))
                for i, (name, code) in enumerate(zip(names, codes, strict=True))]
        print(_table(rows, common))
        print(f"sweep: {root}  (compbench report {root})")
        return 0 if all(code == 0 for code in codes) else 1
    rows = []
    for i, (job, name) in enumerate(zip(jobs, names, strict=True)):
        job_dir = root / name
        print(f"[{i + 1}/{len(jobs)}] {' '.join(job)}", flush=True)
        code = train([*job, f"output_dir={hydra_quoted(str(job_dir))}"])
        rows.append((i + 1, " ".join(own[i]), code, _summary(job_dir)))
        if code == INTERRUPTED_EXIT:  # Ctrl-C stopped this job's workers: the user means the sweep
            print(_table(rows, common))
            print(f"sweep: interrupted after {i + 1} of {len(jobs)} jobs; {root}", flush=True)
            return INTERRUPTED_EXIT
    print(_table(rows, common))
    print(f"sweep: {root}  (compbench report {root})")
    return 0 if all(code == 0 for *_, code, _ in rows) else 1


def _claim_sweep_dir(given: str | None, outputs_root: Path) -> Path:
    """The sweep's own folder, created now: `hydra.sweep.dir=DIR` (new or empty), else a fresh
    dated one. Jobs write only below it, so a summary never reads another sweep's results."""
    from compbench.compose.checks import check_creatable
    from compbench.records.rundir import claim_fresh, now_dir

    if given is None:
        check_creatable("outputs_root", outputs_root)
        return claim_fresh(now_dir(outputs_root / "multirun"))
    path = Path(given)
    check_creatable("hydra.sweep.dir", path)
    if path.is_dir() and any(path.iterdir()):
        raise ValueError(f"hydra.sweep.dir={path} is not empty (another sweep's jobs would mix with "
                         f"this one's); pass a new folder")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _summary(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "results.json").read_text())["summary"]
    except (OSError, ValueError, KeyError):
        return {"status": "failed", "error": "no results.json"}


def _table(rows, common: list[str]) -> str:
    """The sweep's summary: one row per job with its differing overrides in full (wrapped to the
    terminal, never cut), and the overrides every job shares once above."""
    width = max(80, shutil.get_terminal_size((100, 24)).columns)
    # Language-model jobs report validation loss and tokens/s where classifiers report acc1, samples/s.
    lm = bool(rows) and all(headline(s)[0] == "loss" for *_, s in rows)
    metric, unit = ("loss", "tokens/s") if lm else ("acc1", "samples/s")
    head = f"{'job':>3}  {'status':<9} {metric:>6} {unit:>9} {'ratio':>7}  "
    wrap = textwrap.TextWrapper(width=width, initial_indent="", subsequent_indent=" " * len(head),
                                break_on_hyphens=False)
    shared = textwrap.fill(f"common: {' '.join(common)}", width=width, subsequent_indent=" " * 8,
                           break_on_hyphens=False)
    lines = [shared] if common else []
    lines.append(f"{head}overrides that differ")
    for i, job, _, s in rows:
        kind, value, _, per_s = headline(s)
        acc = "-" if value is None else f"{value:.{3 if kind == 'loss' else 2}f}"
        thr = f"{per_s:.0f}" if per_s else "-"
        ratio = f"{s['ratio_effective']:.1f}" if s.get("ratio_effective") else "-"
        row = f"{i:>3}  {s.get('status', '?'):<9} {acc:>6} {thr:>9} {ratio:>7}  "
        lines.append(wrap.fill(row + (job or "-")))
        if s.get("status") == "failed":
            lines.append(f"{'':>5}{s.get('error', '')}")
    return "\n".join(lines)
