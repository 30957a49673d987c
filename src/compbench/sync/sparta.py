"""`sync=sparta` and `sync=sparta_diloco`: SPARTA, sparse parameter averaging (reference ExoGym,
exo-explore/gym `exogym/strategy/sparta.py`: `SPARTAStrategy`, `SparseCommunicator`,
`RandomIndexSelector`; and `exogym/strategy/sparta_diloco.py`: `SPARTADiLoCoStrategy`).

Every worker steps the run's optimizer on its own gradients (no gradient exchange). After each
optimizer step, every parameter entry is picked with probability `p` (a Bernoulli mask per tensor,
ExoGym's `RandomIndexSelector`; p = 0.005 its default) and the picked entries are averaged over the
workers: one dense allreduce of their values, written back in place. The replicas drift apart
between picks and are pulled together a fraction p at a time.

`sync=sparta_diloco` (ExoGym's SPARTA + DiLoCo): the same sparse averaging every step, inside
DiLoCo's rounds; every `inner_steps` steps the full DiLoCo outer step (`sync=diloco`, whose settings
it takes, Streaming DiLoCo's included) on the outer gradient θ − θ_local, through compbench's
pipeline (so the compressors compose with its outer step; ExoGym's H = 100 its default).

Deviations from the reference, each documented:
- The masks: ExoGym draws each on every rank and broadcasts rank 0's (a bool tensor the size of the
  parameter, every step); here every rank draws the same masks from a generator seeded by `seed` and
  the step count, on the parameters' device, so only the picked values travel. The picked values'
  counts are read by the host (one synchronization per tensor on a GPU, after the step, outside
  back-propagation).
- One allreduce of every tensor's picked values together (ExoGym: one per tensor), booked as a dense
  allreduce of 4 bytes per picked value; every step books 4n dense bytes (a per-step exchange's).
- The sparse exchange goes through no compressor (its values are a fraction p already): `sync=sparta`
  keeps compressor, memory and comm at their defaults (refused otherwise); `sync=sparta_diloco`'s
  compressor applies to its outer step only.
- Parameters without a gradient at a step are averaged too (ExoGym skips them): the mask does not
  depend on what a rank's batch touched, so every rank sends the same number of values.
- `sync.p` must pick at least 10 entries a step on average (p x the model's entries, checked at
  compose time), so that a step's exchange is not empty by design.
- sparta_diloco's rounds are all `inner_steps` long. ExoGym counts its local steps from 0 and takes
  the outer step where local_step % H == 0 and local_step > 0, after that step's inner step: its first
  round has H + 1 inner steps, every later one H (DiLoCo's paper and compbench's sync=diloco: H each).

The recipe (applied unless the user sets the key, said at the start): AdamW inner steps (ExoGym's
default inner optimizer) and DiLoCo's clipping of each inner gradient to norm 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compbench.base.values import is_int, is_number
from compbench.engines.base import Engine
from compbench.optim.optimizers import optimizer_over
from compbench.records.stats import StepStats
from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import ExchangePlan, SyncTraits
from compbench.sync.diloco import DiLoCo
from compbench.sync.diloco import check_options as check_diloco

P_DEFAULT = 0.005  # ExoGym's p_sparta
# ExoGym's inner optimizer (its strategies' default OptimSpec: AdamW), and DiLoCo's clipping.
RECIPE = {"optim": "adamw", "optim.clip_grad_norm": 1.0}


def check_p(p: float, seed: int) -> None:
    if not is_number(p) or not 0.0 < p <= 1.0:
        raise ValueError(f"sync.p={p} must be a number in (0, 1] (the fraction of parameter entries averaged "
                         f"each step); pass sync.p={P_DEFAULT} (ExoGym's)")
    if not is_int(seed) or seed < 0:
        raise ValueError(f"sync.seed={seed} must be an integer >= 0 (the masks' seed, the same on every "
                         "worker)")


def check_options(p: float = P_DEFAULT, seed: int = 0) -> None:
    """Config-time check of sync=sparta's settings."""
    check_p(p, seed)


# The fewest entries a step averages on average (p x the model's entries): at 10 a step picks none
# with probability e^-10, so SPARTA exchanges something every step (sync.p=1e-12 sent 0 bytes).
MIN_PICKED = 10


def check_picks(model: nn.Module, p: float = P_DEFAULT, **_: Any) -> None:
    """Config-time check of `p` against the model (built on the meta device): p x its trainable
    entries must reach MIN_PICKED."""
    entries = sum(t.numel() for t in model.parameters() if t.requires_grad)
    if is_number(p) and p * entries < MIN_PICKED:
        raise ValueError(f"sync.p={p:g} averages {p * entries:.2g} of the model's {entries} entries a step, "
                         f"so most steps exchange nothing; pass sync.p>={MIN_PICKED / entries:.2g} "
                         f"({MIN_PICKED} entries a step; ExoGym's p is {P_DEFAULT})")


def masks(params: Sequence[Tensor], p: float, seed: int, step: int) -> list[Tensor]:
    """Step `step`'s Bernoulli(p) masks, one per tensor: the same on every rank, drawn on the
    parameters' device as ExoGym draws them (a GPU's generator is not the CPU's: the masks of a run
    depend on its device, not on its rank)."""
    device = params[0].device if params else torch.device("cpu")
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)
    return [torch.rand(t.shape, generator=gen, device=device) < p for t in params]


