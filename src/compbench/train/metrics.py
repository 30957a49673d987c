"""Rank 0's recorder: per-step timings, byte counts and evaluations into the run's loggers
(compbench.train.loggers: TensorBoard by default, a CSV, MLflow) and the history that becomes
results.json; the results schema (compbench.records.results) gives every tag its unit and description,
written into the tag's TensorBoard metadata and shown by the Scalars dashboard's info icon.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from compbench.train.loggers import Logger, TensorBoardLogger


class Recorder:
    """Rank 0's loggers plus the running history that becomes results.json.

    With TensorBoard: one event file per run, in `run_dir/tb`: the scalars and the HParams session
    records (start now, end at `finish`) together, so TensorBoard shows one run per job and the
    HParams dashboard's "Show metrics" draws that run's own curves. No experiment summary is
    written: TensorBoard then finds which hyperparameters differ between runs and shows those first.

    Every scalar is written at its training time (`train_s`, set by the trainer: the steps' wall
    times, evaluation and checkpoints left out) after the run's start: TensorBoard's "Relative" x
    axis is then the time a method trained, the axis of time to quality."""

    def __init__(self, run_dir: Path, hparams: Mapping[str, Any],
                 loggers: Sequence[Logger] | None = None) -> None:
        """`loggers`: where the scalars go (compbench.train.loggers.build; default TensorBoard)."""
        self.run_dir = run_dir
        self.history: dict[str, list[float]] = defaultdict(list)
        self.start = time.time()
        self.train_s = 0.0
        self.loggers = (list(loggers) if loggers is not None
                        else [TensorBoardLogger(run_dir, hparams, self.start)])

    def scalar(self, tag: str, value: float, step: int, keep: bool = True) -> None:
        for logger in self.loggers:
            logger.scalar(tag, value, step, self.train_s)
        if keep:
            self.history[tag].append(float(value))

    def finish(self, results: Mapping[str, Any] | None = None) -> None:
        """The run ended (`results`, results.json's content, on success): every logger closes."""
        for logger in self.loggers:
            logger.finish(results)

    def median(self, tag: str, skip: int = 0) -> float | None:
        values = self.history.get(tag, [])
        values = values[skip:] if len(values) > skip else values
        return statistics.median(values) if values else None

    def round_mean(self, tag: str, skip: int, period: int, per_second: bool = False) -> float | None:
        """Mean per step over the whole rounds of `period` steps after the first `skip` steps
        (rounded up to a round): a periodic mode's step that sends nothing counts as one.
        `per_second`: `tag` is a rate per step (units / step time): the rounds' units over their time."""
        values = self.history.get(tag, [])
        start = -(-skip // period) * period
        whole = (len(values) - start) // period * period
        if whole <= 0:  # fewer steps than a round after warm-up: every step there is
            start, whole = 0, len(values) // period * period or len(values)
        values = values[start:start + whole]
        if not values:
            return None
        if not per_second:
            return statistics.fmean(values)
        seconds = self.history["time/step_ms"][start:start + whole]
        return sum(v * ms for v, ms in zip(values, seconds, strict=True)) / sum(seconds)

    def quartiles(self, tag: str, skip: int, period: int = 1) -> tuple[float, float] | None:
        """The first and third quartiles of `tag` after the first `skip` steps: of each step's value,
        or, for a periodic mode, of each whole round's mean (a round is what repeats)."""
        values = self.history.get(tag, [])[-(-skip // period) * period:]
        if period > 1:
            starts = range(0, len(values) - period + 1, period)
            values = [statistics.fmean(values[i:i + period]) for i in starts]
        if len(values) < 2:
            return None
        q1, _, q3 = statistics.quantiles(values, n=4)
        return q1, q3

    def close(self) -> None:
        """Close the loggers of a run that did not finish (no success recorded)."""
        for logger in self.loggers:
            logger.finish(None)


def run_hparams(cfg: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """What a run's HParams row shows: compressor and ratio first, then the other choices and the
    usual sweep knobs. `net` is only a model for plans (left out) unless it shapes this job."""
    choices, comp = cfg["choices"], cfg["compressor"]
    hp: dict[str, Any] = {"compressor": choices["compressor"], "ratio": comp.get("ratio", 1.0)}
    hp.update({g: choices[g] for g in ("memory", "comm", "scheduler", "model", "dataset", "engine", "optim")})
    hp.update(world_size=world_size, lr=cfg["optim"].get("lr"), batch_size=cfg["batch_size"],
              epochs=cfg["epochs"], seed=cfg["seed"])
    if cfg["net"].get("emulate_gbps") is not None:
        hp["net.emulate_gbps"] = cfg["net"]["emulate_gbps"]
    for key in ("emulate_rank_gbps", "emulate_rank_latency_us"):  # lists: HParams shows text
        if cfg["net"].get(key) is not None:
            hp[f"net.{key}"] = ",".join(f"{g:g}" for g in cfg["net"][key])
    for key in ("emulate_latency_us", "emulate_jitter_us", "emulate_loss"):  # the link's other half
        if cfg["net"].get(key):
            hp[f"net.{key}"] = cfg["net"][key]
    if "experiment" in choices:
        hp["experiment"] = choices["experiment"]
    if choices.get("sharding", "none") != "none":  # a sharded run's layout and FSDP's formats
        sharding = cfg["sharding"]
        hp.update({"sharding": choices["sharding"], **{f"sharding.{k}": sharding[k] for k in (
            "stage", "gather", "scatter", "hpz") if k in sharding}})
    if choices.get("sync", "step") != "step":  # a per-step run's row stays as it was
        hp["sync"] = choices["sync"]
        # the mode's own settings: a DiLoCo and a Streaming DiLoCo run differ only there
        hp.update({f"sync.{k}": _hparam(v) for k, v in cfg["sync"].items() if k != "_target_"})
    if cfg.get("max_steps") is not None:  # what bounded the run (epochs alone misreports it)
        hp["max_steps"] = cfg["max_steps"]
    return hp


def _hparam(value: Any) -> Any:
    """A setting as HParams and MLflow take it: lists and mappings as their text."""
    return value if value is None or isinstance(value, bool | int | float | str) else str(value)
