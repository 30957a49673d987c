"""A delay line in user space, for kernels without netem: `python -m compbench.network.delay_line
--tun DEV --delay ADDR=US ... [--jitter-us J] [--loss P] [--seed S]`, run inside the namespace that
holds the TUN device DEV (a job's switch, compbench.network.netem). The switch's policy routing sends
every packet between two hosts through DEV; the line reads it, holds it for the one-way delay of
the sender's link plus the receiver's (`--delay ADDR=US`, microseconds, per host address), and writes
it back, and the switch's routes deliver it to the receiver's port, where tc's rate shaping applies
as without the line.

Jitter: each packet's delay is drawn uniformly from [d - J, d + J] (J <= d), and a packet never
leaves before the one before it between the same two hosts (its release is at least that one's), so
order holds, as on a link: a packet behind a late one waits for it. Loss: each packet is dropped with
probability P, independently (a seeded generator). Packets other than IPv4 are passed on at once.

Written in Python: with the switch's MTU at 64 KiB a link at 1 Gbit/s carries ~2,000 packets a second
(plus TCP's acknowledgements), which costs the line a quarter of a core per Gbit/s here
(docs/results.md, measured by scripts/delay_line_fidelity.py); a line in C would cost less, and is
not needed while the job's links carry a few hundred Mbit/s. The timer slack is set to 1 ns so that
a wake-up is not rounded up by 50 us, and the line measures how late it wakes (on a virtual machine,
tens of microseconds): a packet that woke it has waited that long already, so its hold is shorter
by as much (without that, a round trip at 0.1 ms each way came out 60-95 us long). It runs at the
highest CPU priority (nice -20), as a link's hardware would not wait for the CPU. It prints "ready"
once the device is open, and exits when its standard input closes (the parent is gone;
`--detached`: never, a cluster's line is killed with the cluster's namespaces), on SIGTERM, or on an
error, with one line.

Its standard input also carries changes of a host's link while it runs (a trace replayed,
compbench.network.trace_player), a line each: `set ADDR US LOSS`, from the next packet on that
host's one-way delay in microseconds and its link's loss rate (a packet between hosts i and j is
lost with 1 - (1 - P)(1 - Li)(1 - Lj), P the line's `--loss`). A packet already held keeps its
release time, and none overtakes one held before it between the same two hosts: when the delay
falls, what the longer delay holds drains first, as a link's queue would.
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import os
import random
import select
import signal
import sys
import time

import pytun

_PR_SET_TIMERSLACK = 29
_BATCH = 64  # packets read per wake-up at most (then the due ones are written)
_SPIN_S = 100e-6  # the line sleeps until this long before a release, then spins


def open_tun(name: str) -> pytun.TunTapDevice:
    """The existing TUN device `name` (made by `ip tuntap add`, with the switch's routes through it),
    attached without packet information and made non-blocking: the line reads until it is empty."""
    device = pytun.TunTapDevice(name=name, flags=pytun.IFF_TUN | pytun.IFF_NO_PI)
    os.set_blocking(device.fileno(), False)
    return device


def parse_delays(items: list[str]) -> dict[bytes, float]:
    """`ADDR=US` items -> packed IPv4 address -> one-way delay in seconds."""
    import socket

    delays = {}
    for item in items:
        address, _, us = item.partition("=")
        delays[socket.inet_aton(address)] = float(us) / 1e6
    return delays


class Line:
    """The packets held, in release order; `hold` takes one in, `due` gives those whose time came."""

    def __init__(self, delays: dict[bytes, float], jitter_s: float = 0.0, loss: float = 0.0, seed: int = 0):
        self.delays, self.jitter_s, self.loss = delays, jitter_s, loss
        self.losses: dict[bytes, float] = {}  # each host's link's own loss rate (`set`)
        self.random = random.Random(seed)
        self.held: list[tuple[float, int, bytes]] = []
        self.last: dict[tuple[bytes, bytes], float] = {}  # the latest release between two hosts
        self.count = 0

    def hold(self, packet: bytes, now: float) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:  # not IPv4: on at once
            release = now
        else:
            src, dst = packet[12:16], packet[16:20]
            lost = self.loss if not self.losses else (
                1 - (1 - self.loss) * (1 - self.losses.get(src, 0.0)) * (1 - self.losses.get(dst, 0.0)))
            if lost and self.random.random() < lost:
                return
            delay = self.delays.get(src, 0.0) + self.delays.get(dst, 0.0)
            if self.jitter_s:
                delay = max(0.0, delay + self.random.uniform(-self.jitter_s, self.jitter_s))
            release = max(now + delay, self.last.get((src, dst), 0.0))
            self.last[(src, dst)] = release
        self.count += 1
        heapq.heappush(self.held, (release, self.count, packet))

    def apply(self, command: str) -> None:
        """Apply one `set ADDR US LOSS` line: host ADDR's one-way delay and its link's loss rate from now
        on (ValueError for anything else)."""
        import socket

        word, address, us, loss = command.split()
        if word != "set":
            raise ValueError(f"unknown command {command!r} (expected: set ADDR US LOSS)")
        host = socket.inet_aton(address)
        self.delays[host], self.losses[host] = float(us) / 1e6, float(loss)

    def due(self, now: float) -> list[bytes]:
        out = []
        while self.held and self.held[0][0] <= now:
            out.append(heapq.heappop(self.held)[2])
        return out

    def next_release(self) -> float | None:
        return self.held[0][0] if self.held else None


def wake_latency_s(samples: int = 50, sleep_s: float = 200e-6) -> float:
    """How late this process wakes from a short sleep (median of `samples` timed sleeps): on a virtual
    machine tens of microseconds, which a packet that wakes the line has waited already."""
    late = []
    for _ in range(samples):
        t = time.monotonic()
        select.select([], [], [], sleep_s)
        late.append(time.monotonic() - t - sleep_s)
    return max(0.0, sorted(late)[len(late) // 2])


def run(fd: int, line: Line, stop_fd: int | None, wake_s: float = 0.0) -> None:
    """Move packets until `stop_fd` (standard input) reaches its end (None: until killed), applying the
    `set` commands it carries. The line sleeps until _SPIN_S before the next release, then spins;
    packets read on waking from a sleep arrived about `wake_s` earlier (its wake-up latency), and are
    held from then."""
    watched = [fd] if stop_fd is None else [fd, stop_fd]
    pending = b""  # the start of a command not yet ended by its newline
    while True:
        now = time.monotonic()
        nxt = line.next_release()
        timeout = None if nxt is None else max(0.0, nxt - now - _SPIN_S)
        ready, _, _ = select.select(watched, [], [], timeout)
        if not ready and nxt is not None:  # the last stretch awake: a wake-up can be late by ~60 us
            while time.monotonic() < nxt:
                pass
        if stop_fd is not None and stop_fd in ready:
            given = os.read(stop_fd, 4096)
            if not given:
                return
            pending += given
            while b"\n" in pending:  # whole commands only: a write may arrive in pieces
                command, _, pending = pending.partition(b"\n")
                line.apply(command.decode())
        woke = time.monotonic()
        if fd in ready:
            # a packet that woke the line (it slept more than its wake-up cost) came in before
            arrived = woke - wake_s if woke - now > wake_s else woke
            for _ in range(_BATCH):
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                line.hold(packet, arrived)
        for packet in line.due(time.monotonic()):
            try:
                os.write(fd, packet)
            except BlockingIOError:  # the device's queue is full: a drop, as a full link queue's
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compbench.network.delay_line", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tun", required=True)
    parser.add_argument("--delay", action="append", default=[], metavar="ADDR=US")
    parser.add_argument("--jitter-us", type=float, default=0.0)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--detached", action="store_true",
                        help="run until killed, not until standard input ends (a cluster's line, which "
                             "outlives the command that made it)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    # the line stands for the network's hardware: no worker or other work on the cores delays a packet
    os.setpriority(os.PRIO_PROCESS, 0, -20)
    try:
        device = open_tun(args.tun)
    except (OSError, pytun.Error) as e:
        print(f"error: delay line: cannot open TUN device {args.tun}: {e}", file=sys.stderr, flush=True)
        return 1
    wake_s = wake_latency_s()
    print("ready", flush=True)
    line = Line(parse_delays(args.delay), args.jitter_us / 1e6, args.loss, args.seed)
    run(device.fileno(), line, None if args.detached else sys.stdin.fileno(), wake_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
