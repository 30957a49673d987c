"""The player of `net.trace`: a local job's links replayed from a trace (compbench.network.trace) while
it runs.

`traced(...)` (compbench.launch.processes.spawn_workers) makes the job's links, `TracedLinks`: a
namespace per worker joined to a switch by a veth shaped both ways, as net.emulate_rank_gbps makes
them (compbench.network.netem.RankLinks), and, where the trace ever delays or drops packets,
routed through compbench's delay line (compbench.network.delay), whatever the kernel has: the line
changes a link's delay and loss in place, one path on every machine. They start at the trace's
settings at t = 0; the clock starts as the workers are started, and a thread applies each change
at its time:

- the rate: the HTB class of both ends of the rank's veth changed in place (`tc class change`,
  compbench.network.netem.change_rate): its queue stays, nothing is dropped;
- the one-way delay and loss: a `set` line to the delay line (compbench.network.delay_line).

The thread runs at the highest CPU priority (nice -20, its own: the launcher's other threads keep
theirs), as the delay line does: a link does not wait for the CPU.

Each applied change is a row of RUN_DIR/trace_applied.csv (`t_s,applied_s,unix_s,rank,mbps,delay_ms,
loss`: the trace's time and the time the change took effect, from the clock's start and as a Unix
time; the t = 0 settings first, at the clock's start, which compbench.report.trace_plot places the
run's records against), and the trace
itself is copied to RUN_DIR/trace.csv, so a run's record says what its links did. After the
trace's last row its settings hold. A change that fails (tc, or the line gone) ends the job with one
line, as a delay line that ends does (`failure`, read by the launcher's watch); the thread stops
and the namespaces and the line go when the job ends, also on failure or Ctrl-C (RankLinks'
clean-up, and compbench.base.leftovers for a SIGKILLed launcher).

The links' TCP buffers are sized for each link's highest rate and delay in the trace (a link's
largest bandwidth-delay product), set when they are made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path

from compbench.network.delay import Impairment, has_tun
from compbench.network.netem import RankLinks, can_shape, change_rate, check_buffer
from compbench.network.trace import Change, LinkState, Trace, load_trace, resolve, shipped

APPLIED_FILE = "trace_applied.csv"
TRACE_FILE = "trace.csv"
APPLIED_HEADER = "t_s,applied_s,unix_s,rank,mbps,delay_ms,loss"


def needs_line(trace: Trace) -> bool:
    """Whether the trace ever delays or drops a packet (its links then go through the delay line)."""
    return any(s.delay_ms or s.loss for states in trace.states for s in states)


# The settings that shape the links a trace shapes (a value other than these defaults is refused)
_SHAPING = {"emulate_gbps": None, "emulate_rank_gbps": None, "emulate_latency_us": 0,
            "emulate_rank_latency_us": None, "emulate_jitter_us": 0, "emulate_loss": 0}


def check(value: object, world: int, net: dict, elastic: bool = False) -> Trace:
    """Config-time check of `net.trace=value` for a job of `world` workers, `net` the job's other net
    settings: the trace itself (compbench.network.trace), that nothing else shapes the links, and
    that this machine can replay it. The checked trace, or ValueError (one line naming net.trace and
    the fix)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"net.trace={value!r} must be a trace's CSV file or a shipped trace's name "
                         f"({', '.join(shipped())})")
    for key, default in _SHAPING.items():
        if net.get(key, default) not in (default, None):
            raise ValueError(f"net.trace and net.{key} both shape the links, and the trace sets each link's "
                             f"rate, delay and loss over time; drop net.{key}")
    if elastic:
        raise ValueError("net.trace with engine.elastic=true: an elastic job's workers share one namespace, "
                         "not a link each; drop net.trace or engine.elastic")
    trace = load_trace(resolve(value), world)
    if not can_shape():
        raise ValueError("net.trace needs root and iproute2 (ip, tc) to shape the links; run as root or drop "
                         "net.trace")
    line = needs_line(trace)
    if line and net.get("delay_line", "auto") == "netem":
        raise ValueError("net.trace: a trace's delay and loss change through compbench's delay line, not "
                         "netem; set net.delay_line=auto or line")
    if line and not has_tun():
        raise ValueError(f"net.trace={value} delays or drops packets, which needs /dev/net/tun (compbench's "
                         "delay line); this machine has none: use a trace with delay_ms and loss 0")
    top = [trace.max_state(k) for k in range(world)]
    farthest = max(s.delay_ms for s in top)
    for k, s in enumerate(top):  # each link's largest rate with its longest round trip to a peer
        check_buffer(f"net.trace={value}: rank {k}'s link", s.mbps / 1000, 2 * (s.delay_ms + farthest) * 1000,
                     "lower its rate or delay")
    return trace


