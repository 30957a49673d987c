"""`sync=halos`: hierarchical asynchronous local SGD (HALoS: Kim et al., "HALoS: Hierarchical
Asynchronous Local SGD over Slow Networks for Geo-Distributed Large Language Model Training", ICML
2025; code github.com/utnslab/halos). The servers' update rules, as equations with the reference's
file and function for each, are in compbench.sync.halos_rules; their threads and wire in
compbench.sync.halos_wire.

The W workers form `regions` (R) regions of W/R contiguous ranks (R must divide engine.np: declared
as `SyncTraits.divides_workers`, checked at compose time). Each worker runs `inner_steps` (H) steps
of the run's optimizer (its state kept across rounds, as the reference's workers keep theirs), then
sends g = θ_start − θ_end to its region's local parameter server (LPS, threads on the region's first
rank) and waits for its answer, the LPS's model θ_L, from which it continues. The LPS applies each
g as it arrives with its delayed Nesterov momentum (`local_lr`, `local_momentum`, `local_delay`);
every `accumulation` (K) updates it sends its change since its last merge to the global parameter
server (GPS, threads on rank 0) without waiting, which applies it with the global delayed Nesterov
momentum (`global_lr`, `global_momentum`, `global_delay`) and answers with θ_G; the LPS merges it
as θ_L ← (1 − α)·θ_L + α·θ_G (`merge_weight`). Workers of one region never wait for each other,
regions never wait for each other; only a worker waits for its own LPS's answer.

Which update an LPS applies first depends on arrival, so a run is not reproducible bit for bit;
the arithmetic is (tests/unit/test_halos_rules.py replays the reference's rules).

Independent learners (`sync_traits.learners_independent`, compbench.train.loop): the workers meet
in no collective while they train, so a fast worker never waits for a straggler (it waits only for
its own LPS, which answers each delivery as it applies it). Rank 0 alone evaluates, on the whole
evaluation set (every rank's shard in rank order), and decides the stop (target, max_train_s,
max_steps).

What rank 0 evaluates: its own worker's parameters right after its latest answer, i.e. θ_L of
region 0 as LPS 0 answered it (the trainer's schedule evaluates at whole rounds, `period_key`; a
final evaluation at a max_steps that ends no round scores θ_L plus rank 0's local steps since). The
reference evaluates the GPS's θ_G (utnslab/halos `exec_halos.py`, `HalosSimulator.on_val_interval`:
`eval_val_loss(self._gps.model)`), and rank 0, which hosts the GPS's thread, could copy θ_G under
`ServerHost.lock`; but the trainer evaluates the module it trains and hands the mode no moment at an
evaluation to put another model in, and giving it one changes the trainer and the shared
`IndependentLearners` protocol that sync=quorum_diloco implements too. What rank 0 evaluates holds
region 0's updates up to its last answer and the other regions' up to the last θ_G LPS 0 merged
(weight α every K updates): with a straggling region, the model the fast region trains on. No
average over the workers and no replica distance are recorded (collectives).

The stop (compbench.sync.halos_wire's module has the messages): rank 0's training over, the trainer
calls `stop_learners`; rank 0's server thread stops LPS 0 and sends STOP to every other LPS that
has not left; from then on each LPS answers every delivery at once with the stop flag instead of
applying it, and the worker ends its training there (`stop_requested`, read by the trainer each
step) and leaves. A worker that reaches max_steps first leaves as before.

Records (results.json `scheduler.halos`): per region, the LPS's updates applied, pushes to the
GPS, global models merged, the staleness of the updates it applied (the LPS updates between
sending a worker θ_L and applying its g), and the deliveries after the stop (`after_stop`, with
their compute seconds `discarded_compute_s`); the GPS's updates per region. Goodput: a g applied
by its LPS counts as compute that entered the model; a round delivered after the stop is not
applied (rank 0 evaluated its last model already: nothing applied later could reach an evaluated
model) and its compute counts as discarded (the summary's `discarded_compute_s`, the regions'
sum). The change an LPS accumulated after its last push when training ends stays in its workers'
models and never reaches θ_G (counted as entered: it is in θ_L). Rank 0's wait at the end for the
others' next delivery (the servers' shutdown, halos_wire) is inside its training loop's time: idle.

Bytes: a delivery books g's bytes (+ the 80-byte header) as sent; every step books the 4n dense
bytes a per-step exchange would send, as sync=diloco does; the wait for the answer is exposed
communication. The servers' own traffic (u and θ_G between regions) is booked by no worker.

Not supported (refused at compose time): engines other than engine=torch, engine.elastic,
compressors (g travels dense), sharding, and checkpoints (checkpoint=true, checkpoint_every_steps,
resume: `SyncTraits.checkpoints`): the servers' state, with the messages in flight between their
threads, is not captured, so a resume could not continue the same run. The mode's recipe sets
checkpoint=false, so a plain `sync=halos` run writes none.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compbench.base.values import is_int, is_number
from compbench.engines.base import Engine
from compbench.engines.torch_dist import TorchEngine
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model
from compbench.sync.diloco import RECIPE as DILOCO_RECIPE
from compbench.sync.halos_rules import GlobalServer, LocalServer, ServerOptim
from compbench.sync.halos_wire import (
    HEADER,
    Groups,
    Layout,
    ServerHost,
    Stop,
    WorkerDelta,
    WorkerLeave,
    receive_theta,
    send_delta,
    send_leave,
)
from compbench.sync.round_learner import RoundLearner

# DiLoCo's clipping (the reference's workers clip at 1.0 too: src/halos/worker.py, `_grad_clip`), and
# no checkpoint (see the module): a run writes none unless the user asks, and then it is refused.
RECIPE = {**DILOCO_RECIPE, "checkpoint": False}


def check_options(inner_steps: int = 8, regions: int = 1, local_lr: float = 0.2, local_momentum: float = 0.9,
                  local_delay: int = 16, global_lr: float = 0.15, global_momentum: float = 0.5,
                  global_delay: int = 2, merge_weight: float = 0.25, accumulation: int = 32,
                  momentum_activation: float = 0.0) -> None:
    """Config-time check of sync=halos's settings (regions against the workers: `check_workers`)."""
    for key, value, fix in (("inner_steps", inner_steps, "8 (H: a worker's local steps per update)"),
                            ("regions", regions, "2 (regions of contiguous ranks, each with its LPS)"),
                            ("local_delay", local_delay, "16 (the LPS's momentum moves every 16 updates)"),
                            ("global_delay", global_delay, "2 (the GPS's momentum moves every 2 pushes)"),
                            ("accumulation", accumulation, "32 (K: LPS updates between pushes to the GPS)")):
        if not is_int(value) or value < 1:
            raise ValueError(f"sync.{key}={value} must be an integer >= 1; pass e.g. sync.{key}={fix}")
    for key, rate, fix in (("local_lr", local_lr, "0.2"), ("global_lr", global_lr, "0.15")):
        if not is_number(rate) or not rate > 0:
            raise ValueError(f"sync.{key}={rate} must be a number > 0 (a server's learning rate); pass e.g. "
                             f"sync.{key}={fix}")
    for key, beta, fix in (("local_momentum", local_momentum, "0.9"),
                           ("global_momentum", global_momentum, "0.5"),
                           ("momentum_activation", momentum_activation, "0")):
        if not is_number(beta) or not 0 <= beta < 1:
            raise ValueError(f"sync.{key}={beta} must be a number in [0, 1); pass e.g. sync.{key}={fix}")
    if not is_number(merge_weight) or not 0 < merge_weight <= 1:
        raise ValueError(f"sync.merge_weight={merge_weight} must be a number in (0, 1] (α: an LPS takes "
                         "(1 − α)·θ_L + α·θ_G); pass e.g. sync.merge_weight=0.25")


