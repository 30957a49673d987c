"""Node-aware alpha-beta model of one step's communication on K machines of L = N/K workers each,
for the collectives as Gloo runs them (Horovod's CPU path and torch's gloo backend), fitted to
measured step times of an emulated cluster (`scripts/whatif_cluster.py --fit`).

Why not the flat model of `whatif.py`: there every worker owns a link of rate B. On a cluster the
L workers of a machine share its link, and which collective crosses it how often depends on the
algorithm: Gloo's allgather and allreduce are rings over ranks in node order, so one hop per
machine boundary carries a chunk per round, while its all-to-all posts every message at once, so a
machine's link carries L * (N - L) of them. The model's five terms, per step:

    comm_ms = a * waited + a' * queued + b * rounds + c * cross_bytes / G + d * machine_bytes

- waited: collectives of a blocking communicator (its `traits.blocking`: ps, hierarchical, ring),
  each started after the previous one ended, times N-1: each pays in full the engine's negotiation,
  which passes through every rank (and, on an emulated cluster, waits for each of the N processes
  to be scheduled on the shared cores; measured: the cost per waited collective grows with N);
  queued: the collectives an asynchronous one (allgather, allreduce) starts together, which the
  engine negotiates and runs back to back;
- rounds: message rounds that wait for the previous one (N-1 per ring allgather, 2(N-1) per ring
  allreduce, 1 per all-to-all, which posts its messages together);
- cross_bytes / G: the bytes the busiest machine link carries one way, at its rate G (seconds);
- machine_bytes: bytes all workers send, which the kernel copies through sockets; on an emulated
  cluster every node shares the same cores, on a real one this is the intra-node share.
The terms are linear in their coefficients, which are fitted by non-negative least squares on
relative errors. A payload per rank `S` is the run's measured bytes per call (compbench books them).

Sharded training (`sharding=fsdp|hsdp`) adds collectives inside shard groups of g consecutive ranks
(groups aligned to machines; one that spans machines crosses each machine boundary once a round):
`ring_allgather_into` (FSDP's weight all-gather into one buffer: g-1 rounds of a chunk),
`ring_reduce_scatter` (its gradient reduce-scatter: the same arithmetic; a ring allreduce is the two),
the all-to-all in groups (qgZ's quantized reduce-scatter), `fsdp_features` (a step of them, with
the rounds a link's delay holds up) and `across_groups` (the `sync` mode's exchange among the
replicas of each shard, g replica groups at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

TERMS = ("waited", "queued", "rounds", "cross_s", "machine_bytes")


@dataclass
class Shape:
    nodes: int
    workers: int
    gbps: float

    @property
    def per_node(self) -> int:
        return self.workers // self.nodes

    @property
    def link_bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8


def _zero() -> dict[str, float]:
    return dict.fromkeys(TERMS, 0.0)


def _add(acc: dict[str, float], shape: Shape, calls: float, rounds: float, cross: float,
         machine: float) -> None:
    acc["queued"] += calls  # features() moves them to "waited" for a blocking communicator
    acc["rounds"] += rounds
    acc["cross_s"] += cross / shape.link_bytes_per_s if shape.nodes > 1 else 0.0
    acc["machine_bytes"] += machine


def ring_allreduce(acc: dict[str, float], shape: Shape, nbytes: float, calls: float = 1.0) -> None:
    """Reduce-scatter then allgather around the ring: 2(N-1) rounds of S/N per hop."""
    n = shape.workers
    rounds = 2 * (n - 1)
    _add(acc, shape, calls, calls * rounds, calls * rounds / n * nbytes, calls * rounds * nbytes)


def group_allreduce(acc: dict[str, float], shape: Shape, nbytes: float, calls: float, group: int) -> None:
    """N/g rings of g workers at once (NoLoCo's pairs): 2(g-1) rounds of S/g per hop in each; the
    groups are random, so a worker's hops cross machine links as a ring's of the world do."""
    g = max(1, min(group, shape.workers))
    rounds = 2 * (g - 1)
    _add(acc, shape, calls, calls * rounds, calls * rounds / g * nbytes,
         calls * rounds * nbytes * shape.workers / g)


def ring_allgather(acc: dict[str, float], shape: Shape, nbytes: float, calls: float = 1.0,
                   senders: int | None = None) -> None:
    """N-1 rounds, each passing one rank's payload along; `senders` ranks (one per node: the
    leaders of comm=hierarchical) have a payload, the others send nothing of their own. Two
    collectives each: compbench's engines exchange the payloads' sizes first (an allgather of its
    own), since they differ between ranks."""
    n, k = shape.workers, shape.nodes
    if senders is None:  # every rank: each boundary carries N-1 payloads
        cross, machine = (n - 1) * nbytes, n * (n - 1) * nbytes
    else:  # one payload per node: a boundary carries the K-1 payloads from other nodes
        cross, machine = (k - 1) * nbytes, senders * (n - 1) * nbytes
    _add(acc, shape, 2 * calls, 2 * calls * (n - 1), calls * cross, calls * machine)


def alltoall(acc: dict[str, float], shape: Shape, nbytes: float, calls: float = 1.0,
             group: int | None = None) -> None:
    """Every rank sends nbytes / N to each other rank at once: a machine's link carries L * (N-L)
    of those messages out (and as many in). `group`: the same inside groups of g consecutive ranks
    at once (qgZ's quantized reduce-scatter in a shard group), nbytes / g to each of g-1 peers; a
    machine's link carries (its members of the group) x (the members elsewhere) messages, none where
    a group lies inside a machine."""
    n = shape.workers
    g = n if group is None else max(1, min(group, n))
    near = min(shape.per_node, g)  # a group's members on one machine (groups aligned to machines)
    cross = near * (g - near) * nbytes / g if crosses_machines(shape, g) else 0.0
    _add(acc, shape, calls, calls, calls * cross, calls * n * (g - 1) / g * nbytes)


def to_leaders(acc: dict[str, float], shape: Shape, nbytes: float, calls: float = 1.0) -> None:
    """comm=hierarchical inside a node: L-1 members send nbytes to their leader (or it to them)."""
    per = shape.per_node
    if per > 1:
        _add(acc, shape, calls, calls, 0.0, calls * shape.nodes * (per - 1) * nbytes)


def crosses_machines(shape: Shape, group: int) -> bool:
    """Whether groups of `group` consecutive ranks span machines (machines hold `per_node` consecutive
    ranks): a group larger than a machine does, and so does one that does not divide it (some group
    straddles two)."""
    return shape.nodes > 1 and shape.per_node % max(1, group) != 0


def _ring_in_groups(acc: dict[str, float], shape: Shape, nbytes: float, calls: float, group: int | None
                    ) -> None:
    n = shape.workers
    g = n if group is None else max(1, min(group, n))
    rounds = g - 1  # each a chunk of nbytes / g per hop
    cross = rounds * nbytes / g if crosses_machines(shape, g) else 0.0
    _add(acc, shape, calls, calls * rounds, calls * cross, calls * n * rounds / g * nbytes)


def ring_allgather_into(acc: dict[str, float], shape: Shape, nbytes: float, calls: float = 1.0,
                        group: int | None = None) -> None:
    """An all-gather into one buffer of `nbytes` (torch's all_gather_into_tensor: every rank holds
    nbytes / g of it, all the same length, so one collective: no sizes exchanged first) around a
    ring of g consecutive ranks (`group`, default the world), every group at once: g-1 rounds, each
    passing one chunk of nbytes / g along. Where a group spans machines its ring crosses each
    machine boundary once: the busiest link carries (g-1)/g x nbytes; inside a machine, nothing.
    All workers send N (g-1)/g x nbytes. FSDP's weight all-gather (nbytes: a unit's whole gathered
    buffer, as compbench books it)."""
    _ring_in_groups(acc, shape, nbytes, calls, group)


def ring_reduce_scatter(acc: dict[str, float], shape: Shape, nbytes: float, calls: float = 1.0,
                        group: int | None = None) -> None:
    """A reduce-scatter of an input of `nbytes` per rank around a ring of g consecutive ranks
    (`group`, default the world), every group at once: g-1 rounds, each passing a partial sum of
    nbytes / g along, so that each rank ends with its reduced nbytes / g; the arithmetic of the
    all-gather above (ring allreduce = this, then that). FSDP's dense gradient reduce-scatter
    (nbytes: a unit's whole input, as compbench books it)."""
    _ring_in_groups(acc, shape, nbytes, calls, group)


def fsdp_features(shape: Shape, group: int, gather_bytes: float, gathers: float, scatter_bytes: float,
                  scatters: float, scatter_alltoall: bool = False, node_gathers: float = 0.0
                  ) -> dict[str, float]:
    """One step of a sharded run's own collectives in its shard groups of `group` consecutive ranks:
    `gathers` ring all-gathers of a unit's weights (`gather_bytes` each: the whole gathered buffer)
    and `node_gathers` more inside each machine (ZeRO++ hpZ: backward gathers the secondary shard
    its node keeps), `scatters` reduce-scatters of a unit's gradients (`scatter_bytes` each: the
    whole input), a ring, or an all-to-all for a quantized one (qgZ, LoCo: each peer's chunk encoded
    on its own). Each collective is queued (one fixed cost: FSDP calls torch.distributed directly,
    no engine negotiation). `delayed_rounds` (not a fitted term): the rounds that cross a machine
    link, which a link's delay holds up; inside a machine none."""
    acc = _zero()
    delayed = 0.0
    ring_allgather_into(acc, shape, gather_bytes, gathers, group)
    if crosses_machines(shape, group):
        delayed += gathers * (group - 1)
    if node_gathers:
        inside = min(group, shape.per_node)
        ring_allgather_into(acc, shape, gather_bytes, node_gathers, inside)
        if crosses_machines(shape, inside):
            delayed += node_gathers * (inside - 1)
    if scatter_alltoall:
        alltoall(acc, shape, scatter_bytes, scatters, group)
        delayed += scatters if crosses_machines(shape, group) and group > 1 else 0.0
    else:
        ring_reduce_scatter(acc, shape, scatter_bytes, scatters, group)
        delayed += scatters * (group - 1) if crosses_machines(shape, group) else 0.0
    return {**acc, "delayed_rounds": delayed}


def across_groups(row: dict, shape: Shape, group: int) -> dict[str, float]:
    """The `sync` mode's exchange across shard groups of `group` consecutive ranks (HSDP): the ranks
    at the same place in their groups hold the same shard and form a replica group of R = N / g
    workers; the g replica groups run the row's collectives (`features`; the row's bytes: one
    worker's, its shard's) at once. A replica group's consecutive members are g ranks apart: one
    per machine where a shard group fills a machine or more, per_node / g on one machine otherwise;
    the replica groups with a member on a machine, min(per_node, g), share its link, and all g of
    them copy through the machines."""
    n, per = shape.workers, shape.per_node
    g = max(1, min(group, n))
    replicas = n // g
    if replicas <= 1:
        return {**_zero(), "delayed_rounds": 0.0}
    together = max(1, per // g)  # a replica group's members on one machine
    machines = max(1, replicas // together)
    terms = features(row, Shape(nodes=machines, workers=replicas, gbps=shape.gbps))
    terms["cross_s"] *= min(per, g)
    terms["machine_bytes"] *= g
    return {**terms, "delayed_rounds": terms["rounds"] if machines > 1 else 0.0}


def features(row: dict, shape: Shape) -> dict[str, float]:
    """The model's terms for one run (a rows.csv row or a results.json summary with its comm)."""
    dense_acc, acc = _zero(), _zero()
    calls = float(row.get("compressed_calls_per_step") or 0)
    dense_calls = float(row.get("dense_calls_per_step") or 0)
    allreduced = float(row.get("bytes_allreduce_per_step") or 0)
    sent = float(row.get("bytes_sent_per_step") or 0) - allreduced
    group = int(row.get("group") or 0)  # an allreduce inside groups of workers (ExchangePlan.group)
    if dense_calls and group:
        group_allreduce(dense_acc, shape, allreduced / dense_calls, dense_calls, group)
    elif dense_calls:  # the dense path: the engine's asynchronous allreduce, whatever the communicator
        ring_allreduce(dense_acc, shape, allreduced / dense_calls, dense_calls)
    if calls:
        # comm=hierarchical moves the compressed tensors' fp32 gradients inside a machine
        dense_per_call = (float(row.get("bytes_dense_per_step") or 0) - allreduced) / calls
        _compressed(acc, pattern(row["comm"]), shape, sent / calls, dense_per_call, calls)
        if blocking(row["comm"]):
            acc["waited"], acc["queued"] = acc["queued"] * (shape.workers - 1), 0.0
    return {k: acc[k] + dense_acc[k] for k in TERMS}


def _compressed(acc: dict[str, float], comm: str, shape: Shape, per_call: float, dense_per_call: float,
                calls: float) -> None:
    """One compressed exchange's collectives, by the communicator's declared `traits.pattern`."""
    n = shape.workers
    if comm == "allgather":
        ring_allgather(acc, shape, per_call, calls)
    elif comm == "ps":
        # counts (tiny), then the N shards' payloads (S / (1 + 1/N) of the booked bytes), then the
        # servers' re-encoded shards (S / (N + 1)) gathered by all.
        shards = per_call * n / (n + 1)
        alltoall(acc, shape, 0.0, calls)
        alltoall(acc, shape, shards, calls)
        ring_allgather(acc, shape, shards / n, calls)
    elif comm == "hierarchical":
        to_leaders(acc, shape, dense_per_call, calls)
        if shape.nodes > 1:
            ring_allgather(acc, shape, per_call, calls, senders=shape.nodes)
        to_leaders(acc, shape, dense_per_call, calls)
    elif comm == "allreduce":
        ring_allreduce(acc, shape, per_call, calls)
    else:
        raise ValueError(f"traits.pattern={comm}: the cluster model knows allgather, ps, hierarchical, "
                         "allreduce")


@cache
def pattern(comm: str) -> str:
    """The communicator's declared `traits.pattern`: the collectives of one compressed exchange."""
    from compbench.catalog import registry

    return registry.declared("comm", comm).pattern


@cache  # the registry reads the communicator's YAML file: once per name, not once per row
def blocking(comm: str) -> bool:
    """The communicator's declared `traits.blocking` (it finishes each exchange inside `reduce`)."""
    from compbench.catalog import registry

    return bool(registry.declared("comm", comm).blocking)


@dataclass
class Fit:
    """Fitted coefficients: ms per waited collective and peer, ms per queued collective, ms per
    round, link factor (1 = the shaped rate: ms per ms of link time), and the machine's copy rate
    (GB/s, inf: not limiting); `latency_factor`: ms waited per ms of one-way delay per message
    round (1: each round waits the delay once; fitted where runs had two delays or more; the
    callers add it, since `terms` carry no delay)."""

    ms_per_waited: float
    ms_per_queued: float
    ms_per_round: float
    link_factor: float
    machine_gb_per_s: float
    latency_factor: float = 1.0

    def comm_ms(self, terms: dict[str, float]) -> float:
        per_byte_ms = 0.0 if self.machine_gb_per_s == float("inf") else 1e3 / (self.machine_gb_per_s * 1e9)
        return (self.ms_per_waited * terms["waited"] + self.ms_per_queued * terms["queued"]
                + self.ms_per_round * terms["rounds"] + self.link_factor * terms["cross_s"] * 1e3
                + per_byte_ms * terms["machine_bytes"])


def fit(terms: list[dict[str, float]], comm_ms: list[float]) -> Fit:
    """Non-negative least squares on relative errors (each row divided by its measured time)."""
    from scipy.optimize import nnls

    if len(terms) < len(TERMS):
        raise ValueError(f"the cluster model needs at least {len(TERMS)} measured rows, got {len(terms)}")
    scale = np.array([1.0, 1.0, 1.0, 1e3, 1.0])  # cross_s in ms, like the target
    x = np.array([[t[k] for k in TERMS] for t in terms]) * scale
    y = np.asarray(comm_ms, dtype=float)
    w = 1.0 / np.maximum(y, 1e-3)
    coef, _ = nnls(x * w[:, None], y * w)
    waited, queued, rounds, link, per_byte = (float(c) for c in coef)
    return Fit(ms_per_waited=waited, ms_per_queued=queued, ms_per_round=rounds, link_factor=link,
               machine_gb_per_s=math.inf if per_byte == 0 else 1e3 / per_byte / 1e9)
