"""`sync=onebit_lamb`: 1-bit LAMB (Li et al., "1-bit LAMB: Communication Efficient Large-Scale
Large-Batch Training with LAMB's Convergence Speed", HiPC 2022; reference DeepSpeed
`deepspeed/runtime/fp16/onebit/lamb.py`) through compbench's pipeline: 1-bit Adam's two stages with
LAMB's layer-wise trust ratio, frozen with the variance. The optimizer (`OnebitLambStep`) keeps only
the update rule; the momentum goes through the same pipeline and recipe as sync=onebit_adam's.

Why 1-bit LAMB rather than 0/1 Adam (DeepSpeed's zoadam.py): 1-bit LAMB exchanges exactly what 1-bit
Adam does (dense gradients in the warm-up, then every step the momentum in one bit with worker and
server error feedback, one flat buffer), so it goes through the one seam as it is; 0/1 Adam switches
between a dense gradient exchange at exponentially spaced steps, 1-bit gradients in between and,
after its variance freeze, local steps with a growing period, a schedule the per-step seam and the
race's `ExchangePlan` (one period, one warm-up) cannot state.

Per tensor, with l = lr, b1, b2 = optim.betas, wd = optim.weight_decay, e = sync.eps:
- Step 0 only creates the state (the reference's first call): m = v = v_fresh = 0,
  coeff_freeze = 0, last_factor = 1; nothing moves, nothing is sent.
- Warm-up (steps 1 .. max(freeze_step, 2) - 1), LAMB on the dense average g:
  m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2 (v_fresh = v at the step whose counter is freeze_step),
  u = m / (sqrt(v) + e) + wd p, c = clip(||p|| / ||u||, min_coeff, max_coeff) (1 where either norm is
  0), coeff_freeze = coeff_beta coeff_freeze + (1-coeff_beta) c unless c == 1, p -= l c u.
  v and coeff_freeze freeze at the end of the step whose counter reaches freeze_step.
- Compressed (every later step): at the first, each tensor's scaling coefficient
  s = mean_t(rms(m_t)) / rms(m) (rms = ||.|| / sqrt(n)), so that every tensor's momentum is of one size
  in the one flat buffer the compressor gives one scale. Before the exchange the optimizer puts
  p.grad = (b1 m + (1-b1) g) s (`mix_momentum`); the pipeline averages it (the recipe: rms_sign,
  memory=residual, comm=ps: the reference's compressed_allreduce); then m' = average / s,
  g~ = (m' - b1 m) / (1-b1), v_fresh = b2 v_fresh + (1-b2) g~^2, m = m';
  u = m / (sqrt(v) + e) + wd p, factor = max(( sqrt(v) + e) / (sqrt(v_fresh) + e)) (with weight decay
  blended toward 1 by r = min(1, ||m / (sqrt(v) + e)|| / ||u||): factor r + (1-r)), clipped to
  [factor_min, factor_max] and to last_factor (1 +- factor_threshold); p -= l coeff_freeze factor u.
- No bias correction: the reference takes a `bias_correction` flag and never reads it.

Deviations from the reference, and why:
- The freeze guard of sync=onebit_adam (`OnebitAdamStep.guard_frozen_variance`): entries of v below
  e^2 are raised to their tensor's mean at the freeze, and v_fresh (the reference's copy of v at the
  freeze) takes the guarded v, so that v_fresh == v at the freeze as in the reference. Without
  such entries nothing changes (the oracle tests).
- A tensor whose momentum is all zero at the first compressed step gets s = 1 (the reference divides
  by its zero rms: ZeroDivisionError); a warm-up whose momenta are all zero is refused by the guard.
- compbench does not pad the flat buffer to a multiple of N * lcm(N, 8) (rms_sign); the reference's
  padding enters the scale and keeps, from one step to the next, the last average of the padding.
  On a model whose size is such a multiple the two are the same bit for bit (tests/unit/
  test_onebit_lamb.py against tests/oracles/onebit_lamb.py).
- The recipe's flat buffer (scheduler=mergecomp, one group) is in back-propagation order (the
  reverse of the parameters'); the reference's in the parameters' order. Each element is compressed
  the same; only which server averages which part (and its server scale) differs.
- Each rank's worker and server errors are in its own state_dict (the reference resets them on a
  load), so a resume is exact. No `exp_avg_mask`, no amsgrad, fp32 parameters.

The recipe (applied unless the user sets the key) is sync=onebit_adam's: compressor=rms_sign,
memory=residual, comm=ps, scheduler=mergecomp with scheduler.groups=1, optim.weight_decay=0.0 (the
reference's default). Another compressor or communicator can take their place (what passes between
the ranks is then that compressor's average of the scaled momentum). The optimizer takes `optim.lr`,
`optim.betas` and `optim.weight_decay` from optim=adamw and the schedule; `sync.freeze_step`,
`sync.eps`, `sync.max_coeff`, `sync.min_coeff`, `sync.coeff_beta`, `sync.factor_max`,
`sync.factor_min`, `sync.factor_threshold` are the mode's, with the reference's defaults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from compbench.schedulers import Scheduler
from compbench.seam.pipeline import GradientPipeline
from compbench.sync import SyncTraits
from compbench.sync.onebit_adam import EXCHANGE_RECIPE, OnebitAdamStep, OnebitAdamSync


def check_options(freeze_step: int = 100, eps: float = 1e-8, max_coeff: float = 10.0,
                  min_coeff: float = 0.01, coeff_beta: float = 0.9, factor_max: float = 4.0,
                  factor_min: float = 0.5, factor_threshold: float = 0.1) -> None:
    """Config-time check of sync=onebit_lamb's settings."""
    def number(x: object) -> bool:
        return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)

    if isinstance(freeze_step, bool) or not isinstance(freeze_step, int) or freeze_step < 2:
        raise ValueError(f"sync.freeze_step={freeze_step} must be an integer >= 2 (step 0 creates the state; "
                         "at least one LAMB step sets the coefficient that freezes)")
    if not number(eps) or not eps > 0:
        raise ValueError(f"sync.eps={eps} must be a number > 0; pass e.g. sync.eps=1e-8")
    if not (number(min_coeff) and number(max_coeff) and 0 < min_coeff <= max_coeff):
        raise ValueError(f"sync.min_coeff={min_coeff} and sync.max_coeff={max_coeff} must be numbers with "
                         "0 < min_coeff <= max_coeff (LAMB's trust-ratio bounds); e.g. 0.01 and 10")
    if not number(coeff_beta) or not 0 <= coeff_beta < 1:
        raise ValueError(f"sync.coeff_beta={coeff_beta} must be a number in [0, 1); e.g. sync.coeff_beta=0.9")
    if not (number(factor_min) and number(factor_max) and 0 < factor_min <= factor_max):
        raise ValueError(f"sync.factor_min={factor_min} and sync.factor_max={factor_max} must be numbers "
                         "with 0 < factor_min <= factor_max; e.g. 0.5 and 4")
    if not number(factor_threshold) or not factor_threshold >= 0:
        raise ValueError(f"sync.factor_threshold={factor_threshold} must be a number >= 0; e.g. 0.1")


