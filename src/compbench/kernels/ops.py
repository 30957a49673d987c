"""Launchers of the CUDA kernels: torch tensors in, torch tensors out (CUDA only; CuPy required).

Each function's twin (same arguments, same result) is named in its docstring; the compressors call
these through `cuda_kernels_enabled(t)` and fall back to the twin otherwise. Scalars that live on
the GPU (scales, means) are passed as 1-element tensors and read by the kernel, so no launcher
synchronizes with the host except the compactions (`compaction`: `compact_abs_ge` and the CompLL
filters), which must learn how many indices they found.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from compbench.kernels.loader import as_cupy, launch


def _flat_f32(x: Tensor) -> Tensor:
    flat = x.detach().reshape(-1)
    return flat if flat.dtype == torch.float32 and flat.is_contiguous() else flat.float().contiguous()


def _check_args(nonfinite: Tensor | None, anything: Tensor) -> tuple:
    """The kernels' (nonfinite pointer, check) arguments: a 1-element int32 flag on the device that
    the kernel sets to 1 when an element it reads is NaN or +-Inf (compbench.codec.finite), or, with
    None, any valid pointer and check = 0."""
    if nonfinite is None or nonfinite.numel() == 0:
        return as_cupy(anything), np.int32(0)
    if nonfinite.dtype != torch.int32 or nonfinite.numel() != 1 or nonfinite.device != anything.device:
        raise ValueError("nonfinite: a 1-element int32 tensor on the kernel's device")
    return as_cupy(nonfinite), np.int32(1)


def dragonn_select(x: Tensor, threshold: float, slots: int, seed: int,
                   nonfinite: Tensor | None = None) -> Tensor:
    """int32 table of `slots` entries: slot murmur3_32(i, seed) % slots holds the largest i with
    |x_i| >= threshold, -1 if none; `nonfinite` (1-element int32, or None) set to 1 when an element
    is NaN or +-Inf. Twin: `compressors.dragonn._select`'s torch path (the flag:
    `twins.nonfinite`)."""
    flat = _flat_f32(x)
    n = flat.numel()
    if n >= 2**31:
        raise ValueError(f"dragonn sends int32 indices: a tensor of {n} elements is too large; split it")
    table = torch.full((slots,), -1, dtype=torch.int32, device=flat.device)
    args = (as_cupy(flat), np.int64(n), np.float32(threshold), np.uint32(seed & 0xFFFFFFFF),
            as_cupy(table), np.uint32(slots), *_check_args(nonfinite, table))
    launch("dragonn", "dragonn_select", n, flat.device, args)
    return table


def compact_abs_ge(x: Tensor, threshold: float, capacity: int | None = None) -> Tensor:
    """int64 indices of the elements with |x| >= threshold, in arbitrary order (sort for a canonical
    one). Twin: `torch.nonzero(x.abs() >= threshold)`. One host sync for the count; a second
    launch when more than `capacity` (default n / 64 + 1024) pass."""
    flat = _flat_f32(x)
    n = flat.numel()
    cap = max(1, min(n, capacity if capacity is not None else n // 64 + 1024))
    return compaction("compact", "compact_abs_ge", n, flat.device,
                      (as_cupy(flat), np.int64(n), np.float32(threshold)), cap)


def compaction(module: str, function: str, n: int, device: torch.device, args: tuple, cap: int) -> Tensor:
    """The int64 indices a compaction kernel `function(*args, out, count, capacity)` appends through one
    atomic counter, in arbitrary order: one launch with room for `cap`, a second with room for all
    when more pass (one host sync for the count). Also the CompLL filters' launcher
    (`compll.runtime.CudaSelect`)."""
    count = torch.zeros(1, dtype=torch.int64, device=device)
    for _ in range(2):
        out = torch.empty(cap, dtype=torch.int64, device=device)
        count.zero_()
        # The counter is unsigned long long in the kernel: the same 8 bytes as this int64 (CuPy
        # passes device pointers untyped).
        launch(module, function, n, device, (*args, as_cupy(out), as_cupy(count), np.int64(cap)))
        found = int(count.item())
        if found <= cap:
            return out[:found]
        cap = found
    raise AssertionError(f"{function}: the count changed between two launches on the same input")


def _pack(function: str, flat: Tensor, per_byte: int) -> Tensor:
    n = flat.numel()
    nbytes = -(-n // per_byte)
    out = torch.empty(nbytes, dtype=torch.uint8, device=flat.device)
    args = (as_cupy(flat), np.int64(n), as_cupy(out), np.int64(nbytes))
    launch("pack", function, nbytes, flat.device, args)
    return out


def _decoded(packed: Tensor, numel: int, out: Tensor | None) -> Tensor:
    if out is None:
        return torch.empty(numel, dtype=torch.float32, device=packed.device)
    return out.reshape(-1)[:numel]


def pack_signs(x: Tensor) -> Tensor:
    """uint8, ceil(n/8) bytes: bit i = x_i < 0. Twin: `packing.pack_bits(x < 0)` (torch path)."""
    return _pack("pack_signs", _flat_f32(x), 8)


def pack_bits(mask: Tensor) -> Tensor:
    """uint8, ceil(n/8) bytes: bit i = mask_i. Twin: `packing._pack_bits_torch`."""
    return _pack("pack_bits", mask.detach().reshape(-1).contiguous().view(torch.uint8), 8)


def decode_bits(packed: Tensor, numel: int, one: Tensor, zero: Tensor, out: Tensor | None = None) -> Tensor:
    """fp32, numel values: `one` where bit i is set, else `zero` (1-element device tensors).
    Twin: `packing.decode_bits` (torch path)."""
    res = _decoded(packed, numel, out)
    one32, zero32 = one.reshape(1).float().contiguous(), zero.reshape(1).float().contiguous()
    args = (as_cupy(packed.contiguous()), np.int64(numel), as_cupy(one32), as_cupy(zero32), as_cupy(res))
    launch("pack", "decode_bits", numel, packed.device, args)
    return res


def pack_2bit(codes: Tensor) -> Tensor:
    """uint8, ceil(n/4) bytes, four 2-bit codes per byte. Twin: `packing.pack_2bit` (torch path)."""
    return _pack("pack_2bit", codes.detach().reshape(-1).contiguous(), 4)


def decode_2bit(packed: Tensor, numel: int, values: Tensor, out: Tensor | None = None) -> Tensor:
    """fp32, numel values: values[code i] (`values`: 4 entries on the device).
    Twin: `packing.decode_2bit` (torch path)."""
    res = _decoded(packed, numel, out)
    table = values.reshape(-1).float().contiguous()
    launch("pack", "decode_2bit", numel, packed.device,
           (as_cupy(packed.contiguous()), np.int64(numel), as_cupy(table), as_cupy(res)))
    return res


def qsgd_codes(flat: Tensor, scale: Tensor, levels: int, bucket_size: int, seed: int) -> Tensor:
    """uint8 offset-binary QSGD codes with the counter-based stream. Twin: `twins.qsgd_codes`."""
    x = _flat_f32(flat)
    n = x.numel()
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    args = (as_cupy(x), np.int64(n), as_cupy(scale.float().contiguous()), np.int64(bucket_size),
            np.float32(levels), np.uint32(seed & 0xFFFFFFFF), as_cupy(codes))
    launch("quantize", "qsgd_codes", n, x.device, args)
    return codes


def terngrad_codes(flat: Tensor, scale: Tensor, seed: int) -> Tensor:
    """Packed 2-bit TernGrad codes with the counter-based stream (the kernel generated from
    compll/specs/terngrad.py). Twin: `twins.terngrad_codes`."""
    x = _flat_f32(flat)
    n = x.numel()
    nbytes = (n + 3) // 4
    out = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    args = (as_cupy(x), np.int64(n), as_cupy(scale.reshape(1).float().contiguous()),
            np.uint32(seed & 0xFFFFFFFF), as_cupy(out), np.int64(nbytes))
    launch("compll_terngrad", "terngrad_codes", nbytes, x.device, args)
    return out


def tbq_step(r: Tensor, g: Tensor, tau: float) -> Tensor:
    """TBQ with the residual update in the kernel (generated from compll/specs/tbq.py): R (fp32,
    contiguous) is updated in place; returns the packed 2-bit codes. Twin: `twins.tbq_step`
    (= tbq._threshold_quantize)."""
    if r.dtype != torch.float32 or not r.is_contiguous():
        raise ValueError("tbq_step updates a contiguous fp32 residual in place")
    grad = _flat_f32(g)
    n = r.numel()
    nbytes = (n + 3) // 4
    out = torch.empty(nbytes, dtype=torch.uint8, device=r.device)
    args = (as_cupy(r), as_cupy(grad), np.int64(n), np.float32(tau), as_cupy(out), np.int64(nbytes))
    launch("compll_tbq", "tbq_step", nbytes, r.device, args)
    return out


def scatter_add(out: Tensor, indices: Tensor, values: Tensor) -> Tensor:
    """out[indices] += values (duplicates add; fp32 `out`, contiguous). Twin: `index_add_`."""
    if out.dtype != torch.float32 or not out.is_contiguous():
        return out.index_add_(0, indices, values)  # other dtypes: torch's own kernel
    idx = indices.reshape(-1).to(torch.int32).contiguous()
    vals = values.reshape(-1).float().contiguous()
    m = idx.numel()
    launch("scatter", "scatter_add", m, out.device, (as_cupy(out), as_cupy(idx), as_cupy(vals), np.int64(m)))
    return out


def _memory_args(a: Tensor, b: Tensor, g: Tensor, kind: int, c0: float, c1: float, scale: float) -> tuple:
    """The state, gradient and constants of memory.cu's kernels (b: any fp32 tensor for RESIDUAL)."""
    for t in (a, g) if kind == 0 else (a, b, g):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device != g.device:
            raise ValueError("memory.cu takes contiguous fp32 tensors on one device")
    return (as_cupy(a), as_cupy(b if kind else a), as_cupy(g)), (
        np.int32(kind), np.float32(c0), np.float32(c1), np.float32(scale), np.int32(scale != 1.0),
        np.int32(kind == 0 and c0 != 1.0))


