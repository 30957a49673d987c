"""`sync=onebit_adam`: 1-bit Adam (Tang et al., ICML 2021; reference DeepSpeed
`deepspeed/runtime/fp16/onebit/adam.py`) through compbench's pipeline: a per-step mode whose
optimizer is 1-bit Adam's update rule (`OnebitAdamStep`), its exchange the pipeline's.

- Step 0 only creates the state (the reference's first call: nothing moves, nothing is sent).
- Warm-up (steps 1 .. max(freeze_step, 2) - 1): the gradients are averaged dense (the pipeline's
  dense path, overlapping back-propagation); m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, and the
  update. At the end of the step whose counter reaches freeze_step, v freezes for good.
- Compressed (every later step): before the exchange the optimizer mixes each rank's momentum into
  its gradient, p.grad = b1 m + (1-b1) g (`mix_momentum`); the pipeline averages it (the recipe:
  compressor=rms_sign with memory=residual, the worker error; comm=ps, the server error and its
  re-compression: the reference's compressed_allreduce), m takes the average, v stays, the update.
- Update (both stages): p -= lr * (m / (sqrt(v) + eps) + weight_decay * p). No bias correction: the
  reference takes a `bias_correction` flag and never reads it.
- The freeze guard (a deviation from the reference): at the freeze, rank 0 prints how many entries of
  v are zero or below eps^2 (no gradient in the warm-up: an always-black pixel's weights, an unseen
  token's embedding). After a sign compressor m is never zero there, so DeepSpeed's update m / eps
  is huge and the run turns to NaN; compbench raises those entries to the mean of their tensor's
  other entries (`OnebitAdamStep.guard_frozen_variance`), and refuses a variance that is tiny
  everywhere. Where no entry is below eps^2 nothing changes (the oracle tests).

The recipe (applied unless the user sets the key): compressor=rms_sign, memory=residual, comm=ps,
scheduler=mergecomp with scheduler.groups=1: the whole model's momentum as one flat buffer, as
DeepSpeed's engine hands it to the reference (one scale; one all-to-all and one all-gather a step).
scheduler=bucket keeps one scale per tensor, as the reference has for tensors it sees one by one,
in the same two collectives. Another compressor or communicator can take their place. The
optimizer takes `optim.lr`, `optim.betas` and `optim.weight_decay` from optim=adamw and the
schedule, with no weight decay unless the user sets optim.weight_decay (the recipe: DeepSpeed's
default, not optim=adamw's 0.05); `sync.eps`, `sync.freeze_step` are the mode's.

The former implementation, which exchanged inside its own optimizer step, is the test oracle
(tests/oracles/onebit_adam.py): this mode reproduces its parameters and states bit for bit (per
tensor with scheduler=bucket or layerwise; with the recipe's flat buffer, the oracle given the
model as one flat parameter) on tensors whose size is a multiple of N * lcm(N, 8) (the reference
pads every tensor to such a size and its padding takes part in the scale and the error feedback;
compbench does not pad: rms_sign). Also unlike the oracle, with one worker the momentum still goes
through the compressor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import ExchangePlan, SyncTraits
from compbench.sync.step import StepSync

# DeepSpeed's engine hands 1-bit Adam one flat fp32 buffer per parameter group: the whole model's
# momentum in one flat buffer here too (one scale, one all-to-all and one all-gather per step).
# No weight decay unless the user sets it: DeepSpeed's OnebitAdam defaults to weight_decay=0. The
# optimizer's settings (lr, betas, weight decay) come from optim=adamw, the one it takes.
EXCHANGE_RECIPE = {"compressor": "rms_sign", "memory": "residual", "comm": "ps", "scheduler": "mergecomp",
                   "scheduler.groups": 1, "optim": "adamw", "optim.weight_decay": 0.0}
# A learning-rate warm-up of 300 steps (compbench's choice; DeepSpeed's examples warm up over
# thousands of steps, its optimizer has none of its own): like DeepSpeed, the dense stage divides
# m by sqrt(v) without bias correction, and for its first hundreds of steps m / sqrt(v) is about
# (1 - b1^t) / sqrt((1 - b2) t), 3 to 6 times Adam's step. At DDP-AdamW's rate and its short warm-up
# that derailed one seed of three on the text task (loss 2.51 against 1.93); with 300 steps of
# warm-up 3 seeds of 3 train (docs/results.md, onebit-adam-recipe). optim.warmup_steps=0 is the
# reference's schedule; optim.warmup_epochs=E replaces this warm-up too.
RECIPE = {**EXCHANGE_RECIPE, "optim.warmup_steps": 300}


def check_options(freeze_step: int = 100, eps: float = 1e-8) -> None:
    """Config-time check of sync=onebit_adam's settings."""
    if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 0:
        raise ValueError(f"sync.freeze_step={freeze_step} must be an integer >= 0 (dense warm-up steps)")
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
        raise ValueError(f"sync.eps={eps} must be a number > 0; pass e.g. sync.eps=1e-8")