class OnebitLambStep(OnebitAdamStep):
    """1-bit LAMB's update rule alone (see the module). State per parameter: `step`, `exp_avg`,
    `exp_avg_sq`, `exp_avg_sq_fresh`, `lamb_coeff_freeze`, `last_factor` and, from the first
    compressed step, `scaling_coeff`; per group: `initialized`, `frozen` (1-bit Adam's).

    Its step reads each tensor's trust ratio (and the compressed stage's factor) on the host, as
    DeepSpeed's `.item()` calls do: the method needs it (its Python arithmetic in double, the clamps
    and the running mean, matches the reference bit for bit), at the price of one synchronization
    per tensor in the optimizer's step on a GPU (none in back-propagation). Where the reference
    reads two or three numbers of a tensor one by one (the norms' `!= 0` tests, then the ratio),
    they are stacked and read in one go: the same values, one wait instead of three."""

    label, mode = "1-bit LAMB", "onebit_lamb"

    def __init__(self, params: Iterable[Any], *, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: int = 100,
                 max_coeff: float = 10.0, min_coeff: float = 0.01, coeff_beta: float = 0.9,
                 factor_max: float = 4.0, factor_min: float = 0.5, factor_threshold: float = 0.1) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         freeze_step=freeze_step)
        self.max_coeff, self.min_coeff, self.coeff_beta = max_coeff, min_coeff, coeff_beta
        self.factor_max, self.factor_min, self.factor_threshold = factor_max, factor_min, factor_threshold

    def _scale_momenta(self) -> None:
        """At the first compressed step: each tensor's `scaling_coeff`, the mean rms of all momenta over
        its own (1 where its momentum is zero: a deviation, the reference divides by zero)."""
        states = [self.state[p] for group in self.param_groups for p in group["params"] if p in self.state]
        if not states or "scaling_coeff" in states[0]:
            return
        scales = torch.stack([torch.linalg.vector_norm(s["exp_avg"]) / math.sqrt(s["exp_avg"].numel())
                              for s in states]).tolist()  # one host read for every tensor
        united = sum(scales) / len(scales)
        for state, scale in zip(states, scales, strict=True):
            state["scaling_coeff"] = united / scale if scale > 0 else 1.0

    @torch.no_grad()
    def mix_momentum(self) -> None:
        """Compressed stage, before the exchange: p.grad = (b1 m + (1-b1) g) s, what the pipeline averages."""
        self._scale_momenta()
        for group, p, grad in self._stepped():
            state, beta1 = self.state[p], group["betas"][0]
            grad.copy_(state["exp_avg"].mul(beta1).add_(grad, alpha=1 - beta1).mul_(state["scaling_coeff"]))

    def _new_state(self, p: Tensor, state: dict[str, Any]) -> None:
        state["lamb_coeff_freeze"], state["last_factor"] = 0.0, 1.0
        for key in ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"):
            state[key] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)

    def _warmup(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], grad: Tensor) -> None:
        """LAMB on the dense average; the trust ratio's running mean is what freezes."""
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if state["step"] == group["freeze_step"]:
            state["exp_avg_sq_fresh"].copy_(exp_avg_sq)
        weight_norm = p.pow(2).sum().sqrt()
        update = exp_avg / (exp_avg_sq.sqrt() + group["eps"])
        if group["weight_decay"] > 0.0:
            update += group["weight_decay"] * p
        update_norm = update.pow(2).sum().sqrt()
        coeff = 1.0
        # one host read (the reference's three: both tests, then the ratio); an unused ratio may be inf
        weight, upd, ratio = torch.stack([weight_norm, update_norm, weight_norm / update_norm]).tolist()
        if weight != 0 and upd != 0:
            coeff = min(max(ratio, self.min_coeff), self.max_coeff)
        if coeff != 1.0:  # the reference skips the exact 1 (its "no ratio" value) in the running mean
            beta = self.coeff_beta
            state["lamb_coeff_freeze"] = beta * state["lamb_coeff_freeze"] + (1 - beta) * coeff
        p.add_(-group["lr"] * coeff * update)

    def _compressed(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], grad: Tensor) -> None:
        """`grad` is the average of the scaled momenta; the frozen coefficient times a factor that follows
        how far the fresh variance has moved from the frozen one."""
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq, fresh = state["exp_avg"], state["exp_avg_sq"], state["exp_avg_sq_fresh"]
        averaged = grad.div(state["scaling_coeff"])
        reconstructed = (averaged - exp_avg * beta1) / (1 - beta1)  # the gradient that momentum implies
        exp_avg.copy_(averaged)
        fresh.mul_(beta2).addcmul_(reconstructed, reconstructed, value=1 - beta2)
        denom = exp_avg_sq.sqrt() + group["eps"]
        update_prelim = exp_avg / denom
        update = update_prelim + group["weight_decay"] * p if group["weight_decay"] > 0.0 else update_prelim
        update_norm = update.pow(2).sum().sqrt()
        most = (denom / (fresh.sqrt() + group["eps"])).max()
        if group["weight_decay"] > 0.0:  # the factor and the ratio in one host read
            factor, ratio = torch.stack([most, update_prelim.pow(2).sum().sqrt() / update_norm]).tolist()
            ratio = min(1.0, ratio)
            factor = factor * ratio + (1.0 - ratio)
        else:
            factor = most.item()
        factor = min(max(factor, self.factor_min), self.factor_max)
        last = state["last_factor"]
        factor = min(max(factor, last * (1.0 - self.factor_threshold)), last * (1.0 + self.factor_threshold))
        state["last_factor"] = factor
        p.add_(-group["lr"] * (state["lamb_coeff_freeze"] * factor) * update)

    @torch.no_grad()
    def guard_frozen_variance(self) -> tuple[int, int, float]:
        """1-bit Adam's guard; v_fresh, the reference's copy of v at the freeze, takes the guarded v."""
        report = super().guard_frozen_variance()
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    self.state[p]["exp_avg_sq_fresh"].copy_(self.state[p]["exp_avg_sq"])
        return report


