"""The what-if model of every synchronization mode: a run's step time at another bandwidth, latency
or worker count, from what the run measured and what its mode declares.

A run gives, per step, the time that does not depend on the network, `fixed` = step - comm (compute,
encode, decode, optimizer, other: `split_ms`), and what it sends: bytes and collectives per step
(means over whole rounds for periodic modes). Its mode declares (results.json `exchange`,
`compbench.sync.ExchangePlan`) one exchange every `every` steps, in the collectives of `pattern`,
hidden behind `hidden_steps` steps of compute while it travels, or behind back-propagation
(`overlaps_backward`), after `warmup_steps` steps that exchange the gradients dense (one allreduce
of them: 1-bit Adam's warm-up). Then, at G Gbit/s with N workers and a latency L per message round:

    comm(G, N, L) = the node-aware alpha-beta cost of one exchange's collectives
                    (compbench.comm.cost_model: per collective, per round, per byte on the
                    busiest link), plus L for each of its rounds
    hidden        = hidden_steps * fixed  (+ 2/3 of the compute for an exchange that overlaps
                    back-propagation: backward's usual share of forward + backward)
    step(G, N, L) = fixed + max(0, comm - hidden) / every
    time to S steps = min(S, warmup) x the warm-up's step + the rest x step(G, N, L)

The alpha-beta coefficients are fitted (non-negative least squares on relative errors) on the race's
own runs: each row's measured step time against its prediction with the row's own `fixed`, where
those runs span two bandwidths or more (MIN_BANDWIDTHS: on one link a per-byte cost cannot be told
from a per-collective one, and a link factor from one rate is no rate's). Otherwise the model keeps
its prior (PRIOR: each link at its shaped rate, a delay waited once per message round, nothing per
collective or round) and says so; what it predicts then is the prior's, and the race's report
prints no crossover and no extrapolation from it.
Assumptions: `fixed` and the payload per worker do not change with N or G; every worker is its own
machine on a link of G each way (compbench's shaped loopback: 2 workers, 2 x G on one device; with a
delay, a link each). The delay L is waited once per message round (`latency_factor` x L x rounds,
the factor fitted where the race's runs had two delays or more: TCP's slow start and
acknowledgements can cost more round trips than the collective's own).

Sharded runs (`sharding=fsdp|hsdp`, results.json summary `sharded`): besides the exchange above,
every step runs the shard group's own collectives, booked per direction as ZeRO++ counts volume.
With U units (the model's FSDP units: its blocks and the root, rebuilt on the meta device from the
run's config), per step: 2U all-gathers of a unit's weights at stage 3 (forward and backward), U at
stage 2, each `bytes_gathered_per_step / gathers` (with hpZ, backward's U inside a machine), and U
reduce-scatters of its gradients, each `bytes_scattered_per_step / U`; costed in a shard group of
g workers (compbench.comm.cost_model.fsdp_features) as ring all-gathers and ring reduce-scatters
(g-1 rounds of 1/g of the buffer), a quantized reduce-scatter (qgZ, LoCo) as an all-to-all. Then

    fsdp(G, N, L) = their alpha-beta cost + L for each of their rounds that crosses a link
    step(G, N, L) = fixed + fsdp + max(0, comm - hidden) / every

where comm is the `sync` mode's exchange across the R = N / g replica groups (HSDP; none with
sharding=fsdp), its bytes `bytes_replica_per_step` (one worker's shard), in its mode's pattern among
R workers, g replica groups at once (cost_model.across_groups). Nothing hides FSDP's collectives:
on the CPU they are synchronous (gloo; a prefetch only reorders them), so they are exposed every
step, and the replica exchange runs after backward on the shard view (no backward hooks fire there),
so it overlaps backward never, only the steps its mode declares (DiLoCo's eager rounds). On a GPU,
FSDP overlaps its collectives with compute on streams of their own: there this is an upper bound.
The fit takes a sharded run's FSDP terms (every x a step's, per exchange) beside its exchange's,
with the same coefficients. The race's runs share one machine's shaped link, so the model sees each
worker as its own machine (a shard group of g spans g of them); the what-if places N workers L to a
machine (`per_node`): sharding=fsdp shards over all N, sharding=hsdp keeps its run's group size
(sharding.group_size).

Memory per worker (`memory_bytes`), what decides whether a configuration fits: parameters,
gradients and optimizer state of the model's P parameters over the shard group
(compbench.records.memory.predict_worker_bytes: fp32, the optimizer's state elements), plus the
activations the run measured (the most any worker's forward saved; they do not depend on the
workers), plus the gathered weights a sharded worker holds at once: at stage 3 a unit's and the
`prefetch` next ones' (P (1 + prefetch) / U: units taken as equal), at stage 2 all of them (P: kept
from forward until backward ends), and with hpZ its node's secondary shard (P / L), all fp32. Other
model sizes (`scaled`, k times the run's parameters): the model grows in depth and width together
(depth in proportion to width, as GPT-2's and GPT-3's families roughly do; parameters grow as depth
x width^2, so depth and width each by k^(1/3)): the fixed time and every byte by k (compute about 6 P
flops a token, the collectives' buffers P), the units' blocks and the exchange's calls (one a tensor
or a unit) by k^(1/3), the activations (depth x width a token) by k^(2/3); the tokens a step do not
change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cache

import numpy as np

from compbench.comm.cost_model import TERMS, Fit, Shape, across_groups, features, fsdp_features
from compbench.race.cost import Prices
from compbench.records.memory import MB, predict_worker_bytes

BACKWARD_SHARE = 2 / 3  # of forward + backward: what a per-step exchange from backward hooks can hide behind
PARAMETER_BYTES = 4  # fp32: the parameters, gradients and optimizer state a worker keeps
# What the model assumes before a fit, and keeps where the runs cannot fit it: the link at its shaped
# rate (link factor 1), the delay once per message round, no cost per collective, round or byte copied.
PRIOR = Fit(ms_per_waited=0.0, ms_per_queued=0.0, ms_per_round=0.0, link_factor=1.0,
            machine_gb_per_s=math.inf, latency_factor=1.0)
MIN_BANDWIDTHS = 2  # the rows' distinct bandwidths a fit needs
_BYTE_KEYS = ("bytes_sent_per_step", "bytes_allreduce_per_step", "bytes_dense_per_step")
_CALL_KEYS = ("compressed_calls_per_step", "dense_calls_per_step")


@dataclass(frozen=True)
class Sharded:
    """A sharded run's layout and its own collectives (results.json summary `sharded`)."""

    layout: str              # fsdp | hsdp
    stage: int               # 3: gathered twice a step, 2: once
    group: int               # the run's shard group (workers); hsdp keeps it in the what-if
    hpz: bool                # ZeRO++ hpZ: backward's gathers inside a machine
    scatter_alltoall: bool   # a quantized reduce-scatter (qgZ, LoCo): an all-to-all
    units: int               # FSDP units (each gathered and scattered on its own)
    prefetch: int
    gather_bytes: float      # one all-gather's whole buffer, as booked
    scatter_bytes: float     # one reduce-scatter's whole input, as booked

    @property
    def gathers_per_unit(self) -> int:
        return 2 if self.stage == 3 else 1

    def group_at(self, workers: int) -> int:
        """The shard group with `workers` workers: all of them (fsdp), or the run's size (hsdp), which
        must make 2 or more groups."""
        if self.layout == "fsdp":
            return workers
        if workers % self.group or workers // self.group < 2:
            raise ValueError(f"sharding=hsdp's shard groups of {self.group} do not divide {workers} workers "
                             f"into 2 or more groups; take a multiple of {self.group} from {2 * self.group}")
        return self.group

    def terms(self, shape: Shape) -> dict[str, float]:
        """One step of the shard groups' collectives (cost_model.fsdp_features)."""
        g = self.group_at(shape.workers)
        node = self.units if self.hpz and self.stage == 3 else 0
        return fsdp_features(shape, g, self.gather_bytes, self.units * self.gathers_per_unit - node,
                             self.scatter_bytes, self.units, self.scatter_alltoall, node_gathers=node)