class TracedLinks(RankLinks):
    """A job's links, a link per worker, replaying `trace` (see the module). A context manager, as
    RankLinks: made at the trace's t = 0 settings on enter; `start_clock()` starts the replay; deleted,
    the replay stopped first, on exit whatever happened. `log`: the file each applied change is
    written to (None: kept in `applied` only)."""

    def __init__(self, trace: Trace, seed: int = 0, log: Path | None = None) -> None:
        top = [trace.max_state(k) for k in range(trace.world)]
        line = needs_line(trace)
        # Made at each link's highest rate and delay: join_switch sizes the TCP buffers from them; the
        # t = 0 settings are applied at once (_build).
        super().__init__([s.mbps / 1000 for s in top], line=Impairment(seed=seed) if line else None,
                         rank_latency_us=[s.delay_ms * 1000 for s in top], through_line=line)
        self.trace, self.log = trace, log
        self.now = [trace.at(0, k) for k in range(trace.world)]
        self.applied: list[tuple[Change, float]] = []  # each change after t = 0 and when it took effect
        self.error: str | None = None
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.t0 = self.t0_unix = 0.0

    def _build(self) -> None:
        super()._build()
        for k in range(self.trace.world):
            self._set(k, self.trace.at(0, k), first=True)
        if self.log is not None:
            self.log.write_text(APPLIED_HEADER + "\n")

    def _set(self, rank: int, state: LinkState, first: bool = False) -> None:
        """Rank `rank`'s link from now on: its rate both ways, its delay and loss through the line."""
        before = self.now[rank]
        if first or state.mbps != before.mbps:
            for namespace, device in ((self.names[rank], "eth0"), (self.switch, f"v{rank}")):
                change_rate(namespace, device, state.mbps / 1000)
        moved = (state.delay_ms, state.loss) != (before.delay_ms, before.loss)
        if self.line is not None and (first or moved):
            self.line.set(self.address(rank), state.delay_ms * 1000, state.loss)
        self.now[rank] = state

    def start_clock(self) -> None:
        """t = 0 of the trace (the workers start now): the replay's thread starts."""
        self.t0, self.t0_unix = time.monotonic(), time.time()
        for change in self.trace.changes():
            if change.t_s == 0:  # applied when the links were made: in effect from the clock's start
                self._log(change, 0.0)
        self.thread = threading.Thread(target=self._play, name="trace-player", daemon=True)
        self.thread.start()

    def _play(self) -> None:
        later = [c for c in self.trace.changes() if c.t_s > 0]
        # This thread (and the tc it starts) first on the cores, as the delay line is: a change that waits
        # for the CPU behind the job's workers comes late (seconds, at 10 runnable tasks a core here).
        # Linux gives each thread a priority of its own, and a child inherits its thread's.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -20)
        try:
            for t_s, changes in groupby(later, key=lambda c: c.t_s):
                if self.stopped.wait(max(0.0, self.t0 + t_s - time.monotonic())):
                    return
                for change in changes:
                    self._set(change.rank, change.state)
                    self._record(change, time.monotonic() - self.t0)
        except (RuntimeError, OSError) as e:  # tc refused, or the line is gone: the job cannot go on
            self.error = f"net.trace: a change of the links failed ({e}); the job was stopped"

    def _record(self, change: Change, applied_s: float) -> None:
        self.applied.append((change, applied_s))
        self._log(change, applied_s)

    def _log(self, change: Change, applied_s: float) -> None:
        if self.log is not None:
            s = change.state
            with self.log.open("a") as f:
                f.write(f"{change.t_s:g},{applied_s:.4f},{self.t0_unix + applied_s:.4f},{change.rank},"
                        f"{s.mbps:g},{s.delay_ms:g},{s.loss:g}\n")

    def failure(self) -> str | None:
        return super().failure() or self.error

    def delete(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        super().delete()

    def latest_s(self) -> float:
        """How late the latest-applied change took effect after its time (0 without changes)."""
        return max((applied - change.t_s for change, applied in self.applied), default=0.0)


@contextlib.contextmanager
def traced(value: str, world: int, seed: int = 0, run_dir: Path | None = None) -> Iterator[TracedLinks]:
    """`with traced(net.trace, engine.np, seed, RUN_DIR) as links:` the job's links replaying the trace
    (checked at compose time), its clock started on entry: start the workers at once. Says what it
    replays on entry and what it applied on exit; writes RUN_DIR/trace.csv and trace_applied.csv."""
    path = resolve(value)
    trace = load_trace(path, world)
    if run_dir is not None:
        shutil.copyfile(path, run_dir / TRACE_FILE)
    log = run_dir / APPLIED_FILE if run_dir is not None else None
    with TracedLinks(trace, seed, log) as links:
        later = sum(1 for c in trace.changes() if c.t_s > 0)
        first = ", ".join(f"rank {k} {links.now[k].mbps:g}" for k in range(world))
        how = ", delay and loss through compbench's delay line" if links.line is not None else ""
        print(f"compbench: net.trace={value}: a link per worker replayed from the trace ({first} Mbit/s at "
              f"t=0; {later} change(s) of a rank's link over {trace.duration_s:g} s, then its last row holds "
              f"for the rest of the run{how}; network namespaces {links.switch} and its ranks')", flush=True)
        links.start_clock()
        try:
            yield links
        finally:
            links.delete()  # the replay stops before the summary: no change after it
            print(f"compbench: net.trace: {len(links.applied)} of {later} change(s) applied, the latest "
                  f"{links.latest_s() * 1000:.0f} ms after its time"
                  + (f" (logged in {log})" if log is not None else ""), flush=True)