class OnebitLambSync(OnebitAdamSync):
    """1-bit Adam's mode (its stages, exchange, plan and freeze line) with 1-bit LAMB's optimizer.
    Its recipe is 1-bit Adam's exchange without 1-bit Adam's longer warm-up: LAMB's trust ratio
    (clamped to max_coeff) bounds the steps that the uncorrected m / sqrt(v) would inflate."""

    name = "onebit_lamb"
    sync_traits: ClassVar[SyncTraits] = SyncTraits(optimizers=("adamw",),
                                                   optimizer_keys=("lr", "betas", "weight_decay"),
                                                   recipe=EXCHANGE_RECIPE)
    check_options = staticmethod(check_options)

    def __init__(self, pipeline: GradientPipeline, scheduler: Scheduler, freeze_step: int = 100,
                 eps: float = 1e-8, max_coeff: float = 10.0, min_coeff: float = 0.01, coeff_beta: float = 0.9,
                 factor_max: float = 4.0, factor_min: float = 0.5, factor_threshold: float = 0.1,
                 **_: Any) -> None:
        check_options(freeze_step, eps, max_coeff, min_coeff, coeff_beta, factor_max, factor_min,
                      factor_threshold)
        super().__init__(pipeline, scheduler, freeze_step=freeze_step, eps=eps)
        self.lamb = dict(max_coeff=float(max_coeff), min_coeff=float(min_coeff), coeff_beta=float(coeff_beta),
                         factor_max=float(factor_max), factor_min=float(factor_min),
                         factor_threshold=float(factor_threshold))

    def make_optimizer(self, model: nn.Module, optim: dict[str, Any]) -> torch.optim.Optimizer:
        self.optimizer = OnebitLambStep(
            [p for p in model.parameters() if p.requires_grad], lr=float(optim["lr"]),
            betas=tuple(optim.get("betas", (0.9, 0.999))), eps=self.eps,
            weight_decay=float(optim.get("weight_decay", 0.0)), freeze_step=self.freeze_step, **self.lamb)
        return self.optimizer
