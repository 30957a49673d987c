"""The test oracle of sync=onebit_adam: compbench's former 1-bit Adam optimizer, which exchanged
inside its own `step` (three collectives per tensor). sync=onebit_adam now sends through compbench's
pipeline (compressor=rms_sign, memory=residual, comm=ps: compbench.sync.onebit_adam) and must
reproduce this, bit for bit where no padding is needed (tests/unit/test_onebit_adam_sync.py); this
file is checked against a float64 re-implementation of the reference (tests/unit/test_onebit_adam_optim.py).

1-bit Adam (Tang et al., ICML 2021): dense Adam for a warm-up, then a frozen second moment and the
momentum exchanged in one bit per element with two-level error feedback.

Reference: microsoft/DeepSpeed `deepspeed/runtime/fp16/onebit/adam.py` (the optimizer) and
`deepspeed/runtime/comm/nccl.py` (`compressed_allreduce`). Per parameter, per call of `step`:

- Call 1 only initializes the state (step = 1, m = v = 0): nothing moves, the gradient is dropped.
- Warm-up (calls 2 .. freeze_step; at least call 2): g = dense fp32 allreduce (mean) of the
  gradients, m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, then the update below. At the end of a call
  whose step counter reached freeze_step, the optimizer freezes for good.
- Compressed (every later call): m = b1 m + (1-b1) g_local; v is not touched; m is replaced by the
  compressed allreduce of m (world size > 1):
    worker: pad to P elements (a multiple of N * lcm(N, 8)), b = m + e_w, scale s = ||b||_2 / sqrt(P),
      e_w = b - s sign(b) (sign(0) = +1), sign bits packed, chunk j (P/N elements) to rank j
      (all-to-all), s to everyone (allgather);
    server (each rank, for its chunk): c = sum_i (s_i / N) sign_i + e_s, scale t = ||c|| / sqrt(P/N),
      e_s = c - t sign(c), its sign bits and t to everyone (allgather);
    everyone: m = concat_j t_j sign_j, cut back to the parameter's size.
- Update (both stages): p -= lr * (m / (sqrt(v) + eps) + weight_decay * p). No bias correction: the
  reference takes a `bias_correction` flag and never reads it.

Wire: sign bits packed 8 per byte, little-endian within a byte, bit set = negative
(`codec/packing.py`, as every compbench code); the reference packs with cupy.packbits
(big-endian), the same information.

Deviations, and why:
- The reference's warm-up relies on DeepSpeed's engine to allreduce gradients (and switches it off
  at the freeze); here the optimizer averages them itself, so the trainer must not average them.
- On call 1 the reference still lets the engine allreduce the (dropped) gradient and runs one
  compressed allreduce of zeros to set up its CuPy buffers; both results are thrown away, so here
  call 1 sends nothing (bytes_dense is still booked: what dense Adam would have sent).
- The reference resets the worker and server errors on `load_state_dict` (it saves rank 0's only);
  here each rank's errors are in its own state_dict, so a resume (same world size) is exact.
- No `exp_avg_mask`, no `non_freeze` groups, no amsgrad, fp32 parameters.

Bytes booked per parameter (this rank), the all-to-all counted as the whole buffer this rank hands
the engine (all N chunks, its own included, as comm=ps books its all-to-all), an allgather as the
payload this rank contributes:
- warm-up: 4 n (dense allreduce; `bytes_allreduce` and `calls_dense` too);
- compressed: P/8 (all-to-all of sign bits) + 4 (worker scale) + P/(8N) + 4 (server bits and scale),
  one compressed call per parameter (three collectives, booked as one exchange as comm=ps does);
- call 1, or world size 1 after the freeze: 0. bytes_dense: 4 n on every call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from compbench.codec.packing import decode_bits, pack_bits, packed_nbytes
from compbench.engines.base import Engine
from compbench.records.stats import StepStats


def padded_size(numel: int, world: int) -> int:
    """`numel` rounded up to a multiple of world * lcm(world, 8): every server chunk is a whole
    number of bytes of bits (the reference's `corrected_tensor_size`)."""
    unit = world * math.lcm(world, 8)
    return -(-numel // unit) * unit


def _sign_compress(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(packed bits of x < 0, scale ||x|| / sqrt(n) as a 1-element tensor, error x - scale sign(x))
    with sign(0) = +1, as the reference's `sign().add_(1).bool()`."""
    scale = (torch.linalg.vector_norm(x) / math.sqrt(x.numel())).reshape(1)
    packed = pack_bits(x < 0)
    error = x - decode_bits(packed, x.numel(), -scale, scale)
    return packed, scale, error


class OnebitAdam(torch.optim.Optimizer):
    """1-bit Adam with its own communication (see the module docstring). Each rank hands it its own
    gradients. State per parameter: `step`, `exp_avg`, `exp_avg_sq`, and after the freeze
    `worker_error` (P elements) and `server_error` (P/N); per group (the same in all groups):
    `initialized`, `frozen`. The freeze is global, decided with the first group's `freeze_step`."""

    def __init__(self, params: Iterable[Any], *, engine: Engine, stats: StepStats, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 freeze_step: int = 100) -> None:
        if not lr >= 0.0:
            raise ValueError(f"OnebitAdam lr={lr} must be >= 0")
        if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"OnebitAdam betas={betas} must be two numbers in [0, 1), e.g. (0.9, 0.999)")
        if not eps >= 0.0:
            raise ValueError(f"OnebitAdam eps={eps} must be >= 0")
        if not weight_decay >= 0.0:
            raise ValueError(f"OnebitAdam weight_decay={weight_decay} must be >= 0")
        if not (isinstance(freeze_step, int) and freeze_step >= 0):
            raise ValueError(f"OnebitAdam freeze_step={freeze_step} must be an integer >= 0 (warm-up steps)")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        freeze_step=freeze_step, initialized=False, frozen=False)
        super().__init__(params, defaults)
        self.engine, self.stats = engine, stats

    @property
    def frozen(self) -> bool:
        """Past the warm-up: the momentum travels compressed."""
        return bool(self.param_groups[0]["frozen"])

    def _set_flags(self, **flags: bool) -> None:
        for group in self.param_groups:
            group.update(flags)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]  # torch's overloads
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        initializing, frozen = not self.param_groups[0]["initialized"], self.frozen
        last_step = None
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise ValueError("OnebitAdam does not take sparse gradients; use a dense embedding")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
                    state["exp_avg_sq"] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
                state["step"] += 1
                last_step = state["step"]
                self.stats.bytes_dense += 4 * p.numel()
                if initializing:
                    continue  # the reference's first call: state only, nothing moves
                name = f"onebit_adam.{gi}.{pi}"
                if frozen:
                    self._compressed_step(p, group, state, name)
                else:
                    self._warmup_step(p, group, state, name)
                self._apply(p, group, state)
        if initializing:
            self._set_flags(initialized=True)
        elif not frozen and last_step is not None and last_step >= self.param_groups[0]["freeze_step"]:
            self._set_flags(frozen=True)
        return loss

    def _warmup_step(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], name: str) -> None:
        with self.stats.time("comm"):
            grad = self.engine.allreduce(p.grad.float(), f"{name}.grad")  # type: ignore[union-attr]  # stepped: has one
        self.stats.add_dense_allreduce(4 * p.numel(), calls=1)
        beta1, beta2 = group["betas"]
        state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

    def _compressed_step(self, p: Tensor, group: dict[str, Any], state: dict[str, Any], name: str) -> None:
        beta1 = group["betas"][0]
        exp_avg: Tensor = state["exp_avg"]
        exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)  # type: ignore[arg-type]  # stepped: has one
        if self.engine.size > 1:
            exp_avg.copy_(self._compressed_allreduce(exp_avg, state, name))

    def _compressed_allreduce(self, m: Tensor, state: dict[str, Any], name: str) -> Tensor:
        n_ranks, stats = self.engine.size, self.stats
        numel = m.numel()
        total = padded_size(numel, n_ranks)
        chunk = total // n_ranks
        if "worker_error" not in state:
            state["worker_error"] = torch.zeros(total, dtype=torch.float32, device=m.device)
            state["server_error"] = torch.zeros(chunk, dtype=torch.float32, device=m.device)
        with stats.time("compress"):
            buf = torch.zeros(total, dtype=torch.float32, device=m.device)
            buf[:numel] = m.reshape(-1)
            buf.add_(state["worker_error"])
            packed, scale, state["worker_error"] = _sign_compress(buf)
        chunk_bytes = packed_nbytes(chunk, 1)
        with stats.time("comm"):
            signs, _ = self.engine.alltoall(packed, [chunk_bytes] * n_ranks, f"{name}.a2a")
            scales = self.engine.allgather([scale], f"{name}.scale")
        with stats.time("decompress"):
            # the mean of the N workers' decoded chunks: sum of sign_i * (s_i / N)
            average = torch.zeros(chunk, dtype=torch.float32, device=m.device)
            for i in range(n_ranks):
                s = scales[i][0].to(m.device) * (1.0 / n_ranks)
                average.add_(decode_bits(signs[i * chunk_bytes:(i + 1) * chunk_bytes], chunk, -s, s))
        with stats.time("compress"):
            average.add_(state["server_error"])
            server_packed, server_scale, state["server_error"] = _sign_compress(average)
        with stats.time("comm"):
            gathered = self.engine.allgather([server_packed, server_scale], f"{name}.server")
        payloads = (packed, scale, server_packed, server_scale)
        stats.bytes_sent += sum(t.numel() * t.element_size() for t in payloads)
        stats.calls_compressed += 1
        with stats.time("decompress"):
            out = torch.cat([decode_bits(g[0].to(m.device), chunk, -g[1].to(m.device), g[1].to(m.device))
                             for g in gathered])
        return out[:numel].view(m.shape)

    @staticmethod
    def _apply(p: Tensor, group: dict[str, Any], state: dict[str, Any]) -> None:
        update = state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])
        if group["weight_decay"] > 0.0:
            update.add_(p, alpha=group["weight_decay"])
        p.add_(update, alpha=-group["lr"])
