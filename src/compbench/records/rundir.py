"""Run directories: `outputs/YYYY-MM-DD/HH-MM-SS_<main choices>[-N]` (or `output_dir=`), with the
composed config under `.hydra/` as Hydra writes it. Created only after the config passed every check.
Sweep jobs are named by the overrides that differ between them (`job_names`, Hydra's
override_dirname convention), so TensorBoard's run names say which run is which."""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def claim_fresh(base: Path) -> Path:
    """Create and return `base`, or `base-1`, `base-2`, ... if taken. mkdir is the claim (atomic):
    two runs or sweeps started in the same second, even by two processes, never share a folder."""
    base.parent.mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path, n = base.with_name(f"{base.name}-{n}"), n + 1


def now_dir(root: Path, label: str = "") -> Path:
    """`root/YYYY-MM-DD/HH-MM-SS[_label]` (one clock reading: no date/time mismatch at midnight)."""
    t = time.localtime()
    name = time.strftime("%H-%M-%S", t) + (f"_{label}" if label else "")
    return root / time.strftime("%Y-%m-%d", t) / name


# Longest folder name we make (file systems allow 255 bytes); longer ones end in a hash.
_MAX_NAME = 160


def safe_name(name: str) -> str:
    """`name` as one folder name: every character but letters, digits and `._,=+-[]@%` becomes
    `_` (a `/` in a value would make a nested folder); very long names are cut and end in a hash
    of the whole, so distinct names stay distinct."""
    safe = re.sub(r"[^A-Za-z0-9._,=+\-\[\]@%]", "_", name)
    if len(safe) > _MAX_NAME:
        safe = f"{safe[:_MAX_NAME - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return safe


def run_label(cfg: DictConfig) -> str:
    """The main choices of a single run, for its folder: `dgc-0.001_allgather_resnet20`."""
    ratio = cfg.compressor.get("ratio")
    compressor = cfg.choices["compressor"] + (f"-{ratio}" if ratio is not None else "")
    return safe_name("_".join([compressor, cfg.choices["comm"], cfg.choices["model"]]))


def split_overrides(jobs: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """Each job's overrides whose value differs between the jobs (sorted by key), and the ones
    every job shares. A job with no differing override (a single job, duplicates, a job without
    the key others set) keeps all its overrides as its own."""
    parsed = [dict(o.partition("=")[::2] for o in job) for job in jobs]
    keys = sorted({k for job in parsed for k in job})
    differ = [k for k in keys if len({job.get(k) for job in parsed}) > 1]
    common = [f"{k}={parsed[0][k]}" for k in keys if k not in differ] if differ else []
    own = [[f"{k}={job[k]}" for k in (differ if any(k in job for k in differ) else keys) if k in job]
           for job in parsed]
    return own, common


def job_names(jobs: list[list[str]]) -> list[str]:
    """One folder name per sweep job, Hydra's override_dirname convention: the job's overrides
    whose value differs between jobs, `key=value` sorted by key and joined by commas
    (`compressor=dgc,ratio=0.01`). Names that would collide (duplicate jobs, or equal once made
    safe) get the job's index in front."""
    names = [safe_name(",".join(own) or "job") for own in split_overrides(jobs)[0]]
    seen = Counter(names)
    return [f"{i}_{n}" if seen[n] > 1 else n for i, n in enumerate(names)]


def _completed(path: Path) -> bool:
    import json

    try:
        return json.loads((path / "results.json").read_text())["summary"]["status"] == "completed"
    except (OSError, ValueError, KeyError):
        return False


def resume_dir(cfg: DictConfig) -> str | None:
    """`resume=RUN_DIR` (or its checkpoint) continues in that directory unless output_dir says otherwise."""
    if cfg.output_dir or not cfg.resume or cfg.resume == "auto":
        return cfg.output_dir
    path = Path(cfg.resume)
    return str(path if path.is_dir() else path.parent)


def prepare_run_dir(cfg: DictConfig, overrides: list[str] | None = None) -> Path:
    out = resume_dir(cfg)
    key = "output_dir" if out else "outputs_root"
    path = Path(out) if out else now_dir(Path(cfg.outputs_root), run_label(cfg))
    if out and _completed(path) and not cfg.resume:  # resuming continues (and then rewrites) its own run
        raise ValueError(f"output_dir={path} already holds a finished run; choose another output_dir")
    try:
        if not out:
            path = claim_fresh(path)
        (path / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, path / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create(list(overrides or [])), path / ".hydra" / "overrides.yaml")
    except OSError as e:  # checked in compbench.compose.checks; this is the disk filling up or a race
        raise ValueError(f"{key}: cannot write the run folder {path} ({e.strerror}); "
                         f"pass {key}=DIR with DIR a folder you can write") from None
    return path.resolve()


def record_failure(run_dir: Path, cfg: DictConfig, message: str) -> None:
    """A failed run keeps its folder (checkpoints, logs) and says why in results.json."""
    from compbench.records.results import write_json_atomic

    if (run_dir / "results.json").exists():
        return
    write_json_atomic(run_dir / "results.json", {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "summary": {"status": "failed", "error": message},
    })


def hydra_quoted(value: str) -> str:
    """`value` as a quoted Hydra override value: job folders hold `=` and `,`, which Hydra would
    otherwise read as a sweep. A backslash escapes a quote and the backslashes before one."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    trailing = len(value) - len(value.rstrip("\\"))
    return "'" + escaped + "\\" * trailing + "'"
