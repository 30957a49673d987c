"""`sync=quorum_diloco`: DiLoCo whose outer step does not wait for every worker, after Decoupled
DiLoCo (Douillard et al., "Decoupled DiLoCo for Resilient Distributed Pre-training", arXiv
2604.21428, 2026). Related references: hivemind's averager (learning-at-home/hivemind: its
matchmaking waits a bounded time for peers, the idea of the adaptive window here) and torchft
(meta-pytorch/torchft `local_sgd.py`: DiLoCo over a quorum of the replicas that are alive).

Every worker is a learner running DiLoCo's inner steps: `inner_steps` (H) steps of the run's
optimizer from the global parameters θ. At its round's end a learner sends its outer gradient
Δ = θ_base − θ_local (θ_base: the θ it started from, at version b), the tokens it trained on, its
compute seconds and its step count, point to point to the synchronizer (threads on rank 0,
compbench.sync.quorum_server), and waits for its answer: the θ it continues from. The
synchronizer (compbench.sync.quorum_merge) merges once `quorum` learners delivered on the current
θ, waiting a grace window (`window_s`: seconds, `adaptive`, or null: unbounded) for the rest,
weighting each Δ by its tokens (`weighting`), and steps θ with DiLoCo's outer optimizer (Nesterov
SGD: `outer_lr`, `outer_momentum`, `nesterov`). A learner that delivered on the current θ waits
for the merge it is in; a late one (it straggled: its θ is older, or it is behind in steps) is
answered at once with the latest θ and its Δ goes into the next merge, or, older than
`max_staleness` merges, is discarded and counted.

With no faults and `quorum` = every worker (the default, null) every merge takes every learner and
every learner waits for it: DiLoCo's rounds. The merge is then DiLoCo's mean (a sum, then one
division), so with 2 workers the run equals sync=diloco bit for bit (tests/dist/test_quorum_diloco.py);
with more, gloo's allreduce sums in its own order and the runs agree within rounding.

Tokens: a learner counts the units of every training batch its model sees (a forward pre-hook, in
training mode, inside a step): a tensor of token ids (integers) counts its elements, anything
else its first dimension (samples). In compbench's loop every learner runs H steps of equal
batches, so token weights are equal unless batches differ; they matter where learners run
different numbers of steps per round.

Compute seconds: a round's steps' forward, backward and optimizer phases as the step's statistics
book them (the same split compbench.records.goodput takes), so the synchronizer knows how much
compute entered the model and how much was discarded (results.json: `scheduler.quorum`, and
`summary.goodput`).

Bytes: a delivery books Δ's bytes (+ its 40-byte header) as sent; every step books the 4n dense
bytes a per-step exchange would send, as sync=diloco does. The answer (θ, n elements) is received,
not sent. The wait for the answer is booked as exposed communication.

Independent learners (`sync_traits.learners_independent`, compbench.train.loop): the learners meet
in no collective while they train, so a fast one never waits for a straggler except in the merge it
is in (at most the grace window). Rank 0 alone evaluates, on the whole evaluation set (every rank's
shard in rank order: with 2 workers the sums of the collective evaluation, bit for bit), and the
model it evaluates is its own right after its round's answer: the θ the synchronizer had then (the
latest merge, which took rank 0's Δ; a merge after that answer is in the next evaluation). A
final evaluation at a step that ends no round evaluates rank 0's local parameters. No replica
diagnosis (a collective); the trainer records no skew. Rank 0 alone decides its target and budget;
once its training ends it calls `stop_learners` (before the final checkpoint, a collective the
others then join) and every later answer carries the stop: the other learners stop at their next
delivery (`stop_requested`, read by the trainer each step), their round discarded and counted
(quorum_merge's `after_stop`): it never reaches the evaluated model. A learner that reaches
max_steps first leaves as before. Compose time refuses what would make the learners meet mid-run:
on_nonfinite=skip (an allreduce per step) and checkpoint_every_steps. The checkpoint at an epoch's
end stays a collective: there the learners meet (a run of one epoch, as the race's, has none
mid-run). With the default quorum (every worker) the learners move in lock-step anyway and the
run equals sync=diloco bit for bit, its evaluations included (tests/dist/test_quorum_diloco.py).

End of training: `drain` outside a step (the trainer's, after the last evaluation and checkpoint)
makes the learner leave; rank 0's waits for the synchronizer's threads to end (pending late
contributions are then discarded and counted). A `drain` inside a step (a dropped non-finite step)
has nothing in flight: a learner's exchange finishes inside `after_step`.

Checkpoints: every learner saves its θ_base, version, round position, local parameters and inner
optimizer; rank 0 also the synchronizer's θ, outer optimizer, pending contributions (their Δs) and
ledger. With a quorum of every worker a resume mid-round is exact (tests/dist/test_quorum_diloco.py);
with a window, a merge whose window closes while the checkpoint is being taken lands before or after
the snapshot (held under a lock), so such a resume is consistent but not the same run.

Not supported (refused at compose time): engines other than engine=torch, engine.elastic (the
synchronizer's state lives on rank 0), compressors (Δ travels dense: compressor, memory and comm
stay at their defaults), sharding.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from compbench.base.values import is_int, is_number
from compbench.engines.base import Engine
from compbench.engines.torch_dist import TorchEngine
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model
from compbench.sync.diloco import RECIPE
from compbench.sync.diloco import check_options as check_diloco
from compbench.sync.quorum_merge import ADAPTIVE, WEIGHTINGS, Contribution, QuorumSettings, QuorumState
from compbench.sync.quorum_server import (
    HEADER,
    Leave,
    QuorumServer,
    Stop,
    receive_theta,
    send_delivery,
    send_leave,
)
from compbench.sync.round_learner import RoundLearner


def check_options(inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                  nesterov: bool = True, quorum: int | None = None, window_s: float | str | None = ADAPTIVE,
                  window_factor: float = 0.1, weighting: str = "tokens", max_staleness: int = 4) -> None:
    """Config-time check of sync=quorum_diloco's settings (the quorum against the workers:
    `check_workers`)."""
    check_diloco(inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum, nesterov=nesterov)
    if quorum is not None and (not is_int(quorum) or quorum < 1):
        raise ValueError(f"sync.quorum={quorum} must be an integer >= 1 (learners a merge needs); pass e.g. "
                         "sync.quorum=3, or sync.quorum=null (every worker: DiLoCo)")
    if isinstance(window_s, str):
        if window_s != ADAPTIVE:
            raise ValueError(f"sync.window_s={window_s} is unknown; pass seconds (e.g. sync.window_s=2.0), "
                             f"sync.window_s={ADAPTIVE} or sync.window_s=null (wait for every learner)")
    elif window_s is not None and (not is_number(window_s) or not window_s > 0):
        raise ValueError(f"sync.window_s={window_s} must be seconds > 0 (the grace window after the quorum); "
                         f"pass e.g. sync.window_s=2.0, sync.window_s={ADAPTIVE}, or sync.window_s=null "
                         "(wait for every learner)")
    if not is_number(window_factor) or not window_factor > 0:
        raise ValueError(f"sync.window_factor={window_factor} must be a number > 0 (the adaptive window in "
                         "median round times); pass e.g. sync.window_factor=0.1")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"sync.weighting={weighting} is unknown; pass sync.weighting=tokens (by the tokens "
                         "each learner trained on) or sync.weighting=uniform")
    if not is_int(max_staleness) or max_staleness < 0:
        raise ValueError(f"sync.max_staleness={max_staleness} must be an integer >= 0 (merges a late outer "
                         "gradient may lag by); pass e.g. sync.max_staleness=4 (0: discard every late one)")


def check_workers(workers: int, quorum: int | None) -> None:
    """The quorum against the job's workers (compose time where engine.np is known, and at start)."""
    if quorum is not None and quorum > workers:
        raise ValueError(f"sync.quorum={quorum} is more than the {workers} workers: no merge could happen; "
                         f"pass sync.quorum<={workers} (or null: every worker)")


