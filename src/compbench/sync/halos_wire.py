"""The servers of `sync=halos` as threads, and the workers' side of their wire.

Layout (compbench.sync.halos): W workers in R regions of W/R contiguous ranks; region r's local
parameter server (LPS) runs on the region's first rank (r·W/R), the global parameter server (GPS)
on rank 0. A rank that hosts servers runs one `ServerHost`: one server thread that applies every
event in arrival order (compbench.sync.halos_rules: LPS and GPS alike, so their state has one
owner) and a receiver thread per group it receives on, which only queue what arrives.

Point to point over torch.distributed (gloo, host tensors), on four process groups of the whole
world made by every rank at setup in this order (`new_group` is collective), each used by at most
one thread per process (gloo's groups must not be shared between threads):
- `up`: workers → their LPS (a worker's training thread sends; the LPS rank's receiver takes them
  from any source). Header then, for a delivery, the flat model difference g.
- `down`: LPS → its workers (the server thread sends; the worker's training thread receives):
  int64[2] (θ_L's version, the stop: 1 once the LPS knows rank 0's training ended), then θ_L flat.
- `to_global`: LPS → GPS (a remote LPS's server thread sends; rank 0's receiver takes them from
  any source): a push (header, then u flat) or the LPS's leave (header with its counts).
- `to_local`: GPS → a remote LPS (rank 0's server thread sends; the LPS rank's receiver takes
  them): θ_G (header, then θ_G flat), STOP (header only) once rank 0's training ended, or BYE once
  that LPS has left.
A worker on the LPS's own rank, and LPS 0 with the GPS, talk through in-process queues (a process
cannot send to itself).

Headers are int64[HEADER] = (kind, a, b, c, d, e, f, g), the fields' meaning per kind below. Gloo
keeps the order of one sender's messages of one tag.

The stop (the workers are independent learners: compbench.sync.SyncTraits.learners_independent):
rank 0's worker, its training over (target, budget or max_steps) and its last evaluation done,
submits `Stop` (compbench.sync.halos's `stop_learners`) before its LEAVE. Rank 0's server thread
marks LPS 0 stopping and sends STOP to every remote LPS that has not left the GPS yet (one that
has is past its last worker already); a remote LPS's receiver queues it for its server thread,
which marks its LPS stopping. A stopping LPS applies no g: it answers every later delivery at once
with the stop flag (compbench.sync.halos_rules: counted as `after_stop`), and the worker ends its
training there and sends LEAVE. No worker waits on anything but its own LPS, which answers each
delivery as it applies it, before and after the stop: a worker waiting for an answer gets one.
Deliveries that reach the LPS before its STOP are applied and answered as usual (that worker stops
one round later). A worker that reaches max_steps first leaves as before; a STOP then still reaches
its LPS if it has not left the GPS, and is moot.

End: a worker's `drain` sends LEAVE. An LPS whose workers have all left waits for the answer to
its push in flight (if any), merges it, then sends its leave (with its counts) to the GPS; the GPS
answers a remote LPS's leave with BYE (its receiver then stops). A host's server thread stops
when its LPS has left and, on rank 0, when every LPS has left the GPS. The stop changes none of
this order: the GPS still answers a push in flight after the stop (the LPS waits for that answer
before it leaves), and a STOP, sent only to an LPS that has not left, comes before that LPS's BYE
on the same group and tag, so its receiver sees it first. A failure in a thread is kept and raised
in the hosting rank's training thread at its next exchange; remote workers then see their receive
time out (engine.timeout_s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from compbench.sync.halos_rules import GlobalServer, LocalCounts, LocalServer
from compbench.sync.server_threads import ServerThreads

HOST = "cpu"  # gloo's point to point carries host tensors: every message is built on the host
HEADER = 10
# kinds: a worker's DELIVER (a: base version, b: compute microseconds) and LEAVE; an LPS's PUSH (a:
# region) and LPS_LEAVE (a: region, then its counts: _COUNT_KEYS, compute and discarded
# microseconds); the GPS's GLOBAL (a: region), STOP and BYE.
DELIVER, LEAVE, PUSH, LPS_LEAVE, GLOBAL, BYE, STOP = 1, 2, 3, 4, 5, 6, 7
_TAG_UP_HEAD, _TAG_UP_BODY, _TAG_REPLY, _TAG_THETA = 31, 32, 33, 34
_TAG_G_HEAD, _TAG_G_BODY, _TAG_L_HEAD, _TAG_L_BODY = 35, 36, 37, 38
_COUNT_KEYS = ("updates", "pushes", "merges", "staleness_sum", "staleness_max", "after_stop")


@dataclass(frozen=True)
class Layout:
    """W workers in R regions of contiguous ranks; the LPS of region r on its first rank."""

    workers: int
    regions: int

    @property
    def per_region(self) -> int:
        return self.workers // self.regions

    def region_of(self, rank: int) -> int:
        return rank // self.per_region

    def lps_rank(self, region: int) -> int:
        return region * self.per_region

    def members(self, region: int) -> range:
        return range(self.lps_rank(region), self.lps_rank(region) + self.per_region)


@dataclass
class Groups:
    up: Any
    down: Any
    to_global: Any
    to_local: Any

    @classmethod
    def make(cls) -> Groups:
        """Every rank, in this order (collective)."""
        return cls(*(dist.new_group(backend="gloo") for _ in range(4)))


@dataclass
class WorkerDelta:
    rank: int
    base: int
    compute_s: float
    g: Tensor


@dataclass
class WorkerLeave:
    rank: int


@dataclass
class Stop:
    """Rank 0's training ended: the LPS applies no further g and answers with the stop."""