@dataclass(frozen=True)
class Memory:
    """What a worker's memory is predicted from: the model's parameters, the optimizer (its state
    elements per parameter), and the activations the run measured (bytes, the most any worker's
    forward saved)."""

    numel: int
    optim: str
    settings: dict = field(default_factory=dict)
    activation_bytes: float = 0.0


@dataclass(frozen=True)
class WhatIf:
    """The configuration the report's what-if predicts (`compbench race --workers --per-node
    --memory-gb --params --prices`): N workers, `per_node` to a machine, `latency_ms` one way per
    message round, the memory a worker has, model sizes (parameters) besides the runs' own, and the
    prices its costs and the report's are in (None: no costs, compbench.race.cost)."""

    workers: int = 8
    per_node: int = 1
    latency_ms: float = 10.0
    memory_gb: float = 80.0
    params: tuple[float, ...] = ()
    prices: Prices | None = None

    def fits(self, memory: dict[str, float] | None) -> str:
        """`X GB, fits` or `X GB, does not fit` (GB of 1e9 bytes, as compose's refusal says)."""
        if memory is None:
            return "-"
        total = memory["total"] / 1e9
        return f"{total:.3g} GB, {'fits' if total <= self.memory_gb else 'does not fit'}"


QUORUM_MODE = "quorum_diloco"  # the mode whose outer step merges a quorum (compbench.race.under_fault)


