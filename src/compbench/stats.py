"""A step's statistics: phase times and bytes on the wire, filled by the pipeline, communicators,
synchronizers and optimizers that exchange, and read by the trainer's recorder (compbench.train.metrics).
Outside train/ so that the components that book into it need nothing of the trainer."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class StepStats:
    """Accumulates one step's phase times (ms) and bytes; `reset()` between steps.

    Phases time themselves, exclusively: a phase entered inside another (compression started by a
    backward hook inside `compute`, decoding inside `comm`) pauses the outer phase's clock until it
    ends, so every millisecond is booked to exactly one phase and nothing is recovered by
    subtraction. One clock per step, not per thread: a phase entered on autograd's thread while the
    trainer's thread waits inside backward still pauses `compute`.
    """

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
        self._open: list[list[Any]] = []  # [phase, since, ms run before a pause]: the innermost one runs

    def add_dense_allreduce(self, nbytes: int, calls: int) -> None:
        """Book gradient bytes that travelled uncompressed through an allreduce."""
        self.bytes_sent += nbytes
        self.bytes_allreduce += nbytes
        self.calls_dense += calls

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        """Time the block as `phase` (less the phases entered inside it)."""
        self.begin(phase)
        try:
            yield
        finally:
            self.end(phase)

    def begin(self, phase: str) -> None:
        """Start timing `phase` (for spans a `with` cannot hold: between two autograd callbacks)."""
        now = time.perf_counter()
        if self._open:  # the enclosing phase pauses: book what it has run so far
            outer = self._open[-1]
            outer[2] += (now - outer[1]) * 1e3
        self._open.append([phase, now, 0.0])

    def end(self, phase: str) -> float:
        """Stop timing `phase` (the innermost open one); the phase it interrupted resumes. Returns the
        span's own milliseconds (nested phases left out)."""
        now = time.perf_counter()
        name, since, ran = self._open.pop()
        assert name == phase, f"phase {phase} ended inside {name}"
        ms = ran + (now - since) * 1e3
        self.ms[phase] += ms
        if self._open:  # the enclosing phase resumes now
            self._open[-1][1] = now
        return ms

    def add_ms(self, phase: str, ms: float) -> None:
        self.ms[phase] += ms