@dataclass
class LpsPush:
    region: int
    u: Tensor


@dataclass
class LpsLeave:
    region: int
    counts: dict[str, Any]


@dataclass
class GlobalModel:
    region: int
    theta: Tensor


Event = WorkerDelta | WorkerLeave | Stop | LpsPush | LpsLeave | GlobalModel


def header(kind: int, *fields: int) -> Tensor:
    values = [kind, *fields] + [0] * (HEADER - 1 - len(fields))
    return torch.tensor(values, dtype=torch.int64, device=HOST)


class ServerHost(ServerThreads[Event, tuple[int, bool, Tensor]]):
    """The servers one rank hosts: LPS `region`'s (every host) and the GPS (rank 0's, `gps` given)."""

    def __init__(self, rank: int, layout: Layout, groups: Groups, lps: LocalServer,
                 gps: GlobalServer | None) -> None:
        self.rank, self.layout, self.groups = rank, layout, groups
        self.region = layout.region_of(rank)
        self.lps, self.gps = lps, gps
        self.numel, self.dtype = lps.theta.numel(), lps.theta.dtype
        self.workers_left: set[int] = set()
        self.lps_left = False
        self.regions_left: dict[int, dict[str, Any]] = {}  # the GPS's record of each LPS's counts
        loops: list[tuple[str, Any]] = [("halos-server", self._serve)]
        if layout.per_region > 1:
            loops.append(("halos-up", self._receive_workers))
        if gps is not None and layout.regions > 1:
            loops.append(("halos-to-global", self._receive_lps))
        if gps is None:
            loops.append(("halos-to-local", self._receive_global))
        # replies to this rank's worker (`mine`): (θ_L's version, the stop, θ_L)
        super().__init__("a HALoS server", loops)  # the threads start: the servers are ready

    # -- this rank's worker -------------------------------------------------------------------

        self.raise_failure()

    # -- receivers: queue what arrives ----------------------------------------------------------

    def _receive_workers(self) -> None:
        """The region's remote workers' deliveries, until each of them has left."""
        remaining = self.layout.per_region - 1
        while remaining:
            head = torch.empty(HEADER, dtype=torch.int64, device=HOST)
            work = dist.irecv(head, group=self.groups.up, tag=_TAG_UP_HEAD)  # from any sender
            assert work is not None  # this rank is in the group
            work.wait()
            rank = int(work._source_rank())
            kind, base, compute_us = (int(v) for v in head[:3].tolist())
            if kind == LEAVE:
                self.events.put(WorkerLeave(rank))
                remaining -= 1
                continue
            g = torch.empty(self.numel, dtype=self.dtype, device=HOST)
            dist.recv(g, group=self.groups.up, group_src=rank, tag=_TAG_UP_BODY)
            self.events.put(WorkerDelta(rank, base, compute_us / 1e6, g))

    def _receive_lps(self) -> None:
        """Rank 0: the remote LPSs' pushes, until each of them has left."""
        remaining = self.layout.regions - 1
        while remaining:
            head = torch.empty(HEADER, dtype=torch.int64, device=HOST)
            work = dist.irecv(head, group=self.groups.to_global, tag=_TAG_G_HEAD)
            assert work is not None
            work.wait()
            source = int(work._source_rank())
            kind, region, *counts = (int(v) for v in head.tolist())
            if kind == LPS_LEAVE:
                ints = dict(zip(_COUNT_KEYS, counts, strict=False))
                compute_us, discarded_us = counts[len(_COUNT_KEYS) : len(_COUNT_KEYS) + 2]
                leave = LocalCounts(**ints, compute_s=compute_us / 1e6, discarded_s=discarded_us / 1e6)
                self.events.put(LpsLeave(region, leave.record()))
                remaining -= 1
                continue
            u = torch.empty(self.numel, dtype=self.dtype, device=HOST)
            dist.recv(u, group=self.groups.to_global, group_src=source, tag=_TAG_G_BODY)
            self.events.put(LpsPush(region, u))

    def _receive_global(self) -> None:
        """A remote LPS's rank: the GPS's answers and its STOP, until its BYE."""
        while True:
            head = torch.empty(HEADER, dtype=torch.int64, device=HOST)
            dist.recv(head, group=self.groups.to_local, group_src=0, tag=_TAG_L_HEAD)
            if int(head[0]) == BYE:
                return
            if int(head[0]) == STOP:
                self.events.put(Stop())
                continue
            theta = torch.empty(self.numel, dtype=self.dtype, device=HOST)
            dist.recv(theta, group=self.groups.to_local, group_src=0, tag=_TAG_L_BODY)
            self.events.put(GlobalModel(self.region, theta))

    # -- the server thread ----------------------------------------------------------------------

    def _finished(self) -> bool:
        return self.lps_left and (self.gps is None or len(self.regions_left) == self.layout.regions)

    def _serve(self) -> None:
        while not self._finished():
            event = self.events.get()
            with self.lock:
                self._apply(event)

    def _apply(self, event: Event) -> None:
        device = self.lps.theta.device
        if isinstance(event, WorkerDelta):
            if self.lps.update(event.g.to(device), event.base, event.compute_s):
                self._to_gps(LpsPush(self.region, self.lps.push()))
            self._reply(event.rank)
        elif isinstance(event, WorkerLeave):
            self.workers_left.add(event.rank)
            self._maybe_leave()
        elif isinstance(event, Stop):
            self._stop()
        elif isinstance(event, GlobalModel):
            self.lps.merge(event.theta.to(device))
            self._maybe_leave()
        elif isinstance(event, LpsPush):
            assert self.gps is not None, "an LPS push reached a rank without the GPS"
            self._to_lps(event.region, self.gps.update(event.region, event.u.to(device)))
        else:
            assert self.gps is not None, "an LPS leave reached a rank without the GPS"
            self.regions_left[event.region] = event.counts
            if event.region != self.region:
                dist.send(header(BYE), group=self.groups.to_local,
                          group_dst=self.layout.lps_rank(event.region), tag=_TAG_L_HEAD)

    def _stop(self) -> None:
        """This host's LPS stops; on rank 0 (the GPS's host, where the stop starts) every remote LPS
        that has not left is told (STOP), in the GPS's order of messages to it."""
        self.lps.stop()
        if self.gps is None:
            return
        for region in range(self.layout.regions):
            if region != self.region and region not in self.regions_left:
                dist.send(header(STOP), group=self.groups.to_local, group_dst=self.layout.lps_rank(region),
                          tag=_TAG_L_HEAD)

    def _reply(self, rank: int) -> None:
        """θ_L (its version, and whether the LPS stopped) to the worker that delivered."""
        if rank == self.rank:
            self.mine.put((self.lps.version, self.lps.stopping, self.lps.theta.clone()))
            return
        head = torch.tensor([self.lps.version, int(self.lps.stopping)], dtype=torch.int64, device=HOST)
        dist.send(head, group=self.groups.down, group_dst=rank, tag=_TAG_REPLY)
        dist.send(self.lps.theta.to(HOST), group=self.groups.down, group_dst=rank, tag=_TAG_THETA)

    def _to_gps(self, push: LpsPush) -> None:
        if self.gps is not None:
            self.events.put(push)
            return
        dist.send(header(PUSH, push.region), group=self.groups.to_global, group_dst=0, tag=_TAG_G_HEAD)
        dist.send(push.u.to(HOST), group=self.groups.to_global, group_dst=0, tag=_TAG_G_BODY)

    def _to_lps(self, region: int, theta: Tensor) -> None:
        if region == self.region:
            self.events.put(GlobalModel(region, theta))
            return
        dst = self.layout.lps_rank(region)
        dist.send(header(GLOBAL, region), group=self.groups.to_local, group_dst=dst, tag=_TAG_L_HEAD)
        dist.send(theta.to(HOST), group=self.groups.to_local, group_dst=dst, tag=_TAG_L_BODY)

    def _maybe_leave(self) -> None:
        """Every worker of the region left and no push awaits its answer: the LPS leaves the GPS."""
        if self.lps_left or self.lps.in_flight or len(self.workers_left) < self.layout.per_region:
            return
        self.lps_left = True
        record = self.lps.counts.record()
        if self.gps is not None:
            self.events.put(LpsLeave(self.region, record))
            return
        counts = self.lps.counts
        fields = [int(record[k]) for k in _COUNT_KEYS] + [round(counts.compute_s * 1e6),
                                                          round(counts.discarded_s * 1e6)]
        dist.send(header(LPS_LEAVE, self.region, *fields), group=self.groups.to_global, group_dst=0,
                  tag=_TAG_G_HEAD)


def send_delta(groups: Groups, lps: int, base: int, compute_s: float, g: Tensor) -> None:
    """A remote worker's delivery to its LPS (its training thread)."""
    dist.send(header(DELIVER, base, round(compute_s * 1e6)), group=groups.up, group_dst=lps, tag=_TAG_UP_HEAD)
    dist.send(g.to(HOST), group=groups.up, group_dst=lps, tag=_TAG_UP_BODY)


def send_leave(groups: Groups, lps: int) -> None:
    dist.send(header(LEAVE), group=groups.up, group_dst=lps, tag=_TAG_UP_HEAD)


def receive_theta(groups: Groups, lps: int, numel: int, dtype: torch.dtype) -> tuple[int, bool, Tensor]:
    """A remote worker's answer from its LPS: (θ_L's version, whether to stop, θ_L flat on the host)."""
    head = torch.empty(2, dtype=torch.int64, device=HOST)
    dist.recv(head, group=groups.down, group_src=lps, tag=_TAG_REPLY)
    theta = torch.empty(numel, dtype=dtype, device=HOST)
    dist.recv(theta, group=groups.down, group_src=lps, tag=_TAG_THETA)
    version, stop = (int(v) for v in head.tolist())
    return version, bool(stop), theta