@dataclass(frozen=True)
class Quorum:
    """A quorum mode's settings as its run recorded them (config.sync of sync=quorum_diloco): the
    learners a merge needs (None: every worker), the grace window after the quorum (seconds,
    "adaptive": `window_factor` x the median round time, None: until every learner on the current θ
    has delivered) and the merges a late outer gradient may lag by before it is discarded."""

    quorum: int | None
    window_s: float | str | None
    window_factor: float
    max_staleness: int

    @classmethod
    def of(cls, results: dict) -> Quorum | None:
        config = results.get("config") or {}
        if (config.get("choices") or {}).get("sync") != QUORUM_MODE:
            return None
        sync = config.get("sync") or {}
        quorum, window = sync.get("quorum"), sync.get("window_s", "adaptive")
        return cls(None if quorum is None else int(quorum),
                   window if window is None or isinstance(window, str) else float(window),
                   float(sync.get("window_factor", 0.1)), int(sync.get("max_staleness", 4)))


HALOS_MODE = "halos"  # the mode whose workers never wait for each other (compbench.race.under_fault)


def steps_per_worker(results: dict) -> str | tuple[int, ...] | None:
    """sync=diloco's `inner_steps_per_worker` as its run recorded it: "adaptive", each worker's H_r,
    or None (every worker H)."""
    config = results.get("config") or {}
    if (config.get("choices") or {}).get("sync") != "diloco":
        return None
    setting = (config.get("sync") or {}).get("inner_steps_per_worker")
    return setting if setting is None or isinstance(setting, str) else tuple(int(h) for h in setting)


