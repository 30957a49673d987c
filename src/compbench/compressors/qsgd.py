"""`qsgd`: QSGD (Alistarh et al., NeurIPS 2017), s levels per bucket with stochastic rounding."""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, Ctx, make_ctx
from compbench.codec.buffers import Scratch
from compbench.codec.packing import (
    PackedCodeCompressor,
    ceil_log2,
    noise_seed,
    pack_uint,
    packed_nbytes,
    uniform_noise,
    unpack_uint,
)
from compbench.kernels import cpu, cpu_kernels_enabled, cuda_kernels_enabled
from compbench.kernels.twins import bucket_norms, qsgd_scale

# Codes are packed from uint8: sign + level must fit in 8 bits.
MAX_LEVELS = 127


class QSGD(PackedCodeCompressor):
    """Unbiased stochastic quantization to `levels` (s) levels per bucket of `bucket_size` elements.

    Per bucket: norm = ||x_bucket||_2, level = floor(s*|x|/norm + U) with U ~ Uniform[0, 1), decoded
    as sign(x) * level * norm / s, so E[decode] = x. On the wire: one (1 + ceil(log2(s+1)))-bit code
    per element, really packed (ceil(n*b/8) bytes), plus one fp32 norm per bucket.

    Defaults: `levels=127` gives 8-bit codes (byte aligned: no bit shuffling, 4x smaller than fp32,
    variance factor min(d/s^2, sqrt(d)/s) = 0.03 at d=512); `levels=7` gives 4-bit codes (8x) and
    `levels=1` 2-bit ones (16x). `bucket_size=512` is the default bucket of IST-DASLab's
    smart-quantizer (the QSGD authors' lab).

    The code of an element is the offset-binary value sign*level + s in [0, 2s] (2s+1 values need
    exactly 1 + ceil(log2(s+1)) bits for every s >= 1). Rounding the signed value floor(q + U) with
    q = s*x/norm is the same distribution as the paper's sign(x)*floor(|q| + U') (U' = 1 - U) without
    an abs pass. Unbiased up to fp32 rounding of q + s + U (about 2^-16 of a level at s = 127).

    Rounding noise comes from a stream seeded by (seed, rank, step, tensor name): the counter-based
    stream of the CUDA and compiled CPU kernels, else numpy's generator (`packing.uniform_noise`):
    runs are reproducible, and ranks never share noise (shared noise would correlate their
    rounding errors and the average would lose the 1/N variance reduction).

    DRAGONN's QSGD sends half of the payload and duplicates it on decode; compbench sends all codes.
    """

    name = "qsgd"
    caps = Capabilities(unbiased=True)

    def __init__(self, levels: int = MAX_LEVELS, bucket_size: int = 512, seed: int = 0) -> None:
        if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= MAX_LEVELS:
            raise ValueError(
                f"compressor=qsgd: levels={levels} must be an integer in 1..{MAX_LEVELS}; "
                "pass e.g. levels=127 (8-bit codes) or levels=7 (4-bit)"
            )
        if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
            raise ValueError(
                f"compressor=qsgd: bucket_size={bucket_size} must be an integer >= 1; "
                "pass e.g. bucket_size=512"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"compressor=qsgd: seed={seed} must be an integer; pass e.g. seed=0")
        self.levels = levels
        self.bucket_size = bucket_size
        self.seed = seed
        self.bits = 1 + ceil_log2(levels + 1)
        # Per-name noise buffer: a fresh 100 MB tensor per call costs more than the rounding itself.
        self._noise = Scratch()

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.reshape(-1).float()
        if cuda_kernels_enabled(flat):
            seed = noise_seed(self.seed, self.step, name)
            codes, norms = _quantize_cuda(flat, self.levels, self.bucket_size, seed)
        elif cpu_kernels_enabled(flat) and flat.numel():
            # One compiled read: norms, then codes from the CUDA kernel's counter-based stream.
            seed = noise_seed(self.seed, self.step, name)
            codes, norms = cpu.qsgd_quantize(flat, self.levels, self.bucket_size, seed)
        else:  # the twin: numpy's PCG64 fills a noise tensor (same distribution, another stream)
            noise = self._noise.like(name, flat)
            uniform_noise(noise, self.seed, self.step, name)
            codes, norms = _quantize(flat, self.levels, self.bucket_size, noise)
        ctx = make_ctx(x, name, levels=self.levels, bucket_size=self.bucket_size, bits=self.bits)
        return [pack_uint(codes, self.bits), norms], ctx

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        packed, norms = payload
        m = ctx.meta
        codes = unpack_uint(packed, m["bits"], ctx.numel)
        return _dequantize(codes, norms, m["levels"], m["bucket_size"], out)

    def wire_bytes(self, numel: int) -> int:
        buckets = -(-numel // self.bucket_size)
        return packed_nbytes(numel, self.bits) + 4 * buckets


def _buckets(t: Tensor, bucket_size: int) -> tuple[Tensor | None, Tensor | None]:
    """(full buckets as a (B, d) view, the shorter last bucket) of a flat tensor, without copying."""
    full = t.numel() // bucket_size
    head = t[: full * bucket_size].view(full, bucket_size) if full else None
    tail = t[full * bucket_size :] if t.numel() % bucket_size else None
    return head, tail


def _quantize(flat: Tensor, levels: int, bucket_size: int, noise: Tensor) -> tuple[Tensor, Tensor]:
    """The hot step: flat fp32 -> (uint8 offset-binary codes in [0, 2s], fp32 bucket norms).

    `noise` holds U[0, 1) for every element and is overwritten. code = floor(s*x/norm + U + s):
    adding s makes the value non-negative, so the truncating float -> uint8 cast is the floor.
    """
    head, tail = _buckets(flat, bucket_size)
    norms = bucket_norms(flat, bucket_size)
    scale = qsgd_scale(norms, levels)  # an all-zero bucket gets scale 0: every code is s (value 0)

    noise.add_(float(levels))
    noise_head, noise_tail = _buckets(noise, bucket_size)
    if head is not None and noise_head is not None:  # noise has flat's buckets
        noise_head.addcmul_(head, scale[: head.shape[0], None])
    if tail is not None and noise_tail is not None:
        noise_tail.addcmul_(tail, scale[-1:])
    # |s*x/norm| <= s up to fp32 rounding; the clamp keeps the codes in range.
    noise.clamp_(0.0, float(2 * levels))
    return noise.to(torch.uint8), norms


def _quantize_cuda(flat: Tensor, levels: int, bucket_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """`_quantize` as one RawKernel pass drawing U from the counter-based stream of `seed` (the
    bits of `twins.qsgd_codes`, not of numpy's generator: another stream, the same distribution)."""
    from compbench.kernels import ops

    norms = bucket_norms(flat, bucket_size)
    return ops.qsgd_codes(flat, qsgd_scale(norms, levels), levels, bucket_size, seed), norms


def _dequantize(codes: Tensor, norms: Tensor, levels: int, bucket_size: int, out: Tensor | None) -> Tensor:
    """codes (uint8, offset binary) and bucket norms -> flat fp32 values (code - s) * norm / s,
    written into `out[:n]` when given; on CPU one compiled pass (`kernels.cpu.qsgd_dequantize`)."""
    if cpu_kernels_enabled(norms) and (out is None or cpu_kernels_enabled(out.reshape(-1))):
        flat = (torch.empty(codes.numel(), dtype=torch.float32, device=codes.device) if out is None
                else out.reshape(-1))
        return cpu.qsgd_dequantize(codes.contiguous(), norms, levels, bucket_size, flat)[: codes.numel()]
    out = codes.to(torch.float32) if out is None else out[: codes.numel()].copy_(codes)
    step = norms.float() / levels
    head, tail = _buckets(out, bucket_size)
    if head is not None:
        k = step[: head.shape[0], None]
        head.sub_(float(levels)).mul_(k)
    if tail is not None:
        tail.sub_(float(levels)).mul_(step[-1:])
    return out
