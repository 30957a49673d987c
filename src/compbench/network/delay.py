"""Delay on a job's links: the kernel's netem qdisc where this machine has it, else compbench's delay
line in user space (compbench.network.delay_line), chosen by `net.delay_line=auto|netem|line`.

The line lives in the job's switch namespace (compbench.network.netem.RankLinks, routed rather than
bridged): a TUN device `dl0` and policy routing that sends every packet arriving from a worker's port
through it (`iif vK lookup 100`, table 100: `default dev dl0`), while what the line writes back takes
the main table to the receiver's port (`iif dl0 lookup main`). Each host's link carries half of the
one-way delay, so that a packet between two workers is held for `net.emulate_latency_us` in all, as
netem on the sender's link holds it. Only the job's own namespaces are touched.

The line attaches to its TUN device through python-pytun; the namespaces, links, qdiscs, routes and
rules are made with iproute2 (`ip`, `tc`), as every shaped link of compbench is: one tool for the
whole of a link's plumbing, each step a command one can run by hand to look at a job's network.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from compbench.base.values import show

LINE_DEVICE = "dl0"
LINE_MTU = 65000  # the links of a job through the line: few large packets (its cost is per packet)
LINE_TABLE = "100"
_READY_S = 20.0  # the line's start-up: a Python interpreter, in a namespace
MODES = ("auto", "netem", "line")


@cache
def has_netem() -> bool:
    """Whether the kernel takes a netem qdisc (tried on the loopback of a scratch namespace, which
    this process's reaper removes if the process is killed meanwhile)."""
    from compbench.base.leftovers import guard

    guard()
    name = f"compbench-{os.getpid()}-probe"
    try:
        subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    try:
        proc = subprocess.run(["tc", "-n", name, "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                               "1ms"], capture_output=True)
        return proc.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def has_tun() -> bool:
    return Path("/dev/net/tun").exists()


# The largest loss rate a job survives: TCP backs off its retransmissions exponentially, and at 0.3 a
# 2-worker job's first exchange outlasted gloo's 30 s time-out here (aborted); at 0.2 it trained (3
# steps in 63 s instead of ~20).
LOSS_MAX = 0.2


@dataclass(frozen=True)
class Impairment:
    """What a job's links add to their rate: a one-way delay between two workers (or, `rank_latency_us`,
    one per worker's link: a packet between workers i and j waits Di + Dj), its jitter (each packet's
    delay uniform in [D - J, D + J], order kept), a loss rate, and what makes them (`mode`:
    net.delay_line; `seed`: the line's draws)."""

    latency_us: float = 0.0
    jitter_us: float = 0.0
    loss: float = 0.0
    mode: str = "auto"
    seed: int = 0
    rank_latency_us: tuple[float, ...] = ()

    @property
    def shortest_us(self) -> float:
        """The shortest one-way delay between two workers."""
        if self.rank_latency_us:
            two = sorted(self.rank_latency_us)[:2]
            return float(sum(two)) if len(two) == 2 else 0.0
        return self.latency_us

    @property
    def line(self) -> bool:
        """Whether compbench's delay line makes it: forced, or (auto) where the kernel has no netem, and
        for jitter and loss always (netem's jitter reorders packets)."""
        if not (self.latency_us or any(self.rank_latency_us) or self.loss):
            return False
        return self.mode == "line" or (self.mode == "auto" and (bool(self.jitter_us or self.loss)
                                                                  or not has_netem()))


def check(impairment: Impairment) -> None:
    """Config-time check of net.delay_line, net.emulate_jitter_us and net.emulate_loss against the delay
    and what this machine has (ValueError naming the fix)."""
    i = impairment
    if i.mode not in MODES:
        raise ValueError(f"net.delay_line={show(i.mode)} must be one of {', '.join(MODES)} (auto: netem "
                         "where the kernel has it, else compbench's delay line)")
    jitter = i.jitter_us
    if isinstance(jitter, bool) or not isinstance(jitter, int | float) or not 0 <= jitter <= i.shortest_us:
        within = (f"the shortest delay between two workers, {i.shortest_us:g} us" if i.rank_latency_us
                  else f"net.emulate_latency_us={i.latency_us:g}")
        raise ValueError(f"net.emulate_jitter_us={show(jitter)} must be within [0, {within}]: packets keep "
                         "their order, so a delay varies by at most itself")
    if isinstance(i.loss, bool) or not isinstance(i.loss, int | float) or not 0 <= i.loss <= LOSS_MAX:
        raise ValueError(f"net.emulate_loss={show(i.loss)} must be a rate in [0, {LOSS_MAX:g}], e.g. "
                         "net.emulate_loss=0.01 (above it TCP's retransmissions back off until gloo's 30 s "
                         "time-out ends the job: 0.3 did here)")
    if not (i.latency_us or any(i.rank_latency_us) or i.loss):
        return
    if i.mode == "netem" and (jitter or i.loss):
        raise ValueError("net.emulate_jitter_us and net.emulate_loss come from compbench's delay line "
                         "(netem's jitter reorders packets); set net.delay_line=auto or line")
    if i.mode == "netem" and not has_netem():
        raise ValueError("net.delay_line=netem: this kernel has no netem qdisc (sch_netem); use "
                         "net.delay_line=auto or line (compbench's delay line in user space)")
    if i.line and not has_tun():
        raise ValueError("net.emulate_latency_us needs netem or /dev/net/tun (compbench's delay line); this "
                         "machine has neither: drop net.emulate_latency_us")


def from_config(net: Any, seed: int = 0) -> Impairment:
    """The job's impairment from its `net` config (checked by `check`)."""
    def given(key: str) -> Any:  # null is 0; a falsy value of another type is checked, not dropped
        value = net.get(key)
        return 0 if value is None else value

    rank = net.get("emulate_rank_latency_us")
    return Impairment(float(given("emulate_latency_us")), given("emulate_jitter_us"), given("emulate_loss"),
                      net.get("delay_line", "auto"), seed, tuple(float(d) for d in rank or ()))


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")


class DelayLine:
    """The line of switch namespace `switch`: its TUN device, routes and process (started by
    `start`, stopped by `stop`). `delays_us` is each host address's one-way delay in microseconds
    (a packet between two hosts is held for the sum of theirs); `ports` the switch's ports towards
    the hosts, whose arrivals go through the line. `detached`: the process outlives this one (an
    emulated cluster's, killed with the cluster's namespaces); otherwise it ends with this one."""

    def __init__(self, switch: str, ports: list[str], delays_us: dict[str, float], jitter_us: float = 0.0,
                 loss: float = 0.0, seed: int = 0, detached: bool = False) -> None:
        self.switch, self.ports, self.delays_us = switch, ports, delays_us
        self.jitter_us, self.loss, self.seed, self.detached = jitter_us, loss, seed, detached
        self.process: subprocess.Popen | None = None
        self.stopping = False
        self.writing = threading.Lock()  # `set` (a trace's player thread) against `stop`

    def start(self) -> None:
        ns = ["-n", self.switch]
        _run("ip", *ns, "tuntap", "add", "dev", LINE_DEVICE, "mode", "tun")
        _run("ip", *ns, "link", "set", LINE_DEVICE, "mtu", str(LINE_MTU), "up")
        _run("ip", *ns, "route", "add", "default", "dev", LINE_DEVICE, "table", LINE_TABLE)
        _run("ip", *ns, "rule", "add", "iif", LINE_DEVICE, "lookup", "main", "priority", "100")
        for k, port in enumerate(self.ports):
            _run("ip", *ns, "rule", "add", "iif", port, "lookup", LINE_TABLE, "priority", str(200 + k))
        # rp_filter would drop what comes back from dl0 with a source routed elsewhere
        _run("ip", "netns", "exec", self.switch, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0",
             f"net.ipv4.conf.{LINE_DEVICE}.rp_filter=0")
        argv = [sys.executable, "-m", "compbench.network.delay_line", "--tun", LINE_DEVICE,
                *(f"--delay={address}={us:g}" for address, us in self.delays_us.items()),
                f"--jitter-us={self.jitter_us:g}", f"--loss={self.loss:g}", f"--seed={self.seed}",
                *(["--detached"] if self.detached else [])]
        self.process = subprocess.Popen(["ip", "netns", "exec", self.switch, *argv],
                                        stdin=subprocess.DEVNULL if self.detached else subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        ready = self._first_line()
        if ready != "ready":
            err = self.process.stderr.read().strip() if self.process.stderr else ""  # it has ended
            self.stop()
            raise RuntimeError(f"the delay line did not start: {err or ready or 'no output'}")
        if self.detached:  # it lives on its own now: nothing of it stays with this process
            for stream in (self.process.stdout, self.process.stderr):
                if stream:
                    stream.close()
            self.process = None

    def _first_line(self) -> str:
        """The line's first line of output, or '' when it ends or stays silent for _READY_S."""
        box: dict[str, str] = {}
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        reader = threading.Thread(target=lambda: box.update(line=stdout.readline().strip()), daemon=True)
        reader.start()
        reader.join(_READY_S)
        return box.get("line", "")

    def set(self, address: str, delay_us: float, loss: float) -> None:
        """From now on, host `address`'s one-way delay and its link's loss rate (a `set` line on the
        line's standard input, compbench.network.delay_line). RuntimeError when the line is not running."""
        with self.writing:  # one command at a time, never after stop() closed the input
            stdin = self.process.stdin if self.process is not None else None
            if stdin is None or stdin.closed:
                raise RuntimeError(f"the delay line of {self.switch} is not running: its link cannot change")
            stdin.write(f"set {address} {delay_us:.3f} {loss:.6g}\n")
            stdin.flush()

    def failure(self) -> str | None:
        """Why the job cannot go on (the line ended by itself), or None while it runs."""
        if self.process is None or self.stopping or self.process.poll() is None:
            return None
        err = self.process.stderr.read().strip().splitlines() if self.process.stderr else []
        return (f"the delay line of {self.switch} ended (exit {self.process.returncode}"
                + (f": {err[-1]}" if err else "") + "); the job's packets had nowhere to go")

    def stop(self) -> None:
        """End the process (closing its input ends it; a kill if it does not). The device and routes go
        with the switch's namespace."""
        self.stopping = True
        if self.process is None:
            return
        try:
            if self.process.stdin:
                with self.writing:
                    self.process.stdin.close()
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream:
                stream.close()
        self.process = None