class OnebitAdamStep(torch.optim.Optimizer):
    """1-bit Adam's update rule alone (see the module). State per parameter: `step`, `exp_avg`,
    `exp_avg_sq`; per group (the same in all groups): `initialized`, `frozen`. The freeze is global,
    decided with the first group's `freeze_step`."""

    label, mode = "1-bit Adam", "onebit_adam"  # in messages (sync=onebit_lamb's optimizer derives from it)

    def __init__(self, params: Iterable[Any], *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100) -> None:
        if not lr >= 0.0 or not weight_decay >= 0.0:
            raise ValueError(f"sync={self.mode}: optim.lr={lr} and optim.weight_decay={weight_decay} "
                             "must be >= 0")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"sync={self.mode}: optim.betas={list(betas)} must be two numbers in [0, 1)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        freeze_step=freeze_step, initialized=False, frozen=False)
        super().__init__(params, defaults)
        # Set by the step that freezes v: (entries raised, entries, threshold), for the mode to print.
        self.freeze_report: tuple[int, int, float] | None = None

    @property
    def initialized(self) -> bool:
        """Past step 0: the state exists and the steps exchange."""
        return bool(self.param_groups[0]["initialized"])

    @property
    def frozen(self) -> bool:
        """Past the warm-up: v is frozen and the momentum is what the pipeline averages."""
        return bool(self.param_groups[0]["frozen"])

    def _set_flags(self, **flags: bool) -> None:
        for group in self.param_groups:
            group.update(flags)

    def _stepped(self) -> Iterable[tuple[dict[str, Any], Tensor, Tensor]]:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if p.grad.is_sparse:
                        raise ValueError(f"sync={self.mode} does not take sparse gradients; use a "
                                         "dense embedding")
                    yield group, p, p.grad

    @torch.no_grad()
    def mix_momentum(self) -> None:
        """Compressed stage, before the exchange: p.grad = b1 m + (1-b1) g, what the pipeline averages."""
        for group, p, grad in self._stepped():
            beta1 = group["betas"][0]
            grad.copy_(self.state[p]["exp_avg"].mul(beta1).add_(grad, alpha=1 - beta1))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        initializing, frozen = not self.initialized, self.frozen
        last_step = None
        for group, p, grad in self._stepped():
            state = self.state[p]
            if not state:
                state["step"] = 0
                self._new_state(p, state)
            state["step"] += 1
            last_step = state["step"]
            if initializing:
                continue  # the reference's first call: state only, nothing moves
            if frozen:
                self._compressed(p, group, state, grad)
            else:
                self._warmup(p, group, state, grad)
        if initializing:
            self._set_flags(initialized=True)
        elif not frozen and last_step is not None and last_step >= self.param_groups[0]["freeze_step"]:
            self._set_flags(frozen=True)
            self.freeze_report = self.guard_frozen_variance()
        return loss

    # The stages' update rules (a subclass with another rule, 1-bit LAMB, overrides these three).
    def _new_state(self, p: Tensor, state: dict[str, Any]) -> None:
        state["exp_avg"] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        state["exp_avg_sq"] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)

    def _warmup(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], grad: Tensor) -> None:
        """Adam on the dense average."""
        beta1, beta2 = group["betas"]
        state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        self._adam_step(p, group, state)

    def _compressed(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], grad: Tensor) -> None:
        """`grad` is the averaged momentum; v stays frozen."""
        state["exp_avg"].copy_(grad)
        self._adam_step(p, group, state)

    @staticmethod
    def _adam_step(p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        update = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])
        if group["weight_decay"] > 0.0:
            update.add_(p, alpha=group["weight_decay"])
        p.add_(update, alpha=-group["lr"])

    @torch.no_grad()
    def guard_frozen_variance(self) -> tuple[int, int, float]:
        """At the freeze: every entry of v below eps^2 (zero: no gradient in the warm-up) is raised to
        the mean of its tensor's other entries (of the whole model's, where a tensor has none), so
        that its compressed updates, m / (sqrt(v) + eps) with m never zero after a sign compressor,
        stay of the size of the others' instead of m / eps (DeepSpeed leaves v as it is; with zeros
        the run turns to NaN). Returns (entries raised, entries, the threshold); a variance that is
        tiny everywhere is refused (ValueError, one line)."""
        threshold = float(self.param_groups[0]["eps"]) ** 2
        variances = [self.state[p]["exp_avg_sq"] for group in self.param_groups for p in group["params"]
                     if p in self.state]
        tiny = [v < threshold for v in variances]
        count = sum(int(t.sum()) for t in tiny)
        total = sum(v.numel() for v in variances)
        if count == 0:
            return 0, total, threshold
        kept = [v[~t] for v, t in zip(variances, tiny, strict=True)]
        if count == total:
            raise ValueError(f"{self.label} froze its variance with all {total} entries zero or below "
                             f"{threshold:g} (no gradient in the warm-up); raise sync.freeze_step")
        model_mean = torch.cat([k.flatten() for k in kept]).mean()
        for v, t, k in zip(variances, tiny, kept, strict=True):
            if k.numel() < v.numel():
                v.masked_fill_(t, k.mean() if k.numel() else model_mean)
        return count, total, threshold


