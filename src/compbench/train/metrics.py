"""Per-step timings and byte counts, and the TensorBoard / results.json recorder (rank 0)."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# comm_exposed: communication (and decoding) the step waited for after back-propagation ended,
# i.e. the part not hidden behind compute.
PHASES = ("compute", "compress", "comm", "comm_exposed", "decompress", "optimizer", "step")


class StepStats:
    """Accumulates one step's phase times (ms) and bytes; `reset()` between steps."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.bytes_sent = 0
        self.bytes_dense = 0
        # Per path, for the what-if model: bytes that went through the dense fp32 allreduce (of
        # bytes_sent), and how many collectives each path started.
        self.bytes_allreduce = 0
        self.calls_compressed = 0
        self.calls_dense = 0

    def add_dense_allreduce(self, nbytes: int, calls: int) -> None:
        """Book gradient bytes that travelled uncompressed through an allreduce."""
        self.bytes_sent += nbytes
        self.bytes_allreduce += nbytes
        self.calls_dense += calls

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms[phase] += (time.perf_counter() - t0) * 1e3

    def add_ms(self, phase: str, ms: float) -> None:
        self.ms[phase] += ms


class Recorder:
    """Rank 0's TensorBoard writer plus the running history that becomes results.json."""

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.run_dir = run_dir
        self.writer = SummaryWriter(str(run_dir / "tb"))
        self.history: dict[str, list[float]] = defaultdict(list)

    def scalar(self, tag: str, value: float, step: int, keep: bool = True) -> None:
        self.writer.add_scalar(tag, value, step)
        if keep:
            self.history[tag].append(float(value))

    def hparams(self, hparams: dict[str, Any], metrics: dict[str, float]) -> None:
        clean = {k: (v if isinstance(v, int | float | str | bool) else str(v)) for k, v in hparams.items()}
        self.writer.add_hparams(clean, {f"hparam/{k}": v for k, v in metrics.items()}, name="hparams")

    def median(self, tag: str, skip: int = 0) -> float | None:
        values = self.history.get(tag, [])
        values = values[skip:] if len(values) > skip else values
        return statistics.median(values) if values else None

    def close(self) -> None:
        self.writer.close()


def strict_json(value: Any) -> Any:
    """`value` with every NaN / infinite float replaced by None: json.dump would write bare NaN
    and Infinity, which are not JSON (jq, JavaScript and strict parsers refuse the file)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write then rename: a reader never sees a half-written file. Strict JSON (non-finite: null)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(strict_json(data), f, indent=2, default=str, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
