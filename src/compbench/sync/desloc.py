"""`sync=desloc`: DES-LOC, Desynced Low Communication adaptive optimizers (Iacob, Sani, Safaryan et
al. 2025, arXiv 2505.22549, Algorithm 1 for Adam): every worker runs Adam (optim=adam or adamw) on its
own gradients, and the parameters x, Adam's first moment u (`exp_avg`) and its second moment v
(`exp_avg_sq`) are each replaced by their average over the workers on their own period, K_x
(`param_period`), K_u (`first_moment_period`) and K_v (`second_moment_period`). The paper
recommends K_u = 3 K_x, K_v = 6 K_x (the moments change more slowly than the parameters: their
half-lives ln 0.5 / ln beta); K_x = K_u = K_v is Local Adam.

The update, with s the steps taken (0-based t = s in the paper): after the optimizer's step s, x is
averaged if s % K_x == 0, u if s % K_u == 0, v if s % K_v == 0, before step s + 1 — the paper's
averaging of x_t, u_{t-1}, v_{t-1} before step t at t mod K == 0.

What goes where (compbench's pipeline, so every byte is booked and `compressor`/`memory`/`comm`
compose):
- Parameters travel as DiLoCo's outer gradient does, Δ = x_sync − x_local through memory ->
  compressor -> communicator, and x_sync ← x_sync − mean(Δ), every worker continuing from x_sync
  (DiLoCo with outer_lr 1, no momentum: exactly the average with compressor=none; with a compressor
  and memory=residual, the average of error-fed compressed deltas).
- The moments are averaged dense (the pipeline's uncompressed allreduce, `submit(dense=True)`),
  whatever the compressor: a lossy code of v could turn it negative (its square root), and the
  paper sends them whole.

Deviations: the gradient clipping of the paper's Algorithm 1 is the trainer's `optim.clip_grad_norm`
(this mode's recipe sets 1.0, as DiLoCo's does); the bias correction and the learning-rate schedule
are torch's Adam's; the step counts of Adam's state stay per worker (they are equal on every rank).
Bytes per step are means over whole rounds of lcm(K_x, K_u, K_v) steps; the steps between exchanges
book 0 bytes sent and 4n dense bytes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compbench.base.values import is_int
from compbench.engines.base import Engine
from compbench.optim.optimizers import optimizer_over
from compbench.records.stats import StepStats
from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model
from compbench.sync.step import load_pipeline_state, pipeline_state

# Adam (AdamW here) is the reference's optimizer, and it clips every local gradient (Algorithm 1's
# clip(g, rho)): DiLoCo's radius.
RECIPE = {"optim": "adamw", "optim.clip_grad_norm": 1.0}
# What is averaged, on which period key, under which name in the pipeline (Adam's state keys).
MOMENTS = (("exp_avg", "first_moment_period"), ("exp_avg_sq", "second_moment_period"))


def check_options(param_period: int = 32, first_moment_period: int = 96,
                  second_moment_period: int = 192) -> None:
    """Config-time check of sync=desloc's settings."""
    for key, value in (("param_period", param_period), ("first_moment_period", first_moment_period),
                       ("second_moment_period", second_moment_period)):
        if not is_int(value) or value < 1:
            raise ValueError(f"sync.{key}={value} must be an integer >= 1 (steps between two averages); "
                             f"pass e.g. sync.{key}=32")


