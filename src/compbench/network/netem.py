"""A shaped link on one machine: `net.emulate_gbps=G` runs a local job's workers in a private
network namespace whose loopback is rate-limited with tc, so one machine shows what a slow network
does to a run.

Everything a local job sends goes through the namespace's own `lo` (only device there), and every
byte crosses it once (egress of lo), so the rate is `workers x G`: when every rank sends as much
as it receives (allreduce, allgather, all-to-all) each rank sees G Gbit/s, as on a switched
network with one G link per worker. A job that funnels into one rank (a parameter server on rank
0) is optimistic: a real link of the busiest rank would be the bottleneck, here the pooled rate is.

`net.emulate_rank_gbps=[G0, G1, ...]` gives each worker a link of its own instead (heterogeneous
bandwidth, `RankLinks`): a namespace per worker, each joined to a switch by a veth shaped to its
rate both ways, as `compbench cluster` joins its nodes; with `net.emulate_rank_latency_us=[D0, D1,
...]` each link delays its packets too, so that a packet between workers i and j waits Di + Dj (a
worker far away from the others).

Only the private namespaces are touched: the machine's own loopback and interfaces never are. The
namespaces (`compbench-<pid>-<hex>[-sw|-rK]`) are deleted when the job ends, also on failure or Ctrl-C;
those of a compbench process that was SIGKILLed by its reaper (compbench.base.reaper) at once, or
else by the next run or `compbench clean` (compbench.base.leftovers).
Needs root and iproute2 (`ip`, `tc`); `net.emulate_latency_us` needs the kernel's netem qdisc or
/dev/net/tun for compbench's delay line (compbench.network.delay), which then runs the job on a link
per worker (RankLinks, routed through the line)."""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self, TypeVar

from compbench.base.values import show
from compbench.network.delay import LINE_MTU, DelayLine, Impairment

