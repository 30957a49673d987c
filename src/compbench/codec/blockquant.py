"""Block-scaled quantizers for compressed sharded collectives: FSDP's weight all-gather and gradient
reduce-scatter (ZeRO++'s qwZ/qgZ, float8 all-gather, LoCo, QSDP), each following its reference's
arithmetic exactly where it has one.

Wire layout (`encode`'s output, one flat uint8 tensor of `fmt.nbytes(numel)` bytes): the codes of
all `numel` elements first, then one scale per block as raw bytes of `fmt.scale_dtype`, no padding
between them. Elements are cut into blocks of `fmt.block` consecutive elements (block=0: one block,
the whole tensor); the last block may be short. It is zero-padded internally (zeros leave a block's
amax unchanged), but only what is needed is sent: codes for `numel` elements (int8 and fp8: one
byte each; int4: ceil(numel/2) bytes, two codes per byte, element 2i in the low nibble and 2i+1 in
the high one, an odd tensor's last high nibble 0) and ceil(numel/block) scales. So

    nbytes(n) = codes_nbytes(n) + scales_nbytes(n)
    codes_nbytes(n) = n (int8, fp8_e4m3) or ceil(n/2) (int4)
    scales_nbytes(n) = num_blocks(n) * scale_dtype.itemsize,  num_blocks(n) = ceil(n/block) (0 for n=0)

Formats and the reference each follows
--------------------------------------
int8, int4 (deterministic): DeepSpeed's ZeRO++ symmetric quantizer (csrc/includes/
quantization_utils.h `Params<Type::Symmetric, numBits>`, run by csrc/quantization/quantize.cu and
swizzled_quantize.cu; inverse in csrc/includes/dequantization_utils.h). Per block amax = max|x|;
the quantization multiplier is q = 2^bits / (2*amax) = 2^(bits-1)/amax, i.e. the range is 2^bits
levels over the span 2*amax, NOT (2^(bits-1)-1)/amax = 127/amax; a block of zeros takes q = 1.
code = round_half_even(fp32(x) * q) (`__float2int_rn` = torch.round), clamped to the two's
complement range [-2^(bits-1), 2^(bits-1)-1] = [-128, 127] (int8) or [-8, 7] (int4). What is
stored is 1/q (the dequantization multiplier amax/2^(bits-1), "scale" below, fp32), not q, and the
decode is code * scale in fp32. Consequence of the reference's range: -amax maps to -128 exactly but
+amax to 128, clipped to 127, so that one element errs by up to one step (scale); every other
element errs by at most scale/2.
  Deliberate differences: (1) block size: DeepSpeed has no fixed block. qwZ (deepspeed/runtime/
  zero/partition_parameters.py `CUDAQuantizer`) picks the group count so that groups hold at most
  ~8000 elements (target 8000, hard limit 16000, numel a multiple of 8 * groups); qgZ
  (deepspeed/runtime/comm/coalesced_collectives.py `all_to_all_quant_reduce`, 4 bits) uses
  max(shape[0], shape[1], world size) groups. Here the block is fixed (default 2048) with a short
  last block, so any numel works. (2) int4 nibble order: DeepSpeed's `PackedInt4 {int8_t high : 4;
  int8_t low : 4;}` stores element 2i in the member `low`, which the GCC/NVCC bit-field layout puts
  in bits 4-7: its element 2i is the HIGH nibble. Here element 2i is the low nibble (bits 0-3), the
  order of compbench's other packed codes (codec/packing.py): the bytes are DeepSpeed's with the
  nibbles of each byte swapped. (3) scale dtypes fp16/bf16 (DeepSpeed sends fp32 only): the scale
  amax/2^(bits-1) is rounded UP to the wire dtype (never down: |x|/scale <= 2^(bits-1) still holds,
  so no element clips beyond the reference's one) and clamped to the dtype's positive finite range,
  and the codes are computed with the scale actually sent (q = 1/scale) so the decode is consistent.
  fp16's range is narrow: a block's amax below ~2^-14 * 2^(bits-1) puts its scale among fp16's
  subnormals (coarser scales), above 65504 * 2^(bits-1) the codes saturate; bf16 has fp32's range.
  With fp32 scales the arithmetic is DeepSpeed's, bit for bit.

int8, int4 with stochastic=True: unbiased stochastic rounding as QSDP (Markov et al. 2023,
"Quantized Distributed Training of Large Models with Convergence Guarantees") needs of its weight
and gradient quantizers, and LoCo's and QSGD's analyses assume: code = floor(fp32(x) * q + u) with u
drawn uniform in [0, 1) from `generator` (one fp32 `torch.rand(numel)` draw, element i takes the
i-th value), so E[code] = x * q and a seeded generator reproduces the bytes. Deliberate difference:
here q = (2^(bits-1)-1)/amax (127 or 7 levels each side, symmetric) rather than DeepSpeed's
2^(bits-1)/amax: with DeepSpeed's range +amax would need code 128, and clamping it to 127 (as
DeepSpeed's own `sr_fake_quantize_kernel` in csrc/quantization/fake_quantizer.cu does) biases that
element; with the symmetric range no code ever clips and the rounding is unbiased everywhere.
Codes still travel as [-127, 127] (int8) / [-7, 7] (int4) in the same layout; scale = 1/q.

fp8_e4m3: torchao's float8 (torchao/float8/float8_utils.py `amax_to_scale`, `to_fp8_saturated`,
`EPS`; torchao/float8/float8_training_tensor.py `_ToFloat8ConstrFunc` and `_FromFloat8ConstrFunc`).
scale = fp32(448 / clamp(fp64(amax), min=EPS=1e-12)), computed in fp64 as torchao does; codes =
(fp32(x) * scale).clamp(-448, 448).to(torch.float8_e4m3fn) (the cast rounds to nearest even); what
is sent is that scale, the multiplier (torchao's `_scale`), and the decode is code / scale. block=0
is torchao's tensorwise scaling; block > 0 applies the same formula per block. A block of zeros has
amax clamped to EPS and decodes to zeros. Deliberate differences: the decode is fp32 (torchao divides
in the original dtype); with fp16/bf16 scales the multiplier is rounded DOWN to the wire dtype (so
|x| * scale stays within torchao's 448, no extra saturation) and clamped to its positive finite range
(fp16 cannot hold 448/amax for amax below ~7e-3: such blocks lose fp8's smallest values; bf16 has
fp32's range), and the codes are computed with the scale actually sent.

`ErrorCompensated`: LoCo (Xie et al. 2024, "LoCo: Low-Bit Communication Adaptor for Large-scale
Model Training"), as its authors merged it into DeepSpeed (PR #6730, "Merge LoCo with Zero++":
csrc/quantization/swizzled_quantize.cu `loco_swizzled_quant_kernel`, coalesced_collectives.py
`all_to_all_loco_quant_reduce`, defaults in deepspeed/runtime/zero/config.py `zeropp_loco_param`:
err_beta 0.8, reset_T 1024). Per call: e = decode(the stored int8 error) (zeros at first and after
a reset); h = g + e; send encode(h, fmt); e <- beta * e + (1 - beta) * (h - decode(sent)), a moving
average of the compression error; store encode(e, error_fmt) (int8 blocks). Every `reset_every`
calls the error restarts from zero. Deliberate differences: the update is computed in fp32 and
quantized directly (DeepSpeed rounds it to the gradient's fp16/bf16 first); the error's blocks are
error_fmt's (DeepSpeed reuses the 4-bit tensor's group count); the reset counter is per call site
(DeepSpeed's `loco_idx` is module-global, advanced once per tensor, and resets when it exceeds
reset_T, i.e. every reset_T + 1 calls); loss-scale handling (DeepSpeed's stage3 rescales the error's
scales when the loss scale changes and drops the error on overflow) is the caller's, via `reset()`.

Every function is torch ops only, with `device=` wherever a tensor is created and no host reads,
so the same code runs on CPU, CUDA and the `meta` device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["BlockFormat", "ErrorCompensated", "decode", "encode"]

KINDS = ("int8", "int4", "fp8_e4m3")
SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BITS = {"int8": 8, "int4": 4}
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_EPS = 1e-12  # torchao.float8.float8_utils.EPS: the amax floor that keeps 448/amax finite


@dataclass(frozen=True)
class BlockFormat:
    """A wire format: `kind` of code, `block` elements per scale (0: one scale for the tensor),
    the scales' dtype on the wire, and stochastic rounding (int8/int4 only)."""

    kind: str
    block: int = 2048
    scale_dtype: torch.dtype = torch.float32
    stochastic: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"BlockFormat.kind must be one of {KINDS}, got {self.kind!r}")
        if self.block < 0:
            raise ValueError(f"BlockFormat.block must be >= 0 (0: per-tensor), got {self.block}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"BlockFormat.scale_dtype must be fp32, fp16 or bf16, got {self.scale_dtype}")
        if self.stochastic and self.kind == "fp8_e4m3":
            raise ValueError("BlockFormat: stochastic rounding is for int8/int4 only, not fp8_e4m3")

    def num_blocks(self, numel: int) -> int:
        """Scales sent for a tensor of `numel` elements: ceil(numel/block), one for block=0 (none
        for an empty tensor)."""
        if numel == 0:
            return 0
        return 1 if self.block == 0 else -(-numel // self.block)

    def block_size(self, numel: int) -> int:
        """Elements per block for a tensor of `numel` elements (block=0: the whole tensor)."""
        return self.block if self.block > 0 else max(numel, 1)

    def codes_nbytes(self, numel: int) -> int:
        return (numel + 1) // 2 if self.kind == "int4" else numel

    def scales_nbytes(self, numel: int) -> int:
        return self.num_blocks(numel) * self.scale_dtype.itemsize

    def nbytes(self, numel: int) -> int:
        """Bytes of `encode`'s output for a tensor of `numel` elements, exactly."""
        return self.codes_nbytes(numel) + self.scales_nbytes(numel)

    def qmax(self) -> int:
        """The largest code magnitude the rounding targets: 2^(bits-1) (DeepSpeed's q_range, +amax
        clips to 2^(bits-1)-1) or 2^(bits-1)-1 for unbiased stochastic rounding (nothing clips)."""
        half = 1 << (BITS[self.kind] - 1)
        return half - 1 if self.stochastic else half

    def code_range(self) -> tuple[int, int]:
        """The codes' clamp: DeepSpeed's two's complement [-2^(bits-1), 2^(bits-1)-1] (it only ever
        acts on +amax, which rounds to 2^(bits-1)); stochastic: [-qmax, qmax], where it only catches
        fp rounding past qmax."""
        half = 1 << (BITS[self.kind] - 1)
        return (1 - half if self.stochastic else -half), half - 1


# --- blocks and scales ---------------------------------------------------------------------------


def _padded(flat: Tensor, length: int) -> Tensor:
    """`flat` zero-extended to `length` elements (itself when already that long)."""
    short = length - flat.numel()
    if short == 0:
        return flat
    return torch.cat([flat, torch.zeros(short, dtype=flat.dtype, device=flat.device)])


def _blocks(flat: Tensor, fmt: BlockFormat) -> Tensor:
    """The (num_blocks, block) view of `flat`, the short last block zero-padded."""
    n = flat.numel()
    size = fmt.block_size(n)
    return _padded(flat, fmt.num_blocks(n) * size).view(-1, size)


def _per_element(blocked: Tensor, n: int) -> Tensor:
    """A (num_blocks, block) tensor flattened back to its first n elements (the padding dropped)."""
    return blocked.reshape(-1)[:n]


def _to_wire(s: Tensor, dtype: torch.dtype, up: bool) -> Tensor:
    """Positive fp32 `s` in `dtype`, rounded toward +inf (`up`) or toward zero, inside the dtype's
    positive finite range [smallest subnormal, largest finite]: the direction that never shrinks a
    code's step (an int scale up, an fp8 multiplier down), so no code clips beyond the reference's."""
    if dtype == torch.float32:
        return s
    info = torch.finfo(dtype)
    s = s.clamp(min=info.smallest_normal * info.eps, max=info.max)
    near = s.to(dtype)
    # For positive floats the neighbours of a value are the neighbouring bit patterns; s is inside
    # the range, so the step never leaves it (never to 0 or inf).
    if up:
        return torch.where(near.float() < s, (near.view(torch.int16) + 1).view(dtype), near)
    return torch.where(near.float() > s, (near.view(torch.int16) - 1).view(dtype), near)


def _int_scales(amax: Tensor, fmt: BlockFormat) -> tuple[Tensor, Tensor]:
    """(q, wire scale) per block: q multiplies x into code units, the wire scale (1/q in
    scale_dtype) multiplies codes back. fp32: DeepSpeed's q = qmax/amax (1 for a zero block) and
    stored 1/q; narrower dtypes: the scale rounded up, q recomputed from what is sent."""
    q = torch.where(amax == 0, torch.ones_like(amax), fmt.qmax() / amax)
    if fmt.scale_dtype == torch.float32:
        return q, 1.0 / q
    wire = _to_wire(1.0 / q, fmt.scale_dtype, up=True)
    return 1.0 / wire.float(), wire


def _fp8_scales(amax: Tensor, fmt: BlockFormat) -> Tensor:
    """torchao's amax_to_scale per block, in fp64 as torchao, then in the wire dtype."""
    scale = (FP8_MAX / amax.to(torch.float64).clamp(min=FP8_EPS)).to(torch.float32)
    return _to_wire(scale, fmt.scale_dtype, up=False)


# --- codes ---------------------------------------------------------------------------------------


def _round(v: Tensor, fmt: BlockFormat, generator: torch.Generator | None) -> Tensor:
    """Round code-unit values: half to even (DeepSpeed's __float2int_rn), or floor(v + u) with u
    uniform in [0, 1) from `generator` (unbiased stochastic rounding)."""
    if not fmt.stochastic:
        return torch.round(v)
    noise = torch.rand(v.numel(), generator=generator, dtype=torch.float32, device=v.device)
    return torch.floor(v + noise)


def _pack_int4(codes: Tensor) -> Tensor:
    """int8 codes in [-8, 7] -> bytes, element 2i in the low nibble, 2i+1 in the high one."""
    nibbles = _padded(codes.view(torch.uint8) & 0x0F, 2 * ((codes.numel() + 1) // 2)).view(-1, 2)
    return nibbles[:, 0] | (nibbles[:, 1] << 4)


def _unpack_int4(packed: Tensor, n: int) -> Tensor:
    """Bytes -> n codes as fp32 (the 4-bit two's complement nibble n is (n ^ 8) - 8)."""
    nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[:n]
    return (nibbles ^ 8).to(torch.float32) - 8.0


def _encode_int(blocked: Tensor, n: int, fmt: BlockFormat,
                generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    q, wire = _int_scales(blocked.abs().amax(dim=1), fmt)
    low, high = fmt.code_range()
    v = _round(_per_element(blocked * q[:, None], n), fmt, generator).clamp_(low, high)
    codes = v.to(torch.int8)
    return (_pack_int4(codes) if fmt.kind == "int4" else codes.view(torch.uint8)), wire


def _encode_fp8(blocked: Tensor, n: int, fmt: BlockFormat) -> tuple[Tensor, Tensor]:
    wire = _fp8_scales(blocked.abs().amax(dim=1), fmt)
    scaled = (blocked * wire.float()[:, None]).clamp_(-FP8_MAX, FP8_MAX)
    return _per_element(scaled, n).to(torch.float8_e4m3fn).view(torch.uint8), wire


def _flat_float(x: Tensor) -> Tensor:
    if not x.is_floating_point():
        raise ValueError(f"blockquant.encode takes a float tensor, got {x.dtype}")
    return x.reshape(-1).to(torch.float32)


def encode(x: Tensor, fmt: BlockFormat, generator: torch.Generator | None = None) -> Tensor:
    """x: float tensor (fp32/bf16/fp16; flattened row-major) on any device -> 1-D uint8 tensor of
    fmt.nbytes(x.numel()) bytes on x's device: the codes, then the scales as raw bytes of
    fmt.scale_dtype (see the module docstring for each format's arithmetic and the layout).
    `generator` feeds stochastic rounding (it must live on x's device, torch's rule); with None
    torch's default generator of that device is used."""
    flat = _flat_float(x)
    n = flat.numel()
    blocked = _blocks(flat, fmt)
    if fmt.kind == "fp8_e4m3":
        codes, scales = _encode_fp8(blocked, n, fmt)
    else:
        codes, scales = _encode_int(blocked, n, fmt, generator)
    return torch.cat([codes, scales.contiguous().view(torch.uint8)])


# --- decode --------------------------------------------------------------------------------------


def _split(buf: Tensor, numel: int, fmt: BlockFormat) -> tuple[Tensor, Tensor]:
    """(code bytes, fp32 scales) of a wire buffer, after checking its size."""
    if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.numel() != fmt.nbytes(numel):
        raise ValueError(f"blockquant.decode: expected a 1-D uint8 buffer of {fmt.nbytes(numel)} bytes "
                         f"({numel} elements, {fmt}), got {buf.dtype} {tuple(buf.shape)}")
    cut = fmt.codes_nbytes(numel)
    # The clone realigns the scales: after an odd number of code bytes they cannot be viewed in place.
    scales = buf[cut:].clone().view(fmt.scale_dtype).to(torch.float32)
    return buf[:cut], scales


def _codes_as_float(code_bytes: Tensor, numel: int, fmt: BlockFormat) -> Tensor:
    if fmt.kind == "int4":
        return _unpack_int4(code_bytes, numel)
    if fmt.kind == "int8":
        return code_bytes.view(torch.int8).to(torch.float32)
    return code_bytes.view(torch.float8_e4m3fn).to(torch.float32)


def _into(out: Tensor | None, values: Tensor) -> Tensor:
    if out is None:
        return values
    if not out.is_floating_point() or out.numel() != values.numel() or not out.is_contiguous():
        raise ValueError(f"blockquant.decode: out must be a contiguous float tensor of {values.numel()} "
                         f"elements, got {out.dtype} {tuple(out.shape)}")
    out.view(-1).copy_(values)
    return out


def decode(buf: Tensor, numel: int, fmt: BlockFormat, out: Tensor | None = None) -> Tensor:
    """The inverse of `encode`: an fp32 tensor of `numel` elements on buf's device, or `out` (any
    float dtype, contiguous, `numel` elements) written and returned."""
    code_bytes, scales = _split(buf, numel, fmt)
    blocked = _blocks(_codes_as_float(code_bytes, numel, fmt), fmt)
    if fmt.kind == "fp8_e4m3":
        values = blocked / scales[:, None]
    else:
        values = blocked * scales[:, None]
    return _into(out, _per_element(values, numel))


# --- LoCo ----------------------------------------------------------------------------------------

INT8_ERROR = BlockFormat("int8")  # LoCo's compressed error: 8-bit symmetric blocks


class ErrorCompensated:
    """LoCo's error-compensated quantization for one call site (one gradient tensor): each `encode`
    sends fmt's quantization of (g + e), e being the moving average of past compression errors, kept
    compressed in `error_fmt` (int8 blocks) between calls. beta (DeepSpeed's err_beta, 0.8) weights
    the old error; `reset_every` (DeepSpeed's reset_T, 1024; 0: never) clears it every so many calls.
    See the module docstring for the update and how it differs from DeepSpeed's kernel."""

    def __init__(self, fmt: BlockFormat, error_fmt: BlockFormat = INT8_ERROR, beta: float = 0.8,
                 reset_every: int = 1024) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"ErrorCompensated: beta must be in [0, 1), got {beta}")
        if reset_every < 0:
            raise ValueError(f"ErrorCompensated: reset_every must be >= 0 (0: never), got {reset_every}")
        self.fmt, self.error_fmt, self.beta, self.reset_every = fmt, error_fmt, beta, reset_every
        self._error: Tensor | None = None  # encode(e, error_fmt): the error as it is stored
        self._numel: int | None = None
        self._calls = 0  # calls since the last reset

    def reset(self) -> None:
        """Forget the error (a loss-scale change or overflow, as DeepSpeed's stage3 drops it)."""
        self._error, self._numel, self._calls = None, None, 0

    def _stored_error(self, like: Tensor) -> Tensor:
        """The decoded error for a gradient like `like` (fp32 zeros when there is none)."""
        if self.reset_every and self._calls >= self.reset_every:
            self.reset()
        if self._error is None:
            return torch.zeros(like.numel(), dtype=torch.float32, device=like.device)
        if self._numel != like.numel():
            raise ValueError(f"ErrorCompensated: the error holds {self._numel} elements, the gradient "
                             f"{like.numel()} (one instance per call site)")
        return decode(self._error.to(like.device), like.numel(), self.error_fmt)

    def encode(self, g: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Wire bytes of (g + e) in `fmt` (as `encode`); the stored compressed error is updated.
        `generator` feeds stochastic rounding when fmt or error_fmt asks for it."""
        flat = _flat_float(g)
        e = self._stored_error(flat)
        h = flat + e
        wire = encode(h, self.fmt, generator)
        residual = h - decode(wire, h.numel(), self.fmt)
        e = self.beta * e + (1.0 - self.beta) * residual
        self._error = encode(e, self.error_fmt, generator)
        self._numel = h.numel()
        self._calls += 1
        return wire

    def state_dict(self) -> dict[str, Any]:
        """The compressed error (uint8 wire bytes of error_fmt, or None), its numel and the calls
        since the last reset: enough to resume bit for bit."""
        return {"error": self._error, "numel": self._numel, "calls": self._calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        error, numel = state["error"], state["numel"]
        if error is not None and (numel is None or error.numel() != self.error_fmt.nbytes(numel)):
            raise ValueError(f"ErrorCompensated.load_state_dict: {error.numel()} error bytes do not fit "
                             f"{numel} elements of {self.error_fmt}")
        self._error, self._numel, self._calls = error, numel, int(state["calls"])
