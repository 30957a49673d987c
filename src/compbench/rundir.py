"""Run directories: `outputs/YYYY-MM-DD/HH-MM-SS[-N]` (or `output_dir=`), with the composed config
under `.hydra/` as Hydra writes it. Created only after the config passed every check."""

from __future__ import annotations

import time
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


def now_dir(root: Path) -> Path:
    """`root/YYYY-MM-DD/HH-MM-SS` (one clock reading: no date/time mismatch at midnight)."""
    t = time.localtime()
    return root / time.strftime("%Y-%m-%d", t) / time.strftime("%H-%M-%S", t)


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
    path = Path(out) if out else now_dir(Path(cfg.outputs_root))
    if out and _completed(path) and not cfg.resume:  # resuming continues (and then rewrites) its own run
        raise ValueError(f"output_dir={path} already holds a finished run; choose another output_dir")
    try:
        if not out:
            path = claim_fresh(path)
        (path / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, path / ".hydra" / "config.yaml")
        OmegaConf.save(OmegaConf.create(list(overrides or [])), path / ".hydra" / "overrides.yaml")
    except OSError as e:  # checked in compbench.checks; this is the disk filling up or a race
        raise ValueError(f"{key}: cannot write the run folder {path} ({e.strerror}); "
                         f"pass {key}=DIR with DIR a folder you can write") from None
    return path.resolve()


def record_failure(run_dir: Path, cfg: DictConfig, message: str) -> None:
    """A failed run keeps its folder (checkpoints, logs) and says why in results.json."""
    from compbench.train.metrics import write_json_atomic

    if (run_dir / "results.json").exists():
        return
    write_json_atomic(run_dir / "results.json", {
        "config": OmegaConf.to_container(cfg, resolve=True),
        "summary": {"status": "failed", "error": message},
    })