_PREFIX = "compbench"
# a job's namespace, its rank links', or the netem probe's (compbench.network.delay.has_netem)
_NAME = re.compile(rf"^{_PREFIX}-(\d+)-(?:[0-9a-f]{{6}}(?:-sw|-r\d+)?|probe)$")
RANK_SUBNET = "10.213.8"  # the rank links' addresses, inside a job's own namespaces only
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NAME` shows NETNS_ETC/NAME/hosts as /etc/hosts
_CLONE_NEWNET = 0x40000000
T = TypeVar("T")


# What a shaped link may be set to (net.emulate_*, `compbench cluster --gbps/--latency-us`): below
# 1 Mbit/s one 64 KiB loopback packet takes half a second and a job's collectives time out; above
# 1 Tbit/s the link is not what limits anything here. The one-way delay is kept within 250 ms (a
# round trip of half a second, beyond the farthest link on Earth): a 3-step job at 250 ms took 114 s
# here, and at 1 s its start-up's many round trips outlast gloo's and Horovod's 30 s time-outs (the
# job hung).
RATE_GBPS = (0.001, 1000.0)
DELAY_US = (0.0, 250_000.0)


def _named(key: str, value: object) -> str:
    return f"{key} {value}" if key.startswith("--") else f"{key}={show(value)}"


def check_rate(key: str, gbps: object, null: str = "") -> float:
    """`gbps` as a float, or ValueError: a finite number of Gbit/s within RATE_GBPS (not NaN, not 0)."""
    low, high = RATE_GBPS
    if isinstance(gbps, bool) or not isinstance(gbps, int | float) or not low <= gbps <= high:
        raise ValueError(f"{_named(key, gbps)} must be a number of Gbit/s > 0 within [{low:g}, {high:g}]"
                         + (f" ({null})" if null else ""))
    return float(gbps)


def check_delay(key: str, latency_us: object) -> float:
    """`latency_us` as a float, or ValueError: a finite one-way delay within DELAY_US (not NaN)."""
    low, high = DELAY_US
    value: float = math.nan  # what is not a number is out of range, as NaN is
    if isinstance(latency_us, int | float) and not isinstance(latency_us, bool):
        value = latency_us
    if not low <= value <= high:
        raise ValueError(f"{_named(key, latency_us)} must be >= 0 microseconds, at most {high:g} (250 ms: "
                         "beyond it a job's start-up outlasts gloo's time-outs)")
    return float(value)


def check(gbps: float | None, latency_us: float | None = 0, rank_gbps: object = None, np: int = 1,
          rank_latency_us: object = None) -> None:
    """Config-time check of `net.emulate_gbps`, `net.emulate_rank_gbps`, `net.emulate_latency_us` and
    `net.emulate_rank_latency_us` (ValueError naming the fix)."""
    if rank_latency_us is not None:
        if rank_gbps is None:
            raise ValueError("net.emulate_rank_latency_us is the delay of each worker's own link; set "
                             f"net.emulate_rank_gbps=[{','.join(['1'] * np)}] too (a link per worker)")
        for rank, delay in enumerate(_per_worker("net.emulate_rank_latency_us", rank_latency_us, np,
                                                 "one-way delays in microseconds", "500")):
            check_delay(f"net.emulate_rank_latency_us[{rank}]", delay)
        if latency_us:
            raise ValueError("net.emulate_latency_us (one delay between any two workers) and "
                             "net.emulate_rank_latency_us (a delay per worker's link) are two ways to delay "
                             "the links; set one of them")
    if gbps is not None and rank_gbps is not None:
        raise ValueError("net.emulate_gbps (one link rate for every worker) and net.emulate_rank_gbps (a "
                         "rate per worker) are two ways to shape the links; set one of them")
    if rank_gbps is not None:
        rates = _per_worker("net.emulate_rank_gbps", rank_gbps, np, "rates in Gbit/s", "1")
        for rank, rate in enumerate(rates):
            check_rate(f"net.emulate_rank_gbps[{rank}]", rate)
    elif gbps is None:
        if latency_us:
            raise ValueError("net.emulate_latency_us needs net.emulate_gbps too (the shaped link); set it")
        return
    else:
        check_rate("net.emulate_gbps", gbps, "or null: no shaping")
    if latency_us is not None:
        check_delay("net.emulate_latency_us", latency_us)
    if not can_shape():
        key = "net.emulate_gbps" if gbps is not None else "net.emulate_rank_gbps"
        raise ValueError(f"{key} needs root (run as root or drop {key})")


def _per_worker(key: str, values: object, np: int, what: str, example: str) -> list | tuple:
    """`values` as a list of one value per worker, or ValueError naming `key` and an example."""
    if not isinstance(values, list | tuple) or len(values) != np:
        raise ValueError(f"{key}={show(values)} must be a list of {np} {what}, one per worker of "
                         f"engine.np={np}, e.g. {key}=[{','.join([example] * np)}]")
    return values


def can_shape() -> bool:
    """Whether this process may make network namespaces and shape links: root, with iproute2's ip and tc."""
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")


# TCP's largest socket buffers (net.ipv4.tcp_rmem/tcp_wmem, per namespace) are the kernel's defaults
# (6 MB to receive, 4 MB to send) unless a link's bandwidth-delay product needs more: TCP's window is
# about half the receive buffer, and the sender keeps everything unacknowledged, so both get four
# bandwidth-delay products (1 Gbit/s with 50 ms each way: 12.5 MB in flight, 50 MB buffers).
_TCP_BUFFERS = {"tcp_rmem": (4096, 131072, 6291456), "tcp_wmem": (4096, 16384, 4194304)}
_BDP_HEADROOM = 4
# The kernel's largest socket buffer: tcp_rmem/tcp_wmem are C ints (a larger value is refused by
# sysctl). TCP's window is about half the receive buffer, so a link whose bandwidth-delay product is
# above half of this cannot be kept full by one connection: such a link is refused at config time.
SOCKET_BUFFER_MAX = 2**31 - 1
_WINDOW_SHARE = 2


def _in_flight(gbps: float, rtt_us: float) -> float:
    """The bandwidth-delay product in bytes: what a link of `gbps` Gbit/s holds over a round trip."""
    return gbps * 1e9 / 8 * rtt_us / 1e6


def socket_buffer_bytes(gbps: float, rtt_us: float) -> int:
    """The largest socket buffer a link of `gbps` Gbit/s with round trips of `rtt_us` gets:
    _BDP_HEADROOM bandwidth-delay products, never below the defaults, at most SOCKET_BUFFER_MAX."""
    bdp = _in_flight(gbps, rtt_us)
    default = max(top for _, _, top in _TCP_BUFFERS.values())
    return min(SOCKET_BUFFER_MAX, max(default, int(_BDP_HEADROOM * bdp)))


def check_buffer(what: str, gbps: float, rtt_us: float, fix: str) -> None:
    """ValueError (one line: `what`, the limit, `fix`) where a link of `gbps` Gbit/s with round trips
    of `rtt_us` needs a TCP window above the kernel's largest socket buffer allows."""
    bdp = _in_flight(gbps, rtt_us)
    if _WINDOW_SHARE * bdp > SOCKET_BUFFER_MAX:
        most_gbit = SOCKET_BUFFER_MAX / _WINDOW_SHARE * 8 / 1e9  # the largest rate x round trip
        raise ValueError(f"{what}: a link of {gbps:g} Gbit/s with round trips of {rtt_us / 1e3:g} ms holds "
                         f"{bdp / 2**20:.0f} MiB in flight, more than TCP's largest window here (half of the "
                         f"kernel's 2 GiB socket buffer); {fix} (rate x round trip within {most_gbit:.1f} "
                         "Gbit)")


def check_job_links(gbps: float | None, rank_gbps: list | None, np: int, impairment: Impairment) -> None:
    """Config-time check of the links a local job builds from its checked settings (as
    compbench.launch.processes builds them): a shared loopback carries `np` x `gbps` (within
    RATE_GBPS); a link per worker where rates or the delay line ask for one; each within TCP's
    largest window (check_buffer)."""
    if rank_gbps is None and not impairment.line:
        if gbps is None:
            return
        total = gbps * np
        if total > RATE_GBPS[1]:
            raise ValueError(f"net.emulate_gbps={gbps:g} with engine.np={np} shapes one loopback of "
                             f"{total:g} Gbit/s (a link each), above {RATE_GBPS[1]:g}; pass "
                             f"net.emulate_gbps<={RATE_GBPS[1] / np:g}")
        check_buffer(f"net.emulate_gbps={gbps:g}, net.emulate_latency_us={impairment.latency_us:g}", total,
                     2 * impairment.latency_us, "lower either")
        return
    if rank_gbps is not None:
        rates = [float(g) for g in rank_gbps]
    elif gbps is not None:
        rates = [float(gbps)] * np
    else:
        return  # a delay without a rate is refused by `check`
    link_us = list(impairment.rank_latency_us) or [impairment.latency_us / 2] * np
    farthest = max(link_us)
    for k, rate in enumerate(rates):
        what = (f"net.emulate_rank_gbps[{k}]={rate:g} with its delays" if rank_gbps is not None else
                f"net.emulate_gbps={rate:g} with net.emulate_latency_us={impairment.latency_us:g}")
        check_buffer(what, rate, 2 * (link_us[k] + farthest + impairment.jitter_us), "lower either")


def size_socket_buffers(namespace: str, gbps: float, rtt_us: float) -> int:
    """Let TCP in `namespace` fill a link of `gbps` Gbit/s with round trips of `rtt_us`: its largest
    socket buffers at _BDP_HEADROOM bandwidth-delay products (never below the defaults). Returns the
    largest buffer in bytes."""
    largest = 0
    for key, (low, start, top) in _TCP_BUFFERS.items():
        top = max(top, socket_buffer_bytes(gbps, rtt_us))
        largest = max(largest, top)
        _run("ip", "netns", "exec", namespace, "sysctl", "-qw", f"net.ipv4.{key}={low} {start} {top}")
    return largest


def shape_link(namespace: str, device: str, gbps: float, latency_us: float = 0.0,
               latency_key: str = "net.emulate_latency_us") -> None:
    """Rate-limit the egress of `device` in `namespace` to `gbps` Gbit/s, plus a one-way delay
    (`latency_key` names the setting in the error when the kernel has no netem)."""
    ns = ["-n", namespace]
    # HTB rather than TBF: it queues instead of dropping (a drop on loopback stalls TCP for a
    # retransmit timeout).
    _run("tc", *ns, "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default", "1")
    _run("tc", *ns, "class", "add", "dev", device, "parent", "1:", "classid", "1:1", *_htb_rate(gbps))
    if latency_us > 0:
        try:
            _run("tc", *ns, "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:", "netem",
                 "delay", f"{latency_us:g}us", "limit", "100000")
        except RuntimeError as e:
            if "unknown" in str(e).lower():
                raise ValueError(f"{latency_key} needs the kernel's netem qdisc (sch_netem), which this "
                                 f"machine lacks; drop {latency_key}") from None
            raise


def _htb_rate(gbps: float) -> list[str]:
    """The HTB class settings of a link of `gbps` Gbit/s: burst of 1 ms at the rate, at least two
    64 KiB loopback packets, so the timer granularity does not cap high rates."""
    rate, burst = f"{int(gbps * 1e9)}bit", str(max(131072, int(gbps * 1e9 / 8 / 1000)))
    return ["htb", "rate", rate, "ceil", rate, "burst", burst, "cburst", burst, "quantum", "65536"]


def change_rate(namespace: str, device: str, gbps: float) -> None:
    """Set the rate of `device`'s shaped egress in `namespace` (made by shape_link) to `gbps` Gbit/s
    in place: HTB's class changes, its queue stays (no packet is dropped; a trace's player)."""
    _run("tc", "-n", namespace, "class", "change", "dev", device, "parent", "1:", "classid", "1:1",
         *_htb_rate(gbps))


def list_namespaces() -> list[str]:
    """Names of the network namespaces `ip netns` knows (all of them, not only compbench's)."""
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def remove_stale(owner: int | None = None) -> list[str]:
    """Delete compbench namespaces whose creating process is gone (SIGKILLed), or, with `owner`, those
    of that process, after killing what still runs in them; and their /etc/netns entries, also
    those whose namespace went without them. Returns what went ("namespace NAME", "entry PATH").
    Only names of compbench's own pattern are considered."""
    from compbench.base.leftovers import is_stale

    def stale(name: str) -> bool:
        m = _NAME.match(name)
        return m is not None and is_stale(int(m.group(1)), owner)

    removed = []
    for name in filter(stale, list_namespaces()):
        kill_inside(name)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
        removed.append(f"namespace {name}")
    for entry in NETNS_ETC.glob(f"{_PREFIX}-*"):
        if stale(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(f"entry {entry}")
    return removed


def kill_inside(namespace: str) -> None:
    """SIGKILL every process in `namespace` (what a dead run left running there)."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    for pid in pids.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


class _Built:
    """Namespaces made on enter (`_build`) and deleted on exit (`delete`) whatever happened, also when
    the build itself fails half-way."""

    def __enter__(self) -> Self:
        from compbench.base.leftovers import guard
        from compbench.base.leftovers import remove_stale as remove_leftovers

        remove_leftovers()
        guard()  # before the first namespace: a SIGKILL from here on leaves nothing
        try:
            self._build()
        except BaseException:
            self.delete()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def _build(self) -> None:
        raise NotImplementedError

    def delete(self) -> None:
        raise NotImplementedError

    def failure(self) -> str | None:
        """Why the links can no longer carry a job (a delay line that ended), or None."""
        return None


class ShapedNamespace(_Built):
    """A private network namespace whose loopback carries `gbps` Gbit/s in all (plus an optional
    one-way delay), or, with `gbps` None, as fast as this machine's (a place of its own, for
    addresses no one else sees). A context manager: created on enter, deleted on exit whatever happened.

    `prefix` is the argv prefix that runs a command inside (`ip netns exec NAME`); `call(fn)` runs
    `fn` in a thread that has joined the namespace, for sockets the parent itself must open there
    (Horovod's rendezvous server): a socket belongs to the namespace it was created in. A job's
    workers all run here (`prefix_for`), reach each other over `iface` and the rendezvous at `host`.
    """

    iface, host = "lo", "127.0.0.1"
    hosts: tuple[str, ...] = ()  # the workers are on one host

    def __init__(self, gbps: float | None, latency_us: float = 0.0) -> None:
        check(gbps, latency_us)
        self.gbps, self.latency_us = (float(gbps) if gbps is not None else None), float(latency_us or 0)
        self.name = f"{_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.created = False

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def prefix_for(self, rank: int) -> list[str]:
        return self.prefix

    def _build(self) -> None:
        _run("ip", "netns", "add", self.name)
        self.created = True
        _run("ip", "-n", self.name, "link", "set", "lo", "up")
        if self.gbps is not None:
            shape_link(self.name, "lo", self.gbps, self.latency_us)
            size_socket_buffers(self.name, self.gbps, 2 * self.latency_us)

    def add_addresses(self, addresses: list[str]) -> None:
        """Give the namespace's loopback these extra IPv4 addresses (each a host of its own to software
        that tells hosts apart by address, as Horovod Elastic and TorchElastic do)."""
        for address in addresses:
            _run("ip", "-n", self.name, "addr", "add", f"{address}/32", "dev", "lo")

    def delete(self) -> None:
        if self.created:
            subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)
            self.created = False

    def call(self, fn: Callable[[], T]) -> T:
        return call_in(self.name, fn)


class RankLinks(_Built):
    """A link of its own for each worker (net.emulate_rank_gbps: heterogeneous bandwidth): worker k
    runs in namespace `<base>-rk`, reached at RANK_SUBNET.(k+1) over its `eth0`, a veth to a bridge in
    namespace `<base>-sw` shaped to `gbps[k]` Gbit/s both ways (the worker's egress, and the switch's
    port towards it), plus its share of the delay (`latency_us` between any two workers: half on each
    link; or `rank_latency_us`, each link's own). Traffic between two workers crosses the sender's
    link and the receiver's, as on a switched network. A context manager, with ShapedNamespace's placement
    interface (`prefix_for`, `call`, `iface`, `host`: the rendezvous goes in rank 0's namespace).

    Each worker also has a host name of its own (`rk`, in a UTS namespace of its own) that its
    namespace's /etc/hosts resolves to its address: Horovod opens some of its connections at the
    address of the host's name, which would otherwise be the machine's own, on a loopback no peer
    shares."""

    iface = "eth0"

    def __init__(self, gbps: list[float], latency_us: float = 0.0, line: Impairment | None = None,
                 rank_latency_us: list[float] | None = None, through_line: bool = False) -> None:
        self.gbps, self.latency_us = [float(g) for g in gbps], float(latency_us or 0)
        # each link's one-way delay: a packet between two workers crosses two links
        self.link_us = ([float(d) for d in rank_latency_us] if rank_latency_us is not None
                        else [self.latency_us / 2] * len(gbps))
        base = f"{_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch, self.names = f"{base}-sw", [f"{base}-r{k}" for k in range(len(gbps))]
        self.host = self.address(0)
        self.hosts = tuple(self.address(k) for k in range(len(gbps)))  # each worker is a host of its own
        self.made: list[str] = []
        # The delay through compbench's delay line (compbench.network.delay) instead of netem: the
        # switch routes between its ports instead of bridging them, through the line.
        self.line: DelayLine | None = None
        # through_line: through the line even where nothing is delayed yet (a trace delays links later)
        if line is not None and (line.line or through_line):
            self.line = DelayLine(self.switch, [f"v{k}" for k in range(len(gbps))],
                                  {self.address(k): self.link_us[k] for k in range(len(gbps))},
                                  line.jitter_us, line.loss, line.seed)

    def address(self, rank: int) -> str:
        return f"{RANK_SUBNET}.{rank + 1}"

    def prefix_for(self, rank: int) -> list[str]:
        return exec_as_host(self.names[rank], f"r{rank}")

    def call(self, fn: Callable[[], T]) -> T:
        return call_in(self.names[0], fn)

    def _build(self) -> None:
        for name in (self.switch, *self.names):
            _run("ip", "netns", "add", name)
            self.made.append(name)
        if self.line is None:
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        else:
            _run("ip", "netns", "exec", self.switch, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            # up: the switch asks for its hosts' addresses from its loopback's (no port has one of its own)
            _run("ip", "-n", self.switch, "link", "set", "lo", "up")
        farthest = max(self.link_us)
        for k, (name, gbps) in enumerate(zip(self.names, self.gbps, strict=True)):
            # the longest round trip to a peer: twice the two links' delays (and the jitter), line or netem
            jitter = self.line.jitter_us if self.line else 0.0
            join_switch(self.switch, name, f"v{k}", self.address(k), gbps,
                        0.0 if self.line else self.link_us[k], routed=self.line is not None,
                        rtt_us=2 * (self.link_us[k] + farthest + jitter))
            (NETNS_ETC / name).mkdir(parents=True)
            (NETNS_ETC / name / "hosts").write_text(f"127.0.0.1\tlocalhost\n{self.address(k)}\tr{k}\n")
        if self.line is not None:
            self.line.start()

    def failure(self) -> str | None:
        return self.line.failure() if self.line is not None else None

    def delete(self) -> None:
        if self.line is not None:
            self.line.stop()
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
        self.made = []


def join_switch(switch: str, namespace: str, side: str, address: str, gbps: float, latency_us: float = 0.0,
                latency_key: str = "net.emulate_latency_us", routed: bool = False,
                rtt_us: float | None = None) -> None:
    """Join `namespace` to the bridge br0 of namespace `switch`: a veth (`eth0` in `namespace` with
    `address`/24, `side` on the bridge) shaped to `gbps` both ways, and delaying both ways by
    `latency_us` (netem on either end: a packet between two namespaces waits for both links). The
    pair is made inside `namespace` and one end moved to the switch: the machine's own namespace
    never holds either end. `routed`: the switch routes to `side` instead (a /32 route, proxy ARP
    answering for the other hosts at once), for the delay line; both ends then take the line's
    large MTU. `rtt_us`: the round trip to a peer (default that of a peer with the same delay: four
    times `latency_us`), which sizes the namespace's TCP buffers (size_socket_buffers)."""
    mtu = ["mtu", str(LINE_MTU)] if routed else []
    _run("ip", "-n", namespace, "link", "add", "eth0", *mtu, "type", "veth", "peer", "name", side, *mtu)
    _run("ip", "-n", namespace, "link", "set", side, "netns", switch)
    if routed:
        _run("ip", "netns", "exec", switch, "sysctl", "-qw", f"net.ipv4.conf.{side}.proxy_arp=1",
             f"net.ipv4.neigh.{side}.proxy_delay=0")
    else:
        _run("ip", "-n", switch, "link", "set", side, "master", "br0")
    _run("ip", "-n", switch, "link", "set", side, "up")
    if routed:
        _run("ip", "-n", switch, "route", "add", f"{address}/32", "dev", side)
    _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
    _run("ip", "-n", namespace, "link", "set", "eth0", "up")
    _run("ip", "-n", namespace, "link", "set", "lo", "up")
    shape_link(namespace, "eth0", gbps, latency_us, latency_key=latency_key)
    shape_link(switch, side, gbps, latency_us, latency_key=latency_key)
    size_socket_buffers(namespace, gbps, 4 * latency_us if rtt_us is None else rtt_us)


def exec_as_host(namespace: str, hostname: str) -> list[str]:
    """argv prefix that runs a command in `namespace` with a host name of its own (`hostname`, in a
    private UTS namespace), as a machine of its own has."""
    return ["ip", "netns", "exec", namespace, "unshare", "--uts", "--", "sh", "-c",
            'hostname "$0" && exec "$@"', hostname]


def call_in(namespace: str, fn: Callable[[], T]) -> T:
    """Run `fn()` in a fresh thread that joined `namespace`; return its result. The calling thread
    never changes namespace (a thread's namespace is its own: setns affects only it)."""
    box: dict[str, Any] = {}

    def inside() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{namespace}") as f:
                if libc.setns(f.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {namespace} failed")
            box["result"] = fn()
        except BaseException as e:  # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=inside, name=f"netns-{namespace}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


@contextlib.contextmanager
def shaped(gbps_per_worker: float | None, workers: int,
           latency_us: float = 0.0) -> Iterator[ShapedNamespace | None]:
    """`with shaped(G, N) as ns:` a namespace shaped to N x G Gbit/s, or None when G is None."""
    if gbps_per_worker is None:
        yield None
        return
    with ShapedNamespace(gbps_per_worker * max(1, workers), latency_us) as ns:
        yield ns