def compensate_select(a: Tensor, b: Tensor, g: Tensor, kind: int, c0: float, c1: float, scale: float,
                      threshold: float = 0.0, slots: int = 0, seed: int = 0,
                      nonfinite: Tensor | None = None) -> Tensor:
    """The memory updated in place and, with slots > 0, DRAGONN's int32 table of the compensated
    tensor (-1: empty) in the same pass; an empty tensor for slots == 0 (the GPU compacts later).
    `nonfinite` (1-element int32, or None) set to 1 when an element of the raw gradient `g` is NaN
    or +-Inf. Twin: `kernels.cpu.compensate_select` (same state bytes; the table as
    `dragonn_select`'s; the same flag)."""
    n = g.numel()
    state, consts = _memory_args(a, b, g, kind, c0, c1, scale)
    table = torch.full((max(slots, 1),), -1, dtype=torch.int32, device=g.device)
    args = (*state, np.int64(n), *consts, np.float32(threshold), np.uint32(seed & 0xFFFFFFFF), as_cupy(table),
            np.uint32(slots), *_check_args(nonfinite, table))
    launch("memory", "compensate_select", n, g.device, args)
    return table if slots else table[:0]


def compensate_at(a: Tensor, b: Tensor, g: Tensor, indices: Tensor, kind: int, c0: float, c1: float,
                  scale: float) -> Tensor:
    """The compensated values at flat `indices`, state untouched. Twin: `kernels.cpu.compensate_at`."""
    state, consts = _memory_args(a, b, g, kind, c0, c1, scale)
    idx = indices.reshape(-1).to(device=g.device, dtype=torch.int64).contiguous()
    k = idx.numel()
    out = torch.empty(k, dtype=torch.float32, device=g.device)
    launch("memory", "compensate_at", k, g.device, (*state, as_cupy(idx), np.int64(k), *consts, as_cupy(out)))
    return out