@dataclass(frozen=True)
class Profile:
    """What the model needs of one run (per worker, per step unless said otherwise)."""

    fixed_ms: float
    compute_ms: float
    row: dict                  # cost_model's row for ONE exchange (bytes and calls per exchange, comm)
    every: int
    hidden_steps: int
    overlaps_backward: bool
    workers: int
    warmup_steps: int = 0
    sharded: Sharded | None = None   # a sharded run's own collectives (sharding=fsdp|hsdp)
    memory: Memory | None = None     # None: the run recorded no memory split
    optimizer_ms: float = 0.0        # the optimizer's phase: with compute_ms, the work goodput counts
    quorum: Quorum | None = None     # a quorum mode's settings (compbench.race.under_fault)
    per_worker: str | tuple[int, ...] | None = None  # sync=diloco's inner_steps_per_worker (under_fault)
    independent: bool = False        # sync=halos: no worker waits for another (under_fault)

    @classmethod
    def of(cls, results: dict) -> Profile:
        s, plan = results["summary"], results.get("exchange") or {}
        every = int(plan.get("every", 1))
        row = {"comm": results["config"]["choices"]["comm"],
               **{k: float(s.get(k) or 0.0) * every for k in (
                   *_BYTE_KEYS, *_CALL_KEYS)}}
        if plan.get("pattern") == "group_allreduce":  # NoLoCo: the allreduce runs inside groups
            row["group"] = float(plan.get("group", 0))
        # one group (a bucket of the whole model) goes as backward ends: nothing overlaps, though
        # the scheduler overlaps (the scheduler's summary names its groups)
        groups = (results.get("scheduler") or {}).get("groups")
        memory = _memory(results)
        sharded = _sharded(results, memory)
        if sharded is not None:  # the exchange is the replicas' (its bytes: bytes_sent less FSDP's)
            row["bytes_sent_per_step"] = float(s["sharded"].get("bytes_replica_per_step") or 0.0) * every
            # its fp32 bytes: the shard's (bytes_dense counts FSDP's too), what a dense exchange of it
            # sends (a warm-up's, every step) and comm=hierarchical moves inside a machine
            shard = memory.numel * PARAMETER_BYTES / sharded.group if memory is not None else None
            row["bytes_dense_per_step"] = row["bytes_sent_per_step"] if shard is None else shard
        return cls(fixed_ms=float(s["step_ms"]) - float(s.get("comm_ms") or 0.0),
                   compute_ms=float(s.get("compute_ms") or 0.0), row=row, every=every,
                   hidden_steps=int(plan.get("hidden_steps", 0)),
                   overlaps_backward=(bool(plan.get("overlaps_backward", False)) and groups != 1
                                      and sharded is None),
                   workers=int(results["environment"]["world_size"]),
                   warmup_steps=int(plan.get("warmup_steps", 0)), sharded=sharded, memory=memory,
                   optimizer_ms=float(s.get("optimizer_ms") or 0.0), quorum=Quorum.of(results),
                   per_worker=steps_per_worker(results),
                   independent=(results["config"]["choices"].get("sync") == HALOS_MODE))

    def _shape(self, gbps: float, workers: int | None, per_node: int) -> Shape:
        n = workers or self.workers
        if per_node < 1 or n % per_node:
            raise ValueError(f"{per_node} workers per machine do not divide {n} workers")
        return Shape(nodes=n // per_node, workers=n, gbps=gbps)

    def terms(self, gbps: float, workers: int | None = None, dense: bool = False,
              per_node: int = 1) -> dict[str, float]:
        """One exchange's terms, and `delayed_rounds`: its rounds that a link's delay holds up."""
        shape = self._shape(gbps, workers, per_node)
        row = self.row
        if dense:  # the warm-up: the gradients' fp32 bytes in one allreduce a step
            fp32 = self.row["bytes_dense_per_step"] / self.every
            row = {"comm": "allreduce", "bytes_sent_per_step": fp32, "bytes_allreduce_per_step": fp32,
                   "bytes_dense_per_step": fp32, "compressed_calls_per_step": 0, "dense_calls_per_step": 1}
        if self.sharded is None:
            terms = features(row, shape)
            return {**terms, "delayed_rounds": terms["rounds"]}
        group = self.sharded.group_at(shape.workers)
        shard = self.sharded.group / group  # a worker's replica bytes are its shard's
        return across_groups({**row, **{k: float(row[k]) * shard for k in _BYTE_KEYS}}, shape, group)

    def sharded_terms(self, gbps: float, workers: int | None = None, per_node: int = 1) -> dict[str, float]:
        """A step's FSDP collectives (zero for a run that is not sharded)."""
        if self.sharded is None:
            return {**dict.fromkeys(TERMS, 0.0), "delayed_rounds": 0.0}
        return self.sharded.terms(self._shape(gbps, workers, per_node))

    def hidden_ms(self, dense: bool = False) -> float:
        """What an exchange hides behind: backward (a per-step one from backward hooks), or the
        steps it overlaps; a warm-up's dense exchange, backward at most."""
        backward = BACKWARD_SHARE * self.compute_ms if self.overlaps_backward else 0.0
        return backward if dense else self.hidden_steps * self.fixed_ms + backward

    def comm_ms(self, fit: Fit, gbps: float, workers: int | None = None, latency_ms: float = 0.0,
                dense: bool = False, per_node: int = 1) -> float:
        """One exchange's communication, before what hides it: the collectives plus the delay once
        per message round (times the fitted factor)."""
        terms = self.terms(gbps, workers, dense, per_node)
        return fit.comm_ms(terms) + fit.latency_factor * latency_ms * terms["delayed_rounds"]

    def fsdp_ms(self, fit: Fit, gbps: float, workers: int | None = None, latency_ms: float = 0.0,
                per_node: int = 1) -> float:
        """A step's FSDP collectives (exposed: nothing hides them on the CPU), with the delay once per
        round that crosses a link; 0 for a run that is not sharded."""
        if self.sharded is None:
            return 0.0
        terms = self.sharded_terms(gbps, workers, per_node)
        return fit.comm_ms(terms) + fit.latency_factor * latency_ms * terms["delayed_rounds"]

    def step_ms(self, fit: Fit, gbps: float, workers: int | None = None, latency_ms: float = 0.0,
                dense: bool = False, per_node: int = 1) -> float:
        """A step's time; `dense`: a warm-up step's (every step exchanges, nothing hidden but backward)."""
        comm = self.comm_ms(fit, gbps, workers, latency_ms, dense, per_node)
        return (self.fixed_ms + self.fsdp_ms(fit, gbps, workers, latency_ms, per_node)
                + max(0.0, comm - self.hidden_ms(dense)) / (1 if dense else self.every))

    def time_ms(self, steps: float, fit: Fit, gbps: float, workers: int | None = None,
                latency_ms: float = 0.0, per_node: int = 1) -> float:
        """Time to `steps` steps: the warm-up's dense steps, then the mode's own."""
        warm = min(steps, self.warmup_steps)
        return (warm * self.step_ms(fit, gbps, workers, latency_ms, dense=True, per_node=per_node)
                + (steps - warm) * self.step_ms(fit, gbps, workers, latency_ms, per_node=per_node))

    def utilization(self, fit: Fit, gbps: float, workers: int | None = None,
                    latency_ms: float = 0.0) -> float:
        return self.compute_ms / self.step_ms(fit, gbps, workers, latency_ms)

    def memory_bytes(self, workers: int | None = None, per_node: int = 1) -> dict[str, float] | None:
        """A worker's predicted bytes with `workers` workers (default: the run's), `per_node` to a
        machine: parameters, gradients, optimizer state (over the shard group), activations and
        gathered weights, and their `total`; None where the run recorded no memory split."""
        m = self.memory
        if m is None:
            return None
        n = workers or self.workers
        sh = self.sharded
        parts: dict[str, float] = {k: float(v) for k, v in predict_worker_bytes(
            m.numel, m.optim, m.settings, sh.group_at(n) if sh else 1, PARAMETER_BYTES).items()}
        del parts["total"]
        whole = m.numel * PARAMETER_BYTES
        gathered = 0.0
        if sh is not None:
            gathered = whole * min(1.0, (1 + sh.prefetch) / sh.units) if sh.stage == 3 else float(whole)
            if sh.hpz and sh.stage == 3:  # the node's secondary shard, kept from forward to backward
                gathered += whole / min(sh.group_at(n), max(1, per_node))
        parts.update(activations=m.activation_bytes, gathered=gathered)
        return {**parts, "total": sum(parts.values())}

    def scaled(self, numel: float) -> Profile:
        """The profile of the same run with a model of `numel` parameters, k times its own, grown in
        depth and width together (see the module): fixed time and bytes x k, FSDP units' blocks and
        the exchange's calls x k^(1/3), activations x k^(2/3)."""
        if self.memory is None or not self.memory.numel:
            raise ValueError("the run recorded no parameter count (memory_mb): no other model size to "
                             "scale to")
        k = numel / self.memory.numel
        depth = k ** (1 / 3)
        row = {**self.row, **{key: float(self.row[key]) * k for key in _BYTE_KEYS},
               **{key: float(self.row[key]) * depth for key in _CALL_KEYS}}
        sh = self.sharded
        sharded = None
        if sh is not None:
            units = max(1, round((sh.units - 1) * depth)) + 1  # the blocks, and the root
            sharded = replace(sh, units=units, gather_bytes=sh.gather_bytes * k * sh.units / units,
                              scatter_bytes=sh.scatter_bytes * k * sh.units / units)
        memory = replace(self.memory, numel=round(numel),
                         activation_bytes=self.memory.activation_bytes * k ** (2 / 3))
        return replace(self, fixed_ms=self.fixed_ms * k, compute_ms=self.compute_ms * k, row=row,
                       sharded=sharded, memory=memory)


def _memory(results: dict) -> Memory | None:
    """The run's parameters (its model rebuilt on the meta device; else its workers' recorded
    parameter bytes), optimizer and measured activations; None without a memory split."""
    s, config = results["summary"], results.get("config") or {}
    rows = [r for r in s.get("memory_mb") or [] if isinstance(r, dict)]
    if not rows:
        return None
    built = _model_size(config.get("model"))
    if built is not None:
        numel = built[0]
    else:  # a worker's parameters (its shard where sharded), fp32
        shards = int((s.get("sharded") or {}).get("shard_group") or 1)
        numel = round(max(float(r.get("parameters") or 0.0) for r in rows) * MB / PARAMETER_BYTES * shards)
    activations = max(float(r.get("activations") or 0.0) for r in rows) * MB
    choices = config.get("choices") or {}
    return Memory(numel=numel, optim=str(choices.get("optim", "sgd")),
                  settings=dict(config.get("optim") or {}), activation_bytes=activations)


def _sharded(results: dict, memory: Memory | None) -> Sharded | None:
    s, config = results["summary"], results.get("config") or {}
    record = s.get("sharded") or {}
    if record.get("layout") not in ("fsdp", "hsdp"):
        return None
    built = _model_size(config.get("model"))
    units = built[1] if built is not None else 1  # unknown: the whole model one unit
    stage, hpz = int(record.get("stage", 3)), bool(record.get("hpz", False))
    gathers = units * (2 if stage == 3 else 1)
    return Sharded(layout=str(record["layout"]), stage=stage, group=int(record["shard_group"]), hpz=hpz,
                   scatter_alltoall=str(record.get("scatter", "none")) in ("int8", "int4", "loco4"),
                   units=units, prefetch=int(record.get("prefetch", 1)),
                   gather_bytes=float(record.get("bytes_gathered_per_step") or 0.0) / gathers,
                   scatter_bytes=float(record.get("bytes_scattered_per_step") or 0.0) / units)


def _model_size(model: dict | None) -> tuple[int, int] | None:
    """(parameters, FSDP units: compbench.sync.sharded.shard_units and the root) of a run's model
    config; None where it cannot be rebuilt here (none recorded, a pretrained file, a plugin's model
    no longer installed)."""
    if not isinstance(model, dict) or "_target_" not in model or model.get("pretrained"):
        return None
    return _built(json.dumps(model, sort_keys=True))


@cache
def _built(model: str) -> tuple[int, int] | None:
    import torch
    from omegaconf import OmegaConf

    from compbench.catalog import registry
    from compbench.sync.sharded import shard_units

    try:
        with torch.device("meta"):  # nothing allocated
            built = registry.build(OmegaConf.create(json.loads(model)))
    except Exception:  # whatever the model's constructor raises: the recorded parameters count instead
        return None
    return sum(p.numel() for p in built.parameters()), len(shard_units(built)) + 1


def fit_model(rows: list[tuple[Profile, float, float, float, bool]]) -> Fit:
    """Fit the alpha-beta coefficients on (profile, Gbit/s, one-way delay ms, measured step ms, a
    warm-up step) rows: non-negative least squares on relative errors of the exposed communication,
    iterated so that only the rows whose exchange is not fully hidden (the max(0, .) is active)
    constrain it through their exchange; a sharded row's FSDP collectives (exposed every step)
    constrain it always. The delay's factor per message round is fitted where the rows had two
    delays or more; otherwise it stays 1 (each round waits the delay once). Rows of fewer than
    MIN_BANDWIDTHS bandwidths fit nothing: PRIOR."""
    from scipy.optimize import nnls

    if len({gbps for _, gbps, _, _, _ in rows}) < MIN_BANDWIDTHS:
        return PRIOR
    fit_latency = len({latency for _, _, latency, _, _ in rows}) >= 2
    scale = np.array([1.0, 1.0, 1.0, 1e3, 1.0] + ([1.0] if fit_latency else []))
    exposed = [True] * len(rows)  # whose exchange the max(0, .) leaves exposed
    model = PRIOR
    for _ in range(4):
        x, y, w = [], [], []
        for (p, gbps, latency, step, dense), open_ in zip(rows, exposed, strict=True):
            own = p.sharded_terms(gbps)
            if not open_ and not own["delayed_rounds"] and not any(own[k] for k in TERMS):
                continue  # hidden exchange, no FSDP: nothing of the network in this step
            terms = p.terms(gbps, dense=dense) if open_ else {**dict.fromkeys(TERMS, 0.0),
                                                               "delayed_rounds": 0.0}
            every, hidden = (1, p.hidden_ms(dense=True)) if dense else (p.every, p.hidden_ms())
            hidden = hidden if open_ else 0.0
            # step = fixed + fsdp + (comm - hidden) / every
            #   =>  every * fsdp + comm = (step - fixed) * every + hidden
            both = {k: every * own[k] + terms[k] for k in (*TERMS, "delayed_rounds")}
            delay = latency * both["delayed_rounds"]
            x.append(np.array([both[k] for k in TERMS] + ([delay] if fit_latency else [])) * scale)
            y.append((step - p.fixed_ms) * every + hidden - (0.0 if fit_latency else delay))
            w.append(1.0 / max(step * every, 1e-3))
        if len(x) < len(scale):
            break
        coef, _ = nnls(np.array(x) * np.array(w)[:, None], np.array(y) * np.array(w))
        waited, queued, rounds, link, per_byte = (float(c) for c in coef[:5])
        model = Fit(waited, queued, rounds, link, math.inf if per_byte == 0 else 1e3 / per_byte / 1e9,
                    float(coef[5]) if fit_latency else 1.0)
        exposed = [p.comm_ms(model, g, latency_ms=lat, dense=d) > p.hidden_ms(dense=d)
                   for p, g, lat, _, d in rows]
    return model


def crossover_gbps(method: Profile, steps: float, baseline: Profile, baseline_steps: float, fit: Fit,
                   workers: int | None = None, latency_ms: float = 0.0) -> tuple[float | None, str]:
    """The bandwidth below which `method` reaches the target before `baseline` (times to target:
    steps x predicted step time), searched from 0.1 Mbit/s to 100 Gbit/s; (None, why) where it
    beats it everywhere or nowhere in that range."""
    grid = np.logspace(-4, 2, 121)  # Gbit/s
    wins = [method.time_ms(steps, fit, g, workers, latency_ms)
            < baseline.time_ms(baseline_steps, fit, g, workers, latency_ms) for g in grid]
    if all(wins):
        return None, "everywhere"
    if not any(wins):
        return None, "nowhere"
    last = max(i for i, w in enumerate(wins) if w)
    if all(wins[: last + 1]):
        return float(grid[last]), "below"
    return float(grid[last]), "mixed"


def crossover_rtt_ms(method: Profile, steps: float, baseline: Profile, baseline_steps: float, fit: Fit,
                     gbps: float, workers: int | None = None) -> tuple[float | None, str]:
    """The round trip (ms, twice the one-way delay) above which `method` reaches the target before
    `baseline` at `gbps`, searched from 0.01 ms to 2 s; (None, why) where it beats it at every
    round trip in that range or at none."""
    grid = np.logspace(-2, np.log10(2000), 121)  # round trip, ms
    wins = [method.time_ms(steps, fit, gbps, workers, rtt / 2)
            < baseline.time_ms(baseline_steps, fit, gbps, workers, rtt / 2) for rtt in grid]
    if all(wins):
        return None, "everywhere"
    if not any(wins):
        return None, "nowhere"
    first = min(i for i, w in enumerate(wins) if w)
    if all(wins[first:]):
        return float(grid[first]), "above"
    return float(grid[first]), "mixed"
