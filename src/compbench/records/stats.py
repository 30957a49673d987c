"""A step's statistics: phase times and bytes on the wire, filled by the pipeline, communicators,
synchronizers and optimizers that exchange, and read by the trainer's recorder (compbench.train.metrics).
Outside train/ so that the components that book into it need nothing of the trainer."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

# Booked again as `comm_exposed` while an exposed span is open (the step waits for them).
_EXPOSABLE = ("comm", "decompress")


class Clock(Protocol):
    """Where phase edges are stamped: `mark()` now, `elapsed_ms(a, b)` between two marks (read once
    the step is over: a GPU clock's marks complete asynchronously)."""

    def mark(self) -> Any: ...
    def elapsed_ms(self, a: Any, b: Any) -> float: ...
    def settle(self, last: Any) -> None:
        """Wait until mark `last` (and every earlier one) can be read."""
        ...
    def recycle(self) -> None:
        """The marks handed out so far will not be read again (a new step begins): a clock may
        reuse them."""
        ...


class HostClock:
    """The host's clock: right for the CPU, whose work is done when the call returns."""

    def mark(self) -> float:
        return time.perf_counter()

    def elapsed_ms(self, a: float, b: float) -> float:
        return (b - a) * 1e3

    def settle(self, last: float) -> None:
        pass

    def recycle(self) -> None:
        pass


class SyncClock(HostClock):
    """The host's clock after waiting for the GPU at every edge (`timing=sync`): exact, and it
    serializes the host with the device (no overlap of launches with work)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> float:
        torch.cuda.synchronize(self.device)
        return time.perf_counter()


class EventClock:
    """CUDA events on the current stream (`timing=events`, the default on a GPU): each edge records
    one, nothing waits until the step's figures are read. A phase is the device's time between the
    work enqueued before its edges; while the host waits with the stream idle (a host collective),
    the next edge is stamped when the host records it, so waits count too. Consecutive phases share
    their edges, so the split adds up to the step.

    The events are pooled: a step has about a thousand edges on ResNet-50, and a new event per edge
    is a driver call to create and one to destroy; `recycle` (each step's `StepStats.reset`, after
    the last step's figures were read) returns every event handed out to the pool, and the next
    marks record them again."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._free: list[torch.cuda.Event] = []  # recorded before the last recycle: free to record again
        self._used: list[torch.cuda.Event] = []  # handed out since

    def mark(self) -> torch.cuda.Event:
        try:
            event = self._free.pop()
        except IndexError:  # the pool grows to the largest step's number of edges
            event = torch.cuda.Event(enable_timing=True)
        self._used.append(event)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def recycle(self) -> None:
        self._free.extend(self._used)
        self._used.clear()

    def elapsed_ms(self, a: torch.cuda.Event, b: torch.cuda.Event) -> float:
        return a.elapsed_time(b)

    def settle(self, last: torch.cuda.Event) -> None:
        last.synchronize()


def clock_for(device: torch.device, timing: str = "events") -> Clock:
    """The clock that tells a phase's time on `device` (`timing`: events or sync; the CPU has one)."""
    if device.type != "cuda":
        return HostClock()
    return EventClock(device) if timing == "events" else SyncClock(device)


class StepStats:
    """Accumulates one step's phase times (ms) and bytes; `reset()` between steps.

    Phases time themselves, exclusively: a phase entered inside another (compression started by a
    backward hook inside `compute`, decoding inside `comm`) pauses the outer phase's clock until it
    ends, so every millisecond is booked to exactly one phase and nothing is recovered by
    subtraction. One clock per step, not per thread: a phase entered on autograd's thread while the
    trainer's thread waits inside backward still pauses `compute`. Spans are marks of the `clock`
    (compbench.records.stats.clock_for: the host's, or CUDA events on a GPU) and turn into milliseconds when
    `ms` is first read after they were booked.

    A span opened `exposed` (the step waits for it) books the communication and decoding inside it
    as `comm_exposed` too. `begin_step`/`end_step` bracket the whole step (`ms["step"]`).

    On the host clock it also books the process's CPU time (every thread's) of the step and of its
    communication, for `unloaded_ms`: what the step would take on a machine nobody else loads.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or HostClock()
        # CPU time tells a CPU step's work apart from the time other work took its cores; a GPU's
        # work is not the host's CPU time: no estimate there.
        on_host = isinstance(self.clock, HostClock) and not isinstance(self.clock, SyncClock)
        self.cpu_time: Callable[[], float] | None = time.process_time if on_host else None
        self.reset()

    def reset(self) -> None:
        """Start a new step: the last step's marks are dropped and its clock may reuse them (read
        the last step's `ms` before)."""
        self.clock.recycle()
        self.bytes_sent = 0
        self.bytes_dense = 0
        # Per path, for the what-if model: bytes that went through the dense fp32 allreduce (of
        # bytes_sent), and how many collectives each path started.
        self.bytes_allreduce = 0
        self.calls_compressed = 0
        self.calls_dense = 0
        # Elements the encodes read at random places (thresholds' uniform samples): the compress
        # floor's second part (compbench.records.floors).
        self.sampled_reads = 0
        self._spans: list[tuple[str, Any, Any]] = []  # (phase, from mark, to mark)
        self._added: dict[str, float] = defaultdict(float)  # milliseconds booked as numbers
        self._open: list[list[Any]] = []  # [phase, since mark, exposed, since CPU s]: the innermost runs
        self._step: tuple[Any, Any] | None = None
        self._ms: defaultdict[str, float] | None = None
        self._cpu_step: list[float] = []  # process CPU seconds at begin_step (and end_step)
        self._cpu_comm = 0.0  # process CPU seconds while communication was the running phase
        # when the step first waited on an exchange (CLOCK_MONOTONIC, which every process of one
        # machine shares: the ranks' arrivals compared tell the wait for the last one, host clock only)
        self.arrived: float | None = None

    def add_dense_allreduce(self, nbytes: int, calls: int) -> None:
        """Book gradient bytes that travelled uncompressed through an allreduce."""
        self.bytes_sent += nbytes
        self.bytes_allreduce += nbytes
        self.calls_dense += calls

    @contextmanager
    def time(self, phase: str, exposed: bool = False) -> Iterator[None]:
        """Time the block as `phase` (less the phases entered inside it)."""
        self.begin(phase, exposed)
        try:
            yield
        finally:
            self.end(phase)

    def begin(self, phase: str, exposed: bool = False) -> None:
        """Start timing `phase` (for spans a `with` cannot hold: between two autograd callbacks)."""
        now, cpu = self.clock.mark(), self._cpu()
        if exposed and self.arrived is None and self.cpu_time is not None:
            self.arrived = time.monotonic()
        if self._open:  # the enclosing phase pauses: book what it has run so far
            self._book(self._open[-1][0], self._open[-1][1], now, cpu - self._open[-1][3])
        self._open.append([phase, now, exposed, cpu])

    def end(self, phase: str) -> None:
        """Stop timing `phase` (the innermost open one); the phase it interrupted resumes."""
        now, cpu = self.clock.mark(), self._cpu()
        name, since, _, cpu_since = self._open[-1]
        assert name == phase, f"phase {phase} ended inside {name}"
        self._book(name, since, now, cpu - cpu_since)
        self._open.pop()
        if self._open:  # the enclosing phase resumes now
            self._open[-1][1], self._open[-1][3] = now, cpu

    def _cpu(self) -> float:
        return self.cpu_time() if self.cpu_time is not None else 0.0

    def _book(self, phase: str, since: Any, now: Any, cpu_s: float) -> None:
        self._spans.append((phase, since, now))
        if phase == "comm":
            self._cpu_comm += cpu_s
        if phase in _EXPOSABLE and any(entry[2] for entry in self._open):
            self._spans.append(("comm_exposed", since, now))
        self._ms = None

    def begin_step(self) -> None:
        self._step = (self.clock.mark(), None)
        self._cpu_step = [self._cpu()]

    def end_step(self) -> None:
        assert self._step is not None, "end_step without begin_step"
        self._step = (self._step[0], self.clock.mark())
        self._cpu_step = [self._cpu_step[0], self._cpu()]
        self._ms = None

    @property
    def comm_cpu_ms(self) -> float | None:
        """The process's CPU time (every thread's) while communication was the running phase: what of
        the communication's wall time was work on this machine's cores (packing payloads, copies,
        the collectives' own threads) rather than waiting (host clock only)."""
        return None if self.cpu_time is None else self._cpu_comm * 1e3

    def unloaded_ms(self, threads: int) -> float | None:
        """The step's time on a machine nobody else loads, estimated (host clock only): its
        communication's wall time (the wire and the peers, which CPU time cannot tell) plus the
        process CPU time of the rest over the `threads` that compute. On an idle machine that is the
        step's wall time where the compute keeps its threads busy; on a loaded one the wall time
        grows by what other work took of the cores and the CPU time does not."""
        if self.cpu_time is None or len(self._cpu_step) != 2:
            return None
        rest_cpu_ms = ((self._cpu_step[1] - self._cpu_step[0]) - self._cpu_comm) * 1e3
        return self.ms["comm"] + max(0.0, rest_cpu_ms) / max(1, threads)

    def add_ms(self, phase: str, ms: float) -> None:
        """Book milliseconds measured elsewhere (a host-side wait) to `phase`."""
        self._added[phase] += ms
        self._ms = None

    @property
    def ms(self) -> defaultdict[str, float]:
        """Milliseconds per phase booked so far (and `step` once `end_step` ran); reading it waits
        for the clock's marks (a GPU's events) once per step."""
        if self._ms is None:
            marks = [b for _, _, b in self._spans]
            if self._step is not None and self._step[1] is not None:
                marks.append(self._step[1])
            if marks:
                self.clock.settle(marks[-1])
            ms: defaultdict[str, float] = defaultdict(float, self._added)
            for phase, a, b in self._spans:
                ms[phase] += self.clock.elapsed_ms(a, b)
            if self._step is not None and self._step[1] is not None:
                ms["step"] += self.clock.elapsed_ms(*self._step)
            self._ms = ms
        return self._ms