def sgd_step(p: Tensor, buf: Tensor, grad: Tensor, indices: Tensor, values: Tensor, lr: float,
             weight_decay: float, momentum: float, nesterov: bool, first: bool, dgc: bool,
             fma_tail: int = 0) -> None:
    """One SGD step in one pass from a dense `grad` or (grad empty) the sparse update (`indices`
    ascending, unique, int64; `values` fp32). Twin: `kernels.cpu.sgd_step` (same arguments)."""
    n, dense = p.numel(), grad.numel() > 0
    with_buf = bool(momentum) and (bool(weight_decay) or not dgc)
    idx = indices.reshape(-1).to(device=p.device, dtype=torch.int64).contiguous()
    vals = values.reshape(-1).to(device=p.device, dtype=torch.float32).contiguous()
    if not dense and not weight_decay and not with_buf:
        k = idx.numel()
        launch("optim", "sgd_sparse", k, p.device, (as_cupy(p), as_cupy(idx), as_cupy(vals), np.int64(k),
                                                     np.float32(-lr)))
        return
    anything = p  # a valid pointer for the arguments a call does not read
    args = (as_cupy(p), as_cupy(buf if with_buf else anything), as_cupy(grad if dense else anything),
            as_cupy(idx if idx.numel() else anything), as_cupy(vals if vals.numel() else anything),
            np.int64(idx.numel()), np.int64(n), np.int32(dense), np.float32(-lr), np.float32(weight_decay),
            np.float32(momentum), np.int32(nesterov), np.int32(first), np.int32(dgc), np.int32(with_buf),
            np.int64(n - min(n, max(0, fma_tail))))
    launch("optim", "sgd_step", n, p.device, args)


