"""The run's top-level settings (conf/train.yaml's own keys), typed: `RunSettings.of(cfg)` checks each
key against the type and range declared on its field and returns the values as plain Python, so
the trainer reads `settings.epochs` (an int >= 1) instead of trusting `cfg.epochs`. This is the one
home of these rules (compbench.compose.checks calls it in the parent before anything is written; the
workers build the same object from the same config).

The component groups (model, compressor, ...) are checked by their own modules; `ratio` by
compbench.compose.config (it is a shorthand for compressor.ratio).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from compbench.base.values import require_int, require_number, show

ON_NONFINITE = ("raise", "skip", "ignore")
DEVICES = ("auto", "cpu", "cuda")  # compbench.engines.device: where a run trains
PRECISIONS = ("fp32", "bf16")  # bf16: autocast for forward and backward; gradients and pipeline in fp32
TIMINGS = ("events", "sync")  # on a GPU: phases timed by CUDA events, or synchronized at each edge
# what max_train_s and eval_every_s count: each step's wall time, or (a CPU's steps) its estimate on a
# machine nobody else loads (compbench.records.stats.StepStats.unloaded_ms)
BUDGET_CLOCKS = ("wall", "unloaded")


def _int(low: int, fix: str = "", nullable: bool = False) -> Any:
    return field(metadata={"kind": "int", "low": low, "fix": fix, "nullable": nullable})


def _number(low: float, high: float | None = None, strict: bool = False, fix: str = "",
            nullable: bool = False) -> Any:
    return field(metadata={"kind": "number", "low": low, "high": high, "strict": strict, "fix": fix,
                           "nullable": nullable})


def _flag() -> Any:
    return field(metadata={"kind": "bool"})


def _choice(choices: tuple[str, ...]) -> Any:
    return field(metadata={"kind": "choice", "choices": choices})


def _path() -> Any:
    # A folder name may look like a number (`output_dir=3`): taken as text, as the shell would.
    return field(metadata={"kind": "path", "nullable": True})


@dataclass(frozen=True)
class RunSettings:
    """conf/train.yaml's top-level keys (comments there say what each does)."""

    # In the order they are checked (the first bad one is reported).
    epochs: int = _int(1)
    batch_size: int = _int(1)
    eval_batch_size: int = _int(1)
    max_steps: int | None = _int(1, "or max_steps=null for no limit", nullable=True)
    checkpoint_every_steps: int = _int(0, "0 checkpoints at epoch ends only")
    seed: int = _int(0)
    num_workers: int = _int(0)
    threads: int | None = _int(1, "or threads=null for cores / workers", nullable=True)
    nice: int | None = _int(-20, "or nice=null to keep this process's priority", nullable=True)
    eval: bool = _flag()
    checkpoint: bool = _flag()
    progress: bool = _flag()
    flush_denormal: bool = _flag()
    on_nonfinite: str = _choice(ON_NONFINITE)
    device: str = _choice(DEVICES)
    precision: str = _choice(PRECISIONS)
    timing: str = _choice(TIMINGS)
    resume: str | None = _path()
    output_dir: str | None = _path()
    outputs_root: str = _path()
    eval_every_steps: int = _int(0, "0 leaves the schedule to eval_every_s or eval_points")
    eval_every_s: float = _number(0, fix="seconds of training between evaluations, 0: off")
    eval_points: int = _int(0, "0 evaluates at epoch ends and the last step only")
    target_loss: float | None = _number(0, strict=True, nullable=True,
                                        fix="a validation loss to reach, e.g. target_loss=1.6")
    target_acc1: float | None = _number(0, high=100, strict=True, fix="an accuracy in % to reach, e.g. "
                                        "target_acc1=95", nullable=True)
    stop_at_target: bool = _flag()
    eval_near_target: float = _number(0, high=1, fix="a relative distance to the target within which the "
                                      "schedule evaluates 4 times as often, e.g. 0.15; 0: off")
    max_train_s: float | None = _number(0, strict=True, nullable=True,
                                        fix="seconds of training, e.g. max_train_s=90")
    budget_clock: str = _choice(BUDGET_CLOCKS)

    @classmethod
    def path_keys(cls) -> tuple[str, ...]:
        """The settings that name a file or folder (a number given there is its name)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata["kind"] == "path")

    @classmethod
    def of(cls, cfg: DictConfig) -> RunSettings:
        """The settings of `cfg`, each checked (ValueError: one line naming the key and the fix)."""
        return cls(**{f.name: _checked(f, cfg[f.name]) for f in dataclasses.fields(cls)})


def _checked(f: dataclasses.Field, v: Any) -> Any:
    meta = f.metadata
    if v is None and meta.get("nullable"):
        return None
    kind = meta["kind"]
    if kind == "int":
        require_int(f.name, v, meta["low"], meta["fix"])
    elif kind == "number":
        require_number(f.name, v, meta["low"], strict=meta["strict"], fix=meta["fix"])
        if meta["high"] is not None and v > meta["high"]:
            raise ValueError(f"{f.name}={show(v)} must be at most {meta['high']:g}; {meta['fix']}")
        return float(v)
    elif kind == "bool" and not isinstance(v, bool):
        raise ValueError(f"{f.name}={show(v)} must be true or false")
    elif kind == "choice" and v not in meta["choices"]:
        raise ValueError(f"{f.name}={show(v)} is unknown; use {', '.join(meta['choices'][:-1])} or "
                         f"{meta['choices'][-1]}")
    elif kind == "path":
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ValueError(f"{f.name}={show(v)} must be a path")
        return str(v)
    return v
