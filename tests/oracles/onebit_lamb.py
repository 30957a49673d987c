"""The test oracle of sync=onebit_lamb: DeepSpeed's 1-bit LAMB optimizer re-written in plain torch,
exchanging inside its own `step` as the reference does (tests/unit/test_onebit_lamb.py checks that
the mode, which keeps only the update rule and sends through compbench's pipeline, reproduces it).

Reference: microsoft/DeepSpeed `deepspeed/runtime/fp16/onebit/lamb.py` (`OnebitLamb.step`) and
`deepspeed/runtime/comm/nccl.py` (`compressed_allreduce`, as tests/oracles/onebit_adam.py has it).
Per call of `step`, per parameter (the freeze is global):

- Call 1 only creates the state (step = 1; m = v = v_fresh = 0, coeff_freeze = 0, last_factor = 1).
- Warm-up (calls 2 .. freeze_step, at least call 2): g = the dense mean of the ranks' gradients,
  m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, v_fresh = v on the call whose counter is freeze_step;
  u = m / (sqrt(v) + eps) (+ wd p), c = ||p|| / ||u|| clipped to [min_coeff, max_coeff] (1 where a
  norm is 0), coeff_freeze = coeff_beta coeff_freeze + (1 - coeff_beta) c unless c == 1,
  p -= lr c u. At the end of the call whose counter reaches freeze_step the stage changes for good.
- Compressed (every later call): on the first, scaling_coeff = mean rms(m) / rms(m) per tensor. Then
  m_last = m, m = (b1 m + (1-b1) g_local) scaling_coeff; all momenta as one flat buffer (the
  reference fuses the model's momenta into one) through the compressed allreduce (worker and server
  error feedback); m /= scaling_coeff; g~ = (m - b1 m_last) / (1-b1), v_fresh = b2 v_fresh +
  (1-b2) g~^2; u as above with the frozen v; factor = max((sqrt(v)+eps) / (sqrt(v_fresh)+eps)),
  with weight decay r = min(1, ||m/(sqrt(v)+eps)|| / ||u||), factor = factor r + 1 - r; clipped to
  [factor_min, factor_max], then to last_factor * (1 +- factor_threshold); p -= lr coeff_freeze factor u.

Deviations of this oracle, none of which changes a run on a model whose size is a multiple of
N * lcm(N, 8) without zero momenta:
- The warm-up's dense mean is the optimizer's (DeepSpeed's engine averages the gradients before the
  call); call 1 sends nothing (the reference runs one compressed allreduce of zeros to set up
  buffers it then throws away).
- The flat buffer is padded with zeros on every call (the reference's padding keeps its last
  average from one call to the next); `reverse=True` fuses the momenta in the reverse order of the
  parameters (compbench's recipe fuses in back-propagation order).
- No `exp_avg_mask`, no checkpoint handling, fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from compbench.engines.base import Engine
from compbench.records.stats import StepStats
from tests.oracles.onebit_adam import OnebitAdam


class OnebitLamb(OnebitAdam):
    """1-bit LAMB with its own communication (see the module). It borrows 1-bit Adam's oracle for its
    flags and its compressed allreduce (`_compressed_allreduce`, applied to the flat buffer)."""

    def __init__(self, params: Iterable[Any], *, engine: Engine, stats: StepStats, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 freeze_step: int = 100, max_coeff: float = 10.0, min_coeff: float = 0.01,
                 coeff_beta: float = 0.9, factor_max: float = 4.0, factor_min: float = 0.5,
                 factor_threshold: float = 0.1, reverse: bool = False) -> None:
        super().__init__(params, engine=engine, stats=stats, lr=lr, betas=betas, eps=eps,
                         weight_decay=weight_decay, freeze_step=freeze_step)
        self.max_coeff, self.min_coeff, self.coeff_beta = max_coeff, min_coeff, coeff_beta
        self.factor_max, self.factor_min, self.factor_threshold = factor_max, factor_min, factor_threshold
        self.reverse = reverse
        self.flat_state: dict[str, Any] = {}  # the flat buffer's worker and server errors

    def _params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads
        assert closure is None
        initializing, frozen = not self.param_groups[0]["initialized"], self.frozen
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        params = self._params()
        for p in params:
            state = self.state[p]
            if not state:
                state.update(step=0, lamb_coeff_freeze=0.0, last_factor=1.0,
                             exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p),
                             exp_avg_sq_fresh=torch.zeros_like(p))
            state["step"] += 1
            self.stats.bytes_dense += 4 * p.numel()
        if initializing:
            self._set_flags(initialized=True)
            return None
        if not frozen:
            for i, p in enumerate(params):
                self._warmup(p, group, self.state[p], self.engine.allreduce(p.grad.float(), f"lamb.{i}"))  # type: ignore[union-attr]  # every parameter has one
            if self.state[params[-1]]["step"] >= group["freeze_step"]:
                self._set_flags(frozen=True)
            return None
        last = [self.state[p]["exp_avg"].detach().clone() for p in params]
        if "scaling_coeff" not in self.state[params[0]]:
            scales = [(torch.linalg.vector_norm(self.state[p]["exp_avg"]) /
                       np.sqrt(torch.numel(self.state[p]["exp_avg"]))).item() for p in params]
            united = sum(scales) / len(scales)
            for p, scale in zip(params, scales, strict=True):
                self.state[p]["scaling_coeff"] = united / scale
        for p in params:
            state = self.state[p]
            state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
            state["exp_avg"].mul_(state["scaling_coeff"])
        order = params[::-1] if self.reverse else params
        flat = torch.cat([self.state[p]["exp_avg"].reshape(-1) for p in order])
        if self.engine.size > 1:
            flat = self._compressed_allreduce(flat, self.flat_state, "lamb.flat")
        offset = 0
        for p in order:
            self.state[p]["exp_avg"].copy_(flat[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        for p, m_last in zip(params, last, strict=True):
            self._compressed(p, group, self.state[p], m_last)
        return None

    def _warmup(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], grad: Tensor) -> None:
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        if state["step"] == group["freeze_step"]:
            state["exp_avg_sq_fresh"] = exp_avg_sq.detach().clone()
        weight_norm = p.pow(2).sum().sqrt()
        update = exp_avg / (exp_avg_sq.sqrt() + group["eps"])
        if group["weight_decay"] > 0.0:
            update += group["weight_decay"] * p
        update_norm = update.pow(2).sum().sqrt()
        lamb_coeff = 1.0
        if weight_norm != 0 and update_norm != 0:
            lamb_coeff = (weight_norm / update_norm).item()
            if lamb_coeff > self.max_coeff:
                lamb_coeff = self.max_coeff
            if lamb_coeff < self.min_coeff:
                lamb_coeff = self.min_coeff
        if lamb_coeff != 1.0:
            state["lamb_coeff_freeze"] = (self.coeff_beta * state["lamb_coeff_freeze"]
                                          + (1 - self.coeff_beta) * lamb_coeff)
        p.add_(-group["lr"] * lamb_coeff * update)

    def _compressed(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], m_last: Tensor) -> None:
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq, fresh = state["exp_avg"], state["exp_avg_sq"], state["exp_avg_sq_fresh"]
        exp_avg.div_(state["scaling_coeff"])
        grad_reconstruct = (exp_avg - m_last * beta1) / (1 - beta1)
        fresh.mul_(beta2).addcmul_(grad_reconstruct, grad_reconstruct, value=1 - beta2)
        denom = exp_avg_sq.sqrt() + group["eps"]
        update_prelim = exp_avg / denom
        if group["weight_decay"] > 0.0:
            update = update_prelim + group["weight_decay"] * p
        else:
            update = update_prelim
        update_norm = update.pow(2).sum().sqrt()
        denom_real = fresh.sqrt() + group["eps"]
        factor = (denom / denom_real).max().item()
        if group["weight_decay"] > 0.0:
            update_ratio = min(1.0, (update_prelim.pow(2).sum().sqrt() / update_norm).item())
            factor = factor * update_ratio + (1.0 - update_ratio)
        if factor > self.factor_max:
            factor = self.factor_max
        if factor < self.factor_min:
            factor = self.factor_min
        if factor > state["last_factor"] * (1.0 + self.factor_threshold):
            factor = state["last_factor"] * (1.0 + self.factor_threshold)
        if factor < state["last_factor"] * (1.0 - self.factor_threshold):
            factor = state["last_factor"] * (1.0 - self.factor_threshold)
        state["last_factor"] = factor
        lamb_coeff = state["lamb_coeff_freeze"] * factor
        p.add_(-group["lr"] * lamb_coeff * update)