def batch_units(x: Tensor) -> int:
    """Tokens of a batch of token ids (its elements), else its samples (first dimension)."""
    if not x.is_floating_point() and not x.is_complex():
        return x.numel()
    return int(x.shape[0]) if x.dim() else 1


class QuorumDiLoCo(RoundLearner):
    """DiLoCo's learners around a quorum synchronizer on rank 0 (see the module)."""

    name = "quorum_diloco"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(pipeline=False, per_step=False, period_key="inner_steps",
                                                   engines=("torch",), pattern="ps", recipe=RECIPE,
                                                   replicas_diverge=True, elastic=False,
                                                   at_most_workers=("quorum",), learners_independent=True)
    check_options = staticmethod(check_options)
    check_model = staticmethod(fits_any_model)
    pipeline = None
    scheduler = None

    def __init__(self, engine: Engine, stats: StepStats, inner_steps: int = 50, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True, quorum: int | None = None,
                 window_s: float | str | None = ADAPTIVE, window_factor: float = 0.1,
                 weighting: str = "tokens", max_staleness: int = 4) -> None:
        check_options(inner_steps, outer_lr, outer_momentum, nesterov, quorum, window_s, window_factor,
                      weighting, max_staleness)
        check_workers(engine.size, quorum)
        self.engine, self.stats = engine, stats
        self.inner_steps = int(inner_steps)
        self.settings = QuorumSettings(quorum, window_s, float(window_factor), weighting, int(max_staleness),
                                       float(outer_lr), float(outer_momentum), bool(nesterov))
        self.start_rounds()  # `version`: the θ version this learner trains on
        self.tokens = 0  # tokens of the current round
        self.server: QuorumServer | None = None

    def setup(self, model: nn.Module) -> nn.Module:
        if not isinstance(self.engine, TorchEngine) or self.engine.group is not None:
            raise ValueError("sync=quorum_diloco sends point to point over torch.distributed's world: add "
                             "engine=torch (and no sharding)")
        self.params = [p for p in model.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"sync=quorum_diloco sends the outer gradient as one flat tensor, and the "
                             f"model's trainable parameters have several dtypes ({sorted(map(str, dtypes))})")
        self.dtype = dtypes.pop()
        self.numel = sum(p.numel() for p in self.params)
        # θ_base: every rank starts from rank 0's parameters (the trainer broadcast them).
        self.base = [p.detach().clone() for p in self.params]
        model.register_forward_pre_hook(self._count_tokens)
        # Two groups of the whole world, each used by one thread per process (see quorum_server);
        # new_group is collective: every rank makes both, in this order.
        self.deliveries = dist.new_group(backend="gloo")
        self.replies = dist.new_group(backend="gloo")
        if self.engine.rank == 0:
            state = QuorumState([p.detach().clone() for p in self.params], self.engine.size, self.settings)
            self.server = QuorumServer(state, self.engine.size, self.numel, self.dtype, self.deliveries,
                                       self.replies)
        return model

    def _count_tokens(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if module.training and self.in_step and args and isinstance(args[0], Tensor):
            self.tokens += batch_units(args[0])

    @torch.no_grad()
    def deliver(self) -> None:
        """Send Δ = θ_base − θ_local with its worth; continue from the θ the synchronizer answers."""
        delta = torch.cat([(b - p).reshape(-1) for b, p in zip(self.base, self.params, strict=True)])
        self.stats.bytes_sent += delta.numel() * delta.element_size() + 8 * HEADER
        self.stats.calls_dense += 1
        with self.stats.time("comm", exposed=True):
            if self.server is not None:
                self.server.submit(Contribution(0, self.version, self.taken, self.tokens, self.compute_s,
                                                delta))
                version, theta = self.server.wait_reply()
            else:
                send_delivery(self.deliveries, self.version, self.taken, self.tokens, self.compute_s, delta)
                version, self.stopped, theta = receive_theta(self.replies, self.numel, self.dtype)
        self.adopt(version, theta.to(self.params[0].device))
        self.tokens, self.compute_s = 0, 0.0

    def adopt(self, version: int, theta: Tensor) -> None:
        start = 0
        for b, p in zip(self.base, self.params, strict=True):
            piece = theta[start : start + p.numel()].view_as(p)
            p.copy_(piece)
            b.copy_(piece)
            start += p.numel()
        self.version = version

    def stop_learners(self) -> None:
        """compbench.sync.IndependentLearners (rank 0, its training over): the synchronizer answers
        every later delivery with the stop."""
        assert self.server is not None, "only rank 0 stops the learners"
        self.server.submit(Stop())

    def leave(self) -> None:
        """The end of training (RoundLearner.drain)."""
        if self.server is not None:
            self.server.submit(Leave(0))
            self.server.join()
        else:
            send_leave(self.deliveries)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "inner_steps": self.inner_steps, **self.settings.record(),
                               "rounds": self.rounds}
        if self.server is not None:
            with self.server.lock:
                out["quorum_record"] = self.server.state.ledger.record()
                # compbench.records.goodput: compute that never entered the model
                out["discarded_compute_s"] = out["quorum_record"]["discarded_compute_s"]
                out["version"] = self.server.state.version
        return out

    def exchange_plan(self) -> ExchangePlan:
        """One delivery every H steps, to one synchronizer (a parameter server's pattern)."""
        return ExchangePlan(every=self.inner_steps, pattern="ps")

    def state_dict(self) -> dict[str, Any]:
        state = {"inner": self.inner, "rounds": self.rounds, "taken": self.taken, "version": self.version,
                 "tokens": self.tokens, "compute_s": self.compute_s,
                 "base": [b.clone() for b in self.base],
                 "local_params": [p.detach().clone() for p in self.params],
                 "inner_optimizer": self.inner_optimizer.state_dict()}
        if self.server is not None:
            state["synchronizer"] = self.server.state_dict()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner, self.rounds, self.taken = int(state["inner"]), int(state["rounds"]), int(state["taken"])
        self.version, self.tokens = int(state["version"]), int(state["tokens"])
        self.compute_s = float(state["compute_s"])
        for b, saved in zip(self.base, state["base"], strict=True):
            b.copy_(saved)
        for p, saved in zip(self.params, state["local_params"], strict=True):
            p.copy_(saved)
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
        if self.server is not None:
            self.server.load_state_dict(state["synchronizer"])
