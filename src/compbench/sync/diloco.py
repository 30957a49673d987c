"""`sync=diloco`: DiLoCo's rounds (Douillard et al., 2023; reference PrimeIntellect-ai/diloco_simple
`pure_torch_diloco.py`, meta-pytorch/torchft `torchft/local_sgd.py`), and Streaming DiLoCo's
fragments, overlap and mixing as its options (Douillard et al., 2025).

Every worker starts a round from the global parameters θ and runs `inner_steps` (H) steps of the
run's optimizer (`optim=`, e.g. AdamW; its state persists across rounds) without talking. Then the
outer gradient Δ = θ − θ_local goes, tensor by tensor, through compbench's pipeline (memory ->
compressor -> communicator: the `compressor`, `memory` and `comm` groups), its average becomes θ's
gradient, the outer optimizer (SGD, Nesterov momentum; `outer_lr`, `outer_momentum`) steps θ, and
every worker continues from the new θ. Bytes per step = a round's bytes / H: the steps inside a
round book 0 bytes sent (and the 4n dense bytes a per-step exchange would send, so the effective
ratio compares with DDP) and every step counts in the run's per-step figures.

Streaming DiLoCo (`fragments` P, `overlap` τ, `mix` α; the defaults 1, 0, 0.0 are DiLoCo exactly):
- Fragments: the trainable tensors, in `model.named_parameters()` order, are dealt out strided,
  tensor i to fragment i % P (the paper's strided pattern, at the granularity of whole tensors).
- Schedule: H must be a multiple of P; with h = H/P and s the number of steps taken, fragment p
  starts its exchange after step s whenever s = (p+1)·h + k·H (k = 0, 1, ...): one fragment every h
  steps, fragment p offset by p·h, each once per H steps, the last one on DiLoCo's steps H, 2H, ...
  (torchft's first `_StreamingDiLoCoFragment` schedule, offsets floor(H/P·(p+1))). Fragment 0's
  first exchange thus comes after h steps, as in the reference.
- Overlap: at its start the fragment's Δ is submitted (`pipeline.submit` per tensor) and only
  collected τ inner steps later (τ < h, so at most one exchange is in flight and `pipeline.collect`
  returns exactly it); the worker keeps stepping meanwhile. Then θ's fragment takes the outer step
  and the worker's fragment merges: θ_local ← α·θ_local + (1−α)·θ_new, with θ_local the local
  parameters at that moment (τ steps after Δ was taken; torchft's `_merge_parameters`, a lerp from
  θ_new towards the local copy by `fragment_update_alpha`). α = 0 replaces, as DiLoCo does.
- One Nesterov SGD holds every θ tensor; an outer step sets the gradients of the fragment's tensors
  only, and torch's SGD skips parameters without a gradient, so the other fragments' momentum stays.
- Bytes: the start step books what the fragment sends; every step books 4n dense bytes in all.
- A checkpoint taken while an exchange is in flight collects it in `state_dict` and keeps the
  average, applied at its scheduled step (saved with the state), so a resumed run is exact.
- Round counting (`rounds`, the pipeline's step for `dense_steps` and the compressor) stays per H
  steps: fragment p's k-th exchange is the pipeline's step k.
- Timing (`timing`): "after" (the paper's) starts a fragment's exchange at its step and applies it
  `overlap` steps later; "before" (torchft's `fragment_sync_delay`) takes Δ `overlap` steps before
  the fragment's step and applies it at that step.
- One exchange per fragment: where the communicator packs (allgather, allreduce, ps:
  `GradientPipeline.submit_many`), the fragment's tensors travel in one collective per stage.

Eager updates (`eager`, Kale, Douillard, Donchev 2025, arXiv 2502.12996), for DiLoCo and Streaming
DiLoCo alike: at its step a fragment submits its Δ and steps at once, without waiting, with the eager
outer gradient Δ/N + (Δ̄' − Δ'/N): this worker's fresh contribution and the other workers' ones
from the fragment's previous exchange (Δ̄' its average, Δ' this worker's part of it; nothing the
first time). The exchange overlaps everything until the fragment's next step (H steps for DiLoCo,
at least H/P with P fragments: all exchanges in flight are collected then), where its average is
folded in. Each worker's θ then differs from the others' by its own last contribution (bounded;
the sum of the averages is common). `overlap` must stay 0: the exchange overlaps the whole round.

Per-worker sync intervals (`inner_steps_per_worker`: null, a list of H_r per worker, or `adaptive`;
compbench.sync.per_worker_steps): a round stays H loop steps for everyone, worker r trains the first
H_r of them and idles the rest (`step_share`), and the round's outer gradients are averaged weighted by
the tokens each worker trained (N·w_r·Δ_r into the pipeline's mean, w_r = H_r / sum H). Unset, nothing
changes; with every H_r equal the weights are exactly 1 and the run is DiLoCo's bit for bit.

Compositions, not new code paths:
- DiLoCo: compressor=none comm=allreduce (the dense allreduce of the reference).
- Streaming DiLoCo's quantized outer gradients: compressor=fp16 or compressor=qsgd.
- SparseLoCo: compressor=sparseloco comm=allgather memory=residual memory.beta=0.95
  memory.gamma=<outer lr>, outer_momentum=0 (the error accumulator replaces momentum).

The outer gradient is scaled by `outer_lr` in the outer step only; memory=residual's `gamma` scales
what enters the error accumulator (SparseLoCo's e = βe + αΔ, with outer_lr then 1).
The selection rules apply per tensor, with the round's index counting as the step for
`dense_steps` (rounds sent dense).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compbench.base.values import is_int, is_number
from compbench.engines.base import Engine
from compbench.optim.optimizers import optimizer_over
from compbench.records.stats import StepStats
from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import ExchangePlan, StepShare, SyncTraits
from compbench.sync.per_worker_steps import PerWorkerPlan, check_setting
from compbench.sync.step import load_pipeline_state, pipeline_state

TIMINGS = ("after", "before")


# Every inner step clipped to gradient norm 1.0 unless the user sets optim.clip_grad_norm: the
# references' inner loop (OpenDiLoCo's, SparseLoCo's templar) clips so.
RECIPE = {"optim.clip_grad_norm": 1.0}


def check_options(inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                  nesterov: bool = True, fragments: int = 1, overlap: int = 0, mix: float = 0.0,
                  timing: str = "after", eager: bool = False,
                  inner_steps_per_worker: list[int] | str | None = None) -> None:
    """Config-time check of sync=diloco's settings (the per-worker steps against the job:
    compbench.sync.per_worker_steps.check_job)."""
    if not is_int(inner_steps) or inner_steps < 1:
        raise ValueError(f"sync.inner_steps={inner_steps} must be an integer >= 1 (steps per round)")
    for key, value, low in (("outer_lr", outer_lr, 0.0), ("outer_momentum", outer_momentum, 0.0)):
        if not is_number(value) or not value >= low:
            raise ValueError(f"sync.{key}={value} must be a number >= {low:g}")
    if float(outer_lr) == 0.0:
        raise ValueError("sync.outer_lr=0 would never move the global parameters; "
                         "pass e.g. sync.outer_lr=0.7")
    if float(outer_momentum) >= 1.0:
        raise ValueError(f"sync.outer_momentum={outer_momentum} must be < 1")
    if nesterov and float(outer_momentum) == 0.0:
        raise ValueError("sync.nesterov=true needs sync.outer_momentum > 0; pass sync.nesterov=false")
    if not isinstance(nesterov, bool):
        raise ValueError(f"sync.nesterov={nesterov} must be true or false")
    if not is_int(fragments) or fragments < 1:
        raise ValueError(f"sync.fragments={fragments} must be an integer >= 1; pass sync.fragments=1 "
                         "(the whole model at once, DiLoCo) or more")
    if not is_int(overlap) or overlap < 0:
        raise ValueError(f"sync.overlap={overlap} must be an integer >= 0 (inner steps an exchange "
                         "overlaps); pass sync.overlap=0 (none, DiLoCo) or more")
    if not is_number(mix) or not 0.0 <= mix < 1.0:
        raise ValueError(f"sync.mix={mix} must be a number in [0, 1) (the local fragment's weight at the "
                         "merge); pass sync.mix=0 (replace it, DiLoCo) or e.g. sync.mix=0.5")
    if inner_steps % fragments:
        multiple = -(-inner_steps // fragments) * fragments
        raise ValueError(f"sync.inner_steps={inner_steps} is not a multiple of sync.fragments={fragments} "
                         f"(one fragment every inner_steps/fragments steps); pass "
                         f"sync.inner_steps={multiple}")
    if timing not in TIMINGS:
        raise ValueError(f"sync.timing={timing} is unknown; pass sync.timing=after (the exchange starts at "
                         "the fragment's step) or sync.timing=before (it ends there, torchft's)")
    if not isinstance(eager, bool):
        raise ValueError(f"sync.eager={eager} must be true or false")
    if eager and (overlap or timing != "after"):
        raise ValueError("sync.eager=true overlaps each exchange with the whole round; drop sync.overlap "
                         "and sync.timing")
    every = inner_steps // fragments
    if overlap >= every:
        raise ValueError(f"sync.overlap={overlap} must be < sync.inner_steps/sync.fragments={every} (one "
                         f"fragment's exchange in flight at a time); pass sync.overlap={every - 1}"
                         + (" or less" if every > 1 else "") + " or a larger sync.inner_steps")
    check_setting(inner_steps_per_worker, inner_steps)
    if inner_steps_per_worker is not None and (fragments != 1 or overlap):
        raise ValueError("sync.inner_steps_per_worker weights a whole round's outer gradients, and a "
                         "fragment exchanged mid-round would hold fewer of a slow worker's steps; pass "
                         "sync.fragments=1 and sync.overlap=0")


def check_fragments(fragments: int, tensors: int) -> None:
    if fragments > tensors:
        raise ValueError(f"sync.fragments={fragments} is more than the model's {tensors} trainable tensors "
                         f"(a fragment is whole tensors); pass sync.fragments={tensors} or less")


class DiLoCo:
    """Local steps, then an outer step on the averaged outer gradient, whole or per fragment (see
    the module)."""

    name = "diloco"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(per_step=False, period_key="inner_steps", recipe=RECIPE,
                                                   replicas_diverge=True, shards=True,
                                                   per_worker_key="inner_steps_per_worker")
    check_options: ClassVar[Callable[..., None]] = staticmethod(check_options)  # a subclass adds settings
    scheduler = None

    @staticmethod
    def check_model(model: nn.Module, fragments: int = 1, **_: Any) -> None:
        check_fragments(int(fragments), sum(1 for p in model.parameters() if p.requires_grad))
  # the outer gradient goes tensor by tensor, once per round

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, engine: Engine, stats: StepStats,
                 inner_steps: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, fragments: int = 1, overlap: int = 0, mix: float = 0.0,
                 timing: str = "after", eager: bool = False,
                 inner_steps_per_worker: list[int] | str | None = None) -> None:
        check_options(inner_steps, outer_lr, outer_momentum, nesterov, fragments, overlap, mix, timing,
                      eager, inner_steps_per_worker)
        self.pipeline, self.engine, self.stats = pipeline, engine, stats
        self.inner_steps, self.outer_lr = int(inner_steps), float(outer_lr)
        self.outer_momentum, self.nesterov = float(outer_momentum), bool(nesterov)
        self.fragments, self.overlap, self.mix = int(fragments), int(overlap), float(mix)
        self.timing, self.eager = timing, eager
        self.every = self.inner_steps // self.fragments  # h: steps between two fragments' starts
        # "before": an exchange starts `overlap` steps ahead of its fragment's step
        self.lead = self.overlap if timing == "before" else 0
        self.inner = 0  # steps taken in the current round (H steps)
        self.rounds = 0
        # The exchange in flight: its fragment, the step count it started at, and (after a
        # checkpoint collected it early) its average, waiting for its scheduled step.
        self.inflight: int | None = None
        self.started = 0
        self.averaged: list[Tensor] | None = None
        # Eager: the fragments whose exchanges are in flight (in submission order), this worker's
        # part Δ/N of each tensor's last exchange, and the others' part Δ̄ − Δ/N of the one before.
        self.eager_pending: list[int] = []
        # Per-worker sync intervals: this round's H_r of every worker (None: all train every step).
        self.per_worker = (None if inner_steps_per_worker is None
                           else PerWorkerPlan(inner_steps_per_worker, self.inner_steps, engine))

    def setup(self, model: nn.Module) -> nn.Module:
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        check_fragments(self.fragments, len(self.params))
        # Strided: tensor i belongs to fragment i % P.
        self.members = [list(range(p, len(self.params), self.fragments)) for p in range(self.fragments)]
        # θ, the global parameters: every rank holds the same copy (the trainer broadcast rank 0's).
        self.outer_params = [p.detach().clone() for _, p in self.params]
        self.outer = torch.optim.SGD(self.outer_params, lr=self.outer_lr, momentum=self.outer_momentum,
                                     nesterov=self.nesterov)
        self.numel = sum(p.numel() for _, p in self.params)
        if self.eager:
            self.mine = [torch.zeros_like(t) for t in self.outer_params]
            self.others = [torch.zeros_like(t) for t in self.outer_params]
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.inner_optimizer = optimizer_over(model, [p for _, p in self.params], optim)
        return self.inner_optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        # The compressor's step counter and the selection's warm-up count rounds: they see one
        # exchange per round (per fragment).
        self.pipeline.begin_step(self.rounds, epoch)

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # inner steps: each worker steps on its own gradients

    def step_share(self) -> StepShare:
        """Whether this worker trains the round's coming step, and how many workers do."""
        if self.per_worker is None:
            return StepShare(True, self.engine.size)
        return StepShare(self.per_worker.trains(self.inner), self.per_worker.workers_at(self.inner))

    def after_step(self) -> None:
        """Every loop step, trained or idle (per-worker steps): a round is H loop steps for everyone."""
        if self.per_worker is not None and self.per_worker.adaptive and self.per_worker.trains(self.inner):
            self.per_worker.note(self.stats.ms["compute"])
        self.inner += 1
        taken = self.rounds * self.inner_steps + self.inner  # s: steps taken so far
        dense = 4 * self.numel  # what a per-step exchange would have sent: the effective ratio compares
        ahead = taken + self.lead  # the step the exchange is applied at, for timing=before
        if ahead % self.every == 0:  # fragment (s/h - 1) mod P starts; the pipeline books what it submits
            fragment = ((ahead // self.every) - 1) % self.fragments
            dense -= self.start_eager(fragment) if self.eager else self.start(fragment, taken)
        if self.inflight is not None and taken == self.started + self.overlap:
            self.finish()
        self.stats.bytes_dense += dense
        if self.inner == self.inner_steps:
            if self.per_worker is not None:  # after the round's Δ went out with this round's weights
                self.per_worker.end_round(self.engine, self.stats)
            self.inner = 0
            self.rounds += 1

    def weighted(self, deltas: list[Tensor]) -> list[Tensor]:
        """Per-worker steps: each Δ times N·w_r (in place), so the pipeline's mean is the weighted one;
        a factor of exactly 1 (equal H_r) leaves Δ untouched."""
        scale = 1.0 if self.per_worker is None else self.per_worker.scale()
        if scale != 1.0:
            for d in deltas:
                d.mul_(scale)
        return deltas

    @torch.no_grad()
    def start(self, fragment: int, taken: int) -> int:
        """Submit the fragment's outer gradient Δ = θ − θ_local; returns its dense bytes."""
        assert self.inflight is None, "overlap < inner_steps/fragments keeps one exchange in flight"
        self.inflight, self.started = fragment, taken
        deltas = [self.outer_params[i] - self.params[i][1] for i in self.members[fragment]]
        return self.submit(fragment, self.weighted(deltas))

    def submit(self, fragment: int, deltas: list[Tensor]) -> int:
        """The fragment's Δs into the pipeline (handed over), in one exchange where the communicator
        packs; returns their dense bytes."""
        names = [f"outer.{self.params[i][0]}" for i in self.members[fragment]]
        items = list(zip(names, deltas, strict=True))
        if self.pipeline.can_pack:
            self.pipeline.submit_many(f"outer.{fragment}", items)
        else:
            for name, delta in items:
                self.pipeline.submit(name, delta)
        return 4 * sum(d.numel() for d in deltas)

    @torch.no_grad()
    def start_eager(self, fragment: int) -> int:
        """Eager: fold in what arrived, submit the fragment's Δ and step θ at once with the eager
        outer gradient Δ/N + (Δ̄' − Δ'/N); returns the dense bytes submitted."""
        self.collect_eager()
        members = self.members[fragment]
        deltas = self.weighted([self.outer_params[i] - self.params[i][1] for i in members])
        for i, delta in zip(members, deltas, strict=True):
            self.mine[i] = delta / self.engine.size
        sent = self.submit(fragment, deltas)
        self.eager_pending.append(fragment)
        with self.stats.time("optimizer"):
            self.step_fragment(members, [self.mine[i] + self.others[i] for i in members])
        return sent

    def collect_eager(self) -> None:
        """Wait for every exchange in flight; each average Δ̄ leaves the others' part Δ̄ − Δ/N."""
        if not self.eager_pending:
            return
        averaged = dict(self.pipeline.collect())
        for fragment in self.eager_pending:
            for i in self.members[fragment]:
                average = averaged[f"outer.{self.params[i][0]}"]
                self.others[i] = average.reshape(self.mine[i].shape) - self.mine[i]
        self.eager_pending = []

    def step_fragment(self, members: list[int], grads: list[Tensor]) -> None:
        """θ's fragment takes the outer step on `grads`; the worker's fragment merges with it."""
        for i, grad in zip(members, grads, strict=True):
            self.outer_params[i].grad = grad.reshape(self.outer_params[i].shape)
        self.outer.step()  # only the fragment's tensors have a gradient: the others stay
        for i in members:
            theta, p = self.outer_params[i], self.params[i][1]
            if self.mix == 0.0:
                p.copy_(theta)
            else:  # θ_local ← α·θ_local + (1−α)·θ_new
                p.copy_(torch.lerp(theta, p, self.mix))
            theta.grad = None

    @torch.no_grad()
    def finish(self) -> None:
        """Collect the fragment's average, step its θ and merge it into the local parameters."""
        assert self.inflight is not None
        averaged = self.averaged if self.averaged is not None else self.collect()
        with self.stats.time("optimizer"):
            self.step_fragment(self.members[self.inflight], averaged)
        self.inflight, self.averaged = None, None

    def collect(self) -> list[Tensor]:
        """The averaged Δs of the exchange in flight, in its fragment's order (a packed exchange
        returns the tensors it sent dense after the compressed ones)."""
        assert self.inflight is not None
        averaged = dict(self.pipeline.collect())
        return [averaged[f"outer.{self.params[i][0]}"] for i in self.members[self.inflight]]

    def drain(self) -> None:
        """Wait for the exchange in flight; its average is kept for its scheduled step."""
        if self.inflight is not None and self.averaged is None:
            self.averaged = self.collect()
        if self.eager:
            self.collect_eager()

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "inner_steps": self.inner_steps, "outer_lr": self.outer_lr,
                "outer_momentum": self.outer_momentum, "nesterov": self.nesterov, "rounds": self.rounds,
                "fragments": self.fragments, "overlap": self.overlap, "mix": self.mix, "timing": self.timing,
                "eager": self.eager,
                **({} if self.per_worker is None else {"per_worker": self.per_worker.summary()})}

    def exchange_plan(self) -> ExchangePlan:
        """One fragment's exchange every H/P steps, hidden behind `overlap` steps, or with the
        eager update behind the H/P steps until the next fragment's."""
        return ExchangePlan(every=self.every, pattern=self.pipeline.comm.traits.pattern,
                            hidden_steps=self.every if self.eager else self.overlap)

    def state_dict(self) -> dict[str, Any]:
        # Ranks diverge inside a round: each keeps its own parameters and inner optimizer state.
        self.drain()  # the average kept for its scheduled step, here and in the checkpoint
        eager = {}
        if self.eager:  # what is folded in is the same now as at the fragment's next step
            eager = {"mine": [t.clone() for t in self.mine], "others": [t.clone() for t in self.others]}
        return pipeline_state(
            self.pipeline, inner=self.inner, rounds=self.rounds,
            outer_params=[t.clone() for t in self.outer_params], outer=self.outer.state_dict(),
            local_params=[p.detach().clone() for _, p in self.params],
            inner_optimizer=self.inner_optimizer.state_dict(),
            inflight=-1 if self.inflight is None else self.inflight, started=self.started,
            averaged=[t.clone() for t in self.averaged or []], **eager,
            **({} if self.per_worker is None else {"per_worker": self.per_worker.state_dict()}))

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_pipeline_state(self.pipeline, state)
        self.inner, self.rounds = int(state["inner"]), int(state["rounds"])
        for theta, saved in zip(self.outer_params, state["outer_params"], strict=True):
            theta.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        for (_, p), saved in zip(self.params, state["local_params"], strict=True):
            p.copy_(saved)
        self.inner_optimizer.load_state_dict(state["inner_optimizer"])
        # A checkpoint written before fragments existed has no exchange in flight.
        inflight = int(state.get("inflight", -1))
        self.inflight = None if inflight < 0 else inflight
        self.started = int(state.get("started", 0))
        self.averaged = [t.clone() for t in state["averaged"]] if self.inflight is not None else None
        if self.eager:
            self.mine = [t.clone() for t in state["mine"]]
            self.others = [t.clone() for t in state["others"]]
        if self.per_worker is not None:
            self.per_worker.load_state_dict(state["per_worker"])