def adam_step(p: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, grad: Tensor, indices: Tensor, values: Tensor,
              lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: float,
              decoupled: bool, fma_tail: int = 0) -> None:
    """One Adam/AdamW step in one pass from a dense `grad` or (grad empty) the sparse update
    (`indices` ascending, unique, int64; `values` fp32). Twin: `kernels.cpu.adam_step` (same
    arguments; its float constants, each rounded once from the double computed here as there)."""
    n, dense = p.numel(), grad.numel() > 0
    idx = indices.reshape(-1).to(device=p.device, dtype=torch.int64).contiguous()
    vals = values.reshape(-1).to(device=p.device, dtype=torch.float32).contiguous()
    bc1, bc2 = 1 - math.pow(beta1, step), 1 - math.pow(beta2, step)
    small = abs(1 - beta1) < 0.5
    c1 = np.float32(1 - beta1) if small else np.float32(np.float32(1 - beta1) - np.float32(1))
    anything = p  # a valid pointer for the arguments a call does not read
    args = (as_cupy(p), as_cupy(exp_avg), as_cupy(exp_avg_sq), as_cupy(grad if dense else anything),
            as_cupy(idx if idx.numel() else anything), as_cupy(vals if vals.numel() else anything),
            np.int64(idx.numel()), np.int64(n), np.int32(dense), np.float32(-(lr / bc1)),
            np.float32(weight_decay), np.float32(1 - lr * weight_decay), c1, np.float32(beta2),
            np.float32(1 - beta2), np.float32(math.sqrt(bc2)), np.float32(eps), np.int32(weight_decay != 0),
            np.int32(decoupled), np.int32(small), np.int64(n - min(n, max(0, fma_tail))))
    launch("optim", "adam_step", n, p.device, args)
