"""`terngrad`: TernGrad (Wen et al., NeurIPS 2017), stochastic ternary codes {-s, 0, +s}."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, Ctx, make_ctx
from compbench.codec.buffers import Scratch
from compbench.codec.packing import (
    PackedCodeCompressor,
    decode_2bit,
    noise_seed,
    pack_2bit,
    packed_nbytes,
    ternary_codes,
    ternary_values,
    uniform_noise,
)
from compbench.kernels import cpu, cpu_kernels_enabled, cuda_kernels_enabled


class TernGrad(PackedCodeCompressor):
    """Stochastic ternarization: s = max|x| (after clipping), send sign(x)*s with probability |x|/s.

    With `clip=True` (the paper's default) the gradient is first clipped to `clip_sigma` (2.5)
    standard deviations, which lowers s and the variance but makes the estimate biased for the
    clipped elements; `unbiased` is therefore True only with `clip=False`. A tensor with zero
    standard deviation is not clipped (clipping would send nothing).

    On the wire: 2-bit codes, 4 per byte (ceil(n/4) bytes), plus s as one fp32: ceil(n/4) + 4.
    GRACE and MergeComp send one byte per ternary code in some paths; compbench packs them.
    The scale is per rank and travels in the payload (the paper's scalar sharing, a max of s over
    ranks, would need an extra allreduce before encoding).

    Rounding noise: a generator seeded by (seed, rank, step, tensor name), see `packing`.
    """

    name = "terngrad"
    caps = Capabilities(unbiased=True)

    def __init__(self, clip: bool = True, clip_sigma: float = 2.5, seed: int = 0) -> None:
        if not isinstance(clip, bool):
            raise ValueError(f"compressor=terngrad: clip={clip} must be true or false; pass e.g. clip=true")
        if isinstance(clip_sigma, bool) or not isinstance(clip_sigma, (int, float)) or not clip_sigma > 0:
            raise ValueError(
                f"compressor=terngrad: clip_sigma={clip_sigma} must be a number > 0; pass e.g. clip_sigma=2.5"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"compressor=terngrad: seed={seed} must be an integer; pass e.g. seed=0")
        self.clip = clip
        self.clip_sigma = float(clip_sigma)
        self.seed = seed
        self.caps = replace(TernGrad.caps, unbiased=not clip)
        self._noise = Scratch()

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.reshape(-1).float()
        clip_sigma = self.clip_sigma if self.clip else None
        if flat.numel() and (cuda_kernels_enabled(flat) or cpu_kernels_enabled(flat)):
            # The kernels (CUDA and compiled CPU alike) draw U from the counter-based stream of the
            # seed (twins.terngrad_codes) in the pass that packs; without them numpy's PCG64 fills a
            # noise tensor first (same distribution, another stream).
            scale = _scale(flat, clip_sigma)
            seed = noise_seed(self.seed, self.step, name)
            if flat.is_cuda:
                from compbench.kernels import ops

                packed = ops.terngrad_codes(flat, scale, seed)
            else:
                packed = cpu.terngrad_codes(flat, scale, seed)
            return [packed, scale.reshape(1)], make_ctx(x, name)
        noise = self._noise.like(name, flat)
        uniform_noise(noise, self.seed, self.step, name)
        packed, scale = _ternarize(flat, clip_sigma, noise)
        return [packed, scale], make_ctx(x, name)

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        packed, scale = payload
        return decode_2bit(packed, ctx.numel, ternary_values(scale), out)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, 2) + 4


def _scale(flat: Tensor, clip_sigma: float | None) -> Tensor:
    """s = max|x|, lowered to clip_sigma standard deviations when clipping (0-dim fp32 tensor).
    On CPU one compiled read (`kernels.cpu.absmax_var`; torch's std alone takes ~20 reads)."""
    if cpu_kernels_enabled(flat) and flat.numel():
        amax, var = cpu.absmax_var(flat).tolist()
        s = amax
        if clip_sigma is not None:
            bound = clip_sigma * math.sqrt(var)
            s = min(s, bound) if bound > 0 else s  # NaN: bound > 0 is false and s is NaN
        return torch.tensor(s, dtype=torch.float32, device=flat.device)
    lo, hi = torch.aminmax(flat)
    s = torch.maximum(hi, -lo)
    if clip_sigma is not None:
        bound_t = clip_sigma * flat.std(correction=0)
        s = torch.where(bound_t > 0, torch.minimum(s, bound_t), s)
    return s


def _ternarize(flat: Tensor, clip_sigma: float | None, noise: Tensor) -> tuple[Tensor, Tensor]:
    """The hot step: flat fp32 -> (packed 2-bit ternary codes, scale s as a 1-element fp32 tensor).

    Keeps element i iff |x_i| > U_i * s, i.e. with probability min(|x_i|, s) / s, without
    materializing the clipped tensor (clipped elements have |x| >= s and are always kept).
    `noise` holds U[0, 1) for every element and is overwritten.
    """
    if flat.numel() == 0:
        return pack_2bit(flat.new_zeros(0, dtype=torch.uint8)), flat.new_zeros(1)
    s = _scale(flat, clip_sigma)
    threshold = noise.mul_(s)
    pos = flat > threshold
    neg = flat < threshold.neg_()
    q = pos.view(torch.int8) - neg.view(torch.int8)
    return pack_2bit(ternary_codes(q)), s.reshape(1)
