"""A step's statistics: phase times and bytes on the wire, filled by the pipeline, communicators,
synchronizers and optimizers that exchange, and read by the trainer's recorder (compbench.train.metrics).
Outside train/ so that the components that book into it need nothing of the trainer."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


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
        # Elements the encodes read at random places (thresholds' uniform samples): the compress
        # floor's second part (compbench.floors).
        self.sampled_reads = 0

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
