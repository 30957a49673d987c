"""`tbq`: threshold binary quantization (Strom, Interspeech 2015) with its own residual."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, Ctx, make_ctx
from compbench.codec.buffers import Scratch
from compbench.codec.packing import (
    PackedCodeCompressor,
    decode_2bit,
    pack_2bit,
    packed_nbytes,
    ternary_codes,
    ternary_values,
)
from compbench.kernels import cpu, cpu_kernels_enabled, cuda_kernels_enabled


class TBQ(PackedCodeCompressor):
    """Each rank accumulates R += g per tensor; elements with R >= tau send +tau (R -= tau), those
    with R <= -tau send -tau (R += tau), the rest send nothing and stay in R. One step sends at
    most tau per element; larger values drain over several steps.

    On the wire: 2-bit codes packed 4 per byte, ceil(n/4) bytes and nothing else: tau is a shared
    hyper-parameter (it travels in the ctx, identical on every rank).

    The residual lives in the compressor (Strom's algorithm), so pair it with `memory=none`; an
    extra residual memory would feed back the same error twice. `tau` should be of the order of
    the gradient entries: MXNet's 2-bit compression (the same scheme) defaults to 0.5, tuned for
    its models; compbench defaults to 0.01 for per-element gradients of small CNNs.
    """

    name = "tbq"
    caps = Capabilities(owns=frozenset({"error_feedback"}),
                        recipe={"memory": "none", "optim.momentum": 0.0, "optim.lr": 0.3})

    def __init__(self, tau: float = 0.01) -> None:
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"compressor=tbq: tau={tau} must be a finite number > 0; pass e.g. tau=0.01")
        self.tau = float(tau)
        self.residuals: dict[str, Tensor] = {}
        self._work = Scratch()

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.reshape(-1).float()
        r = self.residuals.get(name)
        if r is None or r.shape != flat.shape or r.device != flat.device:
            r = self.residuals[name] = torch.zeros_like(flat)
        if cuda_kernels_enabled(flat):
            from compbench.kernels import ops

            return [ops.tbq_step(r, flat, self.tau)], make_ctx(x, name, tau=self.tau)
        if cpu_kernels_enabled(flat):  # the same step in one compiled pass
            return [cpu.tbq_step(r, flat, self.tau)], make_ctx(x, name, tau=self.tau)
        work = self._work.like(name, flat)
        return [_threshold_quantize(r, flat, self.tau, work)], make_ctx(x, name, tau=self.tau)

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        tau = torch.tensor([ctx.meta["tau"]], dtype=torch.float32, device=payload[0].device)
        return decode_2bit(payload[0], ctx.numel, ternary_values(tau), out)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, 2)

    def state_dict(self) -> dict:
        return {"residuals": {k: v.clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.residuals = {k: v.clone() for k, v in state.get("residuals", {}).items()}


def _threshold_quantize(r: Tensor, g: Tensor, tau: float, work: Tensor) -> Tensor:
    """The hot step, residual update included: R += g; q = +1 where R >= tau, -1 where R <= -tau,
    else 0; R -= tau * q; returns the packed 2-bit codes of q. `work` (fp32, same size) is
    overwritten. On GPU `ops.tbq_step` does the same as one kernel."""
    r.add_(g)
    q = (r >= tau).view(torch.int8) - (r <= -tau).view(torch.int8)
    # Convert q to fp32 first: torch's mixed-dtype r.sub_(int8) is ~5x slower on CPU.
    r.sub_(work.copy_(q), alpha=tau)
    return pack_2bit(ternary_codes(q))