class DesLoc:
    """Local Adam steps; parameters and the two moments averaged, each on its own period."""

    name = "desloc"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(
        per_step=False, period_key="param_period",
        period_keys=("first_moment_period", "second_moment_period"), optimizers=("adamw", "adam"),
        recipe=RECIPE)
    check_options = staticmethod(check_options)
    check_model = staticmethod(fits_any_model)
    scheduler = None

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, engine: Engine, stats: StepStats,
                 param_period: int = 32, first_moment_period: int = 96,
                 second_moment_period: int = 192) -> None:
        check_options(param_period, first_moment_period, second_moment_period)
        self.pipeline, self.engine, self.stats = pipeline, engine, stats
        self.periods = {"param_period": int(param_period), "first_moment_period": int(first_moment_period),
                        "second_moment_period": int(second_moment_period)}
        self.taken = 0  # steps taken
        self.syncs = 0  # parameter exchanges: the pipeline's step (compressor state, dense_steps)

    def setup(self, model: nn.Module) -> nn.Module:
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # x_sync: the parameters of the last average, the same on every rank (rank 0's at the start).
        self.synced = [p.detach().clone() for _, p in self.params]
        self.numel = sum(p.numel() for _, p in self.params)
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.optimizer = optimizer_over(model, [p for _, p in self.params], optim)
        return self.optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        self.pipeline.begin_step(self.syncs, epoch)

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # local steps: each worker steps on its own gradients

    def due(self, key: str, taken: int) -> bool:
        return taken % self.periods[key] == 0

    @torch.no_grad()
    def after_step(self) -> None:
        self.taken += 1
        dense = 4 * self.numel  # what a per-step exchange would send (the pipeline books what it submits)
        sync_params = self.due("param_period", self.taken)
        moments = [state for state, key in MOMENTS if self.due(key, self.taken)]
        if sync_params:
            deltas = [(f"x.{n}", x - p) for (n, p), x in zip(self.params, self.synced, strict=True)]
            dense -= self.submit("x", deltas, dense=False)
        for state in moments:
            dense -= self.submit(state, [(f"{state}.{n}", self.optimizer.state[p][state])
                                         for n, p in self.params], dense=True)
        if sync_params or moments:
            averaged = dict(self.pipeline.collect())
            with self.stats.time("optimizer"):
                self.apply(averaged, sync_params, moments)
        self.stats.bytes_dense += dense
        if sync_params:
            self.syncs += 1

    def submit(self, what: str, items: list[tuple[str, Tensor]], dense: bool) -> int:
        """`items` into the pipeline, in one exchange where the communicator packs; their dense bytes."""
        if self.pipeline.can_pack:
            self.pipeline.submit_many(what, items, dense=dense)
        else:
            for name, tensor in items:
                self.pipeline.submit(name, tensor, dense=dense)
        return 4 * sum(t.numel() for _, t in items)

    def apply(self, averaged: dict[str, Tensor], sync_params: bool, moments: list[str]) -> None:
        """The averages into the moments and the parameters."""
        for n, p in self.params:
            for state in moments:
                moment = self.optimizer.state[p][state]
                moment.copy_(averaged[f"{state}.{n}"].reshape(moment.shape))
        if sync_params:
            for (n, p), x in zip(self.params, self.synced, strict=True):
                x.sub_(averaged[f"x.{n}"].reshape(x.shape))
                p.copy_(x)

    def drain(self) -> None:
        pass  # every exchange is collected at its own step

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, **self.periods, "param_syncs": self.syncs, "steps": self.taken}

    def exchange_plan(self) -> ExchangePlan:
        """One exchange every min(K) steps: the what-if model spreads the bytes and calls per step
        (means over whole lcm rounds) over them, the moments' share included."""
        return ExchangePlan(every=min(self.periods.values()), pattern=self.pipeline.comm.traits.pattern)

    def state_dict(self) -> dict[str, Any]:
        # Ranks diverge between averages: each keeps its own parameters and Adam state.
        return pipeline_state(self.pipeline, taken=self.taken, syncs=self.syncs,
                              synced=[x.clone() for x in self.synced],
                              local_params=[p.detach().clone() for _, p in self.params],
                              optimizer=self.optimizer.state_dict())

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_pipeline_state(self.pipeline, state)
        self.taken, self.syncs = int(state["taken"]), int(state["syncs"])
        for x, saved in zip(self.synced, state["synced"], strict=True):
            x.copy_(saved)
        for (_, p), saved in zip(self.params, state["local_params"], strict=True):
            p.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