@torch.no_grad()
def sparse_average(engine: Engine, stats: StepStats, params: Sequence[Tensor], p: float, seed: int,
                   step: int) -> int:
    """Average the picked entries of `params` over the workers in place; returns how many.

    The host reads how many entries each tensor picked, all in one read per step (one wait on a
    GPU, which the method needs: the allreduce's size is the host's); gathering the picked entries
    with those counts (`nonzero_static`) and scattering them back then waits no more, where a
    boolean index or a count per tensor waited once per tensor."""
    picked = masks(params, p, seed, step)
    counts = torch.stack([m.sum() for m in picked]).tolist() if picked else []
    if sum(counts) == 0:
        return 0
    values = torch.cat([t.detach().reshape(-1)[torch.nonzero_static(m.reshape(-1), size=count).view(-1)]
                        for t, m, count in zip(params, picked, counts, strict=True)])
    with stats.time("comm"):
        averaged = engine.allreduce(values, "sparta")
    stats.add_dense_allreduce(values.numel() * values.element_size(), calls=1)
    for t, m, part in zip(params, picked, averaged.split(counts), strict=True):
        t.masked_scatter_(m, part)
    return values.numel()


class Sparta:
    """Local steps with a random fraction p of the parameters averaged every step (see the module)."""

    name = "sparta"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(pipeline=False, pattern="allreduce", recipe=RECIPE,
                                                   replicas_diverge=True)
    check_options = staticmethod(check_options)
    check_model = staticmethod(check_picks)
    pipeline = None
    scheduler = None

    def __init__(self, engine: Engine, stats: StepStats, p: float = P_DEFAULT, seed: int = 0) -> None:
        check_options(p, seed)
        self.engine, self.stats, self.p, self.seed = engine, stats, float(p), int(seed)
        self.steps = 0

    def setup(self, model: nn.Module) -> nn.Module:
        self.params = [t for t in model.parameters() if t.requires_grad]
        self.numel = sum(t.numel() for t in self.params)
        return model

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.optimizer = optimizer_over(model, self.params, optim)
        return self.optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        pass

    def before_backward(self) -> None:
        pass

    def synchronize(self) -> None:
        pass  # each worker steps on its own gradients

    def after_step(self) -> None:
        self.steps += 1
        sparse_average(self.engine, self.stats, self.params, self.p, self.seed, self.steps)
        self.stats.bytes_dense += 4 * self.numel

    def drain(self) -> None:
        pass  # the exchange is blocking

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "p": self.p, "seed": self.seed}

    def exchange_plan(self) -> ExchangePlan:
        return ExchangePlan(pattern="allreduce")

    def state_dict(self) -> dict[str, Any]:
        # Ranks diverge: each keeps its own parameters (the checkpoint's model is rank 0's).
        return {"steps": self.steps, "local_params": [t.detach().clone() for t in self.params],
                "optimizer": self.optimizer.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        for t, saved in zip(self.params, state["local_params"], strict=True):
            t.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])


def check_combined(p: float = P_DEFAULT, seed: int = 0, inner_steps: int = 100, outer_lr: float = 0.7,
                   outer_momentum: float = 0.9, nesterov: bool = True, fragments: int = 1, overlap: int = 0,
                   mix: float = 0.0, timing: str = "after", eager: bool = False) -> None:
    """Config-time check of sync=sparta_diloco's settings."""
    check_p(p, seed)
    check_diloco(inner_steps, outer_lr, outer_momentum, nesterov, fragments, overlap, mix, timing, eager)


class SpartaDiLoCo(DiLoCo):
    """DiLoCo's rounds with SPARTA's sparse averaging after every inner step (see the module)."""

    name = "sparta_diloco"
    check_options: ClassVar[Callable[..., None]] = staticmethod(check_combined)
    sync_traits: ClassVar[SyncTraits] = SyncTraits(per_step=False, period_key="inner_steps", recipe=RECIPE,
                                                   replicas_diverge=True)

    @staticmethod
    def check_model(model: nn.Module, fragments: int = 1, p: float = P_DEFAULT, **_: Any) -> None:
        check_picks(model, p)
        DiLoCo.check_model(model, fragments)

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, engine: Engine, stats: StepStats,
                 p: float = P_DEFAULT, seed: int = 0, inner_steps: int = 100, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9, nesterov: bool = True, fragments: int = 1, overlap: int = 0,
                 mix: float = 0.0, timing: str = "after", eager: bool = False) -> None:
        check_p(p, seed)
        super().__init__(pipeline, scheduler, engine, stats, inner_steps, outer_lr, outer_momentum, nesterov,
                         fragments, overlap, mix, timing, eager)
        self.p, self.seed = float(p), int(seed)

    def after_step(self) -> None:
        # ExoGym's order: the sparse averaging, then (at a round's end) DiLoCo's outer step.
        taken = self.rounds * self.inner_steps + self.inner + 1
        sparse_average(self.engine, self.stats, [p for _, p in self.params], self.p, self.seed, taken)
        super().after_step()

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "p": self.p, "seed": self.seed}