class OnebitAdamSync(StepSync):
    name = "onebit_adam"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(optimizers=("adamw",),
                                                   optimizer_keys=("lr", "betas", "weight_decay"),
                                                   recipe=RECIPE)
    check_options = staticmethod(check_options)

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, freeze_step: int = 100,
                 eps: float = 1e-8, **_: Any) -> None:
        check_options(freeze_step, eps)
        super().__init__(pipeline, scheduler)
        self.freeze_step, self.eps = int(freeze_step), float(eps)
        self.step = 0  # the trainer's step (begin_step), for the freeze's line

    def setup(self, model: nn.Module) -> nn.Module:
        self.numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return super().setup(model)

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.optimizer = OnebitAdamStep(
            [p for p in model.parameters() if p.requires_grad], lr=float(optim["lr"]),
            betas=tuple(optim.get("betas", (0.9, 0.999))), eps=self.eps,
            weight_decay=float(optim.get("weight_decay", 0.0)), freeze_step=self.freeze_step)
        return self.optimizer

    def begin_step(self, step: int, epoch: float) -> None:
        super().begin_step(step, epoch)
        self.step = step
        self.pipeline.dense_now = not self.optimizer.frozen  # the warm-up averages the gradients dense

    def before_backward(self) -> None:
        # The warm-up's dense exchange overlaps back-propagation; the momentum exists only after it.
        if self.optimizer.initialized and not self.optimizer.frozen:
            super().before_backward()

    def exchange_plan(self) -> ExchangePlan:
        # after the warm-up the momentum exists only after back-propagation: nothing overlaps it
        plan = super().exchange_plan()
        warmup = max(plan.warmup_steps, self.freeze_step, 2)  # step 0 and the reference's call 2 at least
        return replace(plan, overlaps_backward=False, warmup_steps=warmup)

    def after_step(self) -> None:
        report, self.optimizer.freeze_report = self.optimizer.freeze_report, None
        if report is not None and self.pipeline.engine.rank == 0:
            raised, total, threshold = report
            guard = ("; raised to their tensor's mean variance so that their updates stay finite (a "
                     "deviation from DeepSpeed; a larger sync.freeze_step lets them see gradients)"
                     if raised else "")
            print(f"{self.optimizer.label} froze its variance at step {self.step}: {raised} of {total} "
                  f"entries are zero or below {threshold:g}{guard}", flush=True)

    def synchronize(self) -> None:
        if not self.optimizer.initialized:  # step 0 creates the state: nothing is sent
            self.pipeline.stats.bytes_dense += 4 * self.numel
            return
        if self.optimizer.frozen:
            self.optimizer.mix_momentum()
        super().synchronize()