def check_workers(workers: int, regions: int) -> None:
    """Regions against the job's workers (compose time where engine.np is known, and at start)."""
    if workers % regions:
        raise ValueError(f"sync.regions={regions} does not divide the {workers} workers; pass a divisor of "
                         f"{workers} (e.g. sync.regions=1)")


class Halos(RoundLearner):
    """HALoS's workers around their LPSs and the GPS (see the module)."""

    name = "halos"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(pipeline=False, per_step=False, period_key="inner_steps",
                                                   engines=("torch",), pattern="ps", recipe=RECIPE,
                                                   replicas_diverge=True, elastic=False,
                                                   divides_workers=("regions",), checkpoints=False,
                                                   learners_independent=True)
    check_options = staticmethod(check_options)
    check_model = staticmethod(fits_any_model)
    pipeline = None
    scheduler = None

    def __init__(self, engine: Engine, stats: StepStats, inner_steps: int = 8, regions: int = 1,
                 local_lr: float = 0.2, local_momentum: float = 0.9, local_delay: int = 16,
                 global_lr: float = 0.15, global_momentum: float = 0.5, global_delay: int = 2,
                 merge_weight: float = 0.25, accumulation: int = 32,
                 momentum_activation: float = 0.0) -> None:
        check_options(inner_steps, regions, local_lr, local_momentum, local_delay, global_lr, global_momentum,
                      global_delay, merge_weight, accumulation, momentum_activation)
        check_workers(engine.size, regions)
        self.engine, self.stats = engine, stats
        self.inner_steps = int(inner_steps)
        self.layout = Layout(engine.size, int(regions))
        self.local = ServerOptim(float(local_lr), float(local_momentum), int(local_delay),
                                 float(momentum_activation))
        self.globl = ServerOptim(float(global_lr), float(global_momentum), int(global_delay),
                                 float(momentum_activation))
        self.merge_weight, self.accumulation = float(merge_weight), int(accumulation)
        self.region = self.layout.region_of(engine.rank)
        self.lps = self.layout.lps_rank(self.region)
        self.start_rounds()  # `version`: the LPS version this worker's θ_start came from
        self.host: ServerHost | None = None

    def setup(self, model: nn.Module) -> nn.Module:
        if not isinstance(self.engine, TorchEngine) or self.engine.group is not None:
            raise ValueError("sync=halos sends point to point over torch.distributed's world: add "
                             "engine=torch (and no sharding)")
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"sync=halos sends a model difference as one flat tensor, and the model's "
                             f"trainable parameters have several dtypes ({sorted(map(str, dtypes))})")
        self.dtype = dtypes.pop()
        self.numel = sum(p.numel() for p in self.params)
        # θ_start: every rank starts from rank 0's parameters (the trainer broadcast them).
        self.start = [p.detach().clone() for p in self.params]
        self.groups = Groups.make()  # collective: every rank, in the same order
        if self.engine.rank == self.lps:
            theta0 = self.flat_params()
            lps = LocalServer(theta0.clone(), self.local, self.merge_weight, self.accumulation)
            gps = GlobalServer(theta0.clone(), self.globl) if self.engine.rank == 0 else None
            self.host = ServerHost(self.engine.rank, self.layout, self.groups, lps, gps)
        return model

    @torch.no_grad()
    def flat_params(self) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    @torch.no_grad()
    def deliver(self) -> None:
        """Send g = θ_start − θ_end to the LPS; continue from the θ_L it answers."""
        g = torch.cat([(s - p).reshape(-1) for s, p in zip(self.start, self.params, strict=True)])
        self.stats.bytes_sent += g.numel() * g.element_size() + 8 * HEADER
        self.stats.calls_dense += 1
        with self.stats.time("comm", exposed=True):
            if self.host is not None:
                self.host.submit(WorkerDelta(self.engine.rank, self.version, self.compute_s, g))
                version, self.stopped, theta = self.host.wait_reply()
            else:
                send_delta(self.groups, self.lps, self.version, self.compute_s, g)
                version, self.stopped, theta = receive_theta(self.groups, self.lps, self.numel, self.dtype)
        self.adopt(version, theta.to(self.params[0].device))  # after the stop: θ_L unchanged by this g
        self.compute_s = 0.0

    def adopt(self, version: int, theta: Tensor) -> None:
        begin = 0
        for s, p in zip(self.start, self.params, strict=True):
            piece = theta[begin : begin + p.numel()].view_as(p)
            p.copy_(piece)
            s.copy_(piece)
            begin += p.numel()
        self.version = version

    def stop_learners(self) -> None:
        """compbench.sync.IndependentLearners (rank 0, its training over): every LPS answers each
        later delivery with the stop, and applies none of them."""
        assert self.host is not None and self.host.gps is not None, "only rank 0 stops the workers"
        self.host.submit(Stop())

    def leave(self) -> None:
        """The end of training (RoundLearner.drain)."""
        if self.host is not None:
            self.host.submit(WorkerLeave(self.engine.rank))
            self.host.join()
        else:
            send_leave(self.groups, self.lps)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "inner_steps": self.inner_steps,
                               "regions": self.layout.regions,
                               "local": vars(self.local).copy(), "global": vars(self.globl).copy(),
                               "merge_weight": self.merge_weight, "accumulation": self.accumulation,
                               "rounds": self.rounds, "discarded_compute_s": 0.0}
        host = self.host
        if host is not None and host.gps is not None:
            with host.lock:
                regions = dict(host.regions_left)
                if host.region not in regions:  # summary before the end: LPS 0's counts so far
                    regions[host.region] = host.lps.counts.record()
                out["discarded_compute_s"] = round(sum(float(r["discarded_compute_s"])
                                                       for r in regions.values()), 3)
                out["halos"] = {"regions": {str(r): regions[r] for r in sorted(regions)},
                                "global_updates": host.gps.counts.updates,
                                "global_per_region": {str(r): n for r, n in
                                                      sorted(host.gps.counts.per_region.items())}}
        return out

    def exchange_plan(self) -> ExchangePlan:
        """One delivery every H steps, to one server (a parameter server's pattern)."""
        return ExchangePlan(every=self.inner_steps, pattern="ps")

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("sync=halos does not checkpoint (refused at compose time): pass checkpoint=false")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise RuntimeError("sync=halos does not resume (refused at compose time)")
