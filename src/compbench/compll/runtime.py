"""What runs the generated code: the helpers the generated torch modules call, the launchers of the
generated kernels and the compressor of a registered spec (finding specs and writing the generated
files: `compll.generated`, re-exported here).

- `SpecCompressor`: the compressor of a registered spec (the generated torch module subclasses it
  with the spec's settings as keyword arguments, so the registry's signature checks apply).
- `cpu_encode` / `cpu_decode` / `cuda_encode` / `cuda_decode`: the generated kernels' launchers.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from torch import Tensor

from compbench.codec.base import Ctx, make_ctx
from compbench.codec.packing import (
    PackedCodeCompressor,
    noise_seed,
    pack_uint,
    packed_nbytes,
    unpack_uint,
)
from compbench.compll import gen_torch, lang
from compbench.compll.generated import (
    conf_folder,
    conf_text,
    cpu_sources,
    cuda_sources,
    generated_dir,
    select,
    selects,
    spec,
    specs,
)
from compbench.kernels.twins import counter_uniform

__all__ = ["counter_uniform", "pack_codes", "unpack_codes", "specs", "spec", "selects", "select",
           "generated_dir", "conf_folder", "conf_text", "cpu_sources", "cuda_sources"]


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """int codes < 2^bits -> uint8 bytes, code i at bits bits*(i mod 8/bits) of byte i*bits/8."""
    return pack_uint(codes.to(torch.uint8), bits)


def unpack_codes(packed: Tensor, bits: int, numel: int) -> Tensor:
    return unpack_uint(packed, bits, numel)


# --- launchers --------------------------------------------------------------------------------------


def _op(name: str):
    return getattr(torch.ops.compbench_cpu, name)


def cpu_encode(s: lang.Spec, flat: Tensor, inputs: Tensor, seed: int, params: list[float],
               state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The generated C++ encode: (packed codes, fp32 header); `state` (a stateful spec's) is updated
    in place. `flat`: contiguous fp32 CPU."""
    if s.stateful:
        return _op(s.encode_name)(flat, inputs, seed & 0xFFFFFFFF, params, state)
    return _op(s.encode_name)(flat, inputs, seed & 0xFFFFFFFF, params)


def cpu_decode(s: lang.Spec, packed: Tensor, header: Tensor, numel: int, params: list[float],
               out: Tensor) -> Tensor:
    return _op(s.decode_name)(packed, header, numel, params, out)


def cuda_encode(s: lang.Spec, flat: Tensor, inputs: Tensor, seed: int, params: list[float],
                state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The generated RawKernel (parameters: `gen_cuda.encode_args`): the header by the generated torch
    code on the GPU (reductions are torch's), then one thread per packed byte."""
    import numpy as np

    from compbench.kernels.loader import as_cupy, launch

    n = flat.numel()
    header = gen_torch.module(s).make_header(flat, inputs, dict(zip(s.params, params, strict=True)))
    nbytes = packed_nbytes(n, s.bits)
    out = torch.empty(nbytes, dtype=torch.uint8, device=flat.device)
    args: list = []
    if s.stateful:
        if state is None:
            raise ValueError(f"compll {s.name}: a stateful spec's encode needs its state tensor")
        args.append(as_cupy(state))
    args += [as_cupy(flat), np.int64(n)]
    if s.reads_header:
        h = header if s.header and not s.inputs else inputs.reshape(-1).float()
        args.append(as_cupy(h.contiguous()))
    if s.seeded:
        args.append(np.uint32(seed & 0xFFFFFFFF))
    args += [np.float32(v) for v in params]
    args += [as_cupy(out), np.int64(nbytes)]
    launch(f"compll_{s.name}", s.encode_name, nbytes, flat.device, tuple(args))
    return out, header


def cuda_decode(s: lang.Spec, packed: Tensor, header: Tensor, numel: int, params: list[float],
                out: Tensor) -> Tensor:
    import numpy as np

    from compbench.kernels.loader import as_cupy, launch

    table = device_table(s, header, dict(zip(s.params, params, strict=True))).contiguous()
    launch(f"compll_{s.name}", s.decode_name, numel, packed.device,
           (as_cupy(packed.contiguous()), np.int64(numel), as_cupy(table), as_cupy(out)))
    return out


def device_table(s: lang.Spec, header: Tensor, params: dict) -> Tensor:
    """The generated `table` (the 2^bits decoded values) computed where `header` lives, without a
    host read: the generated code makes its codes on the header's device but its constants (`_t`, a
    `torch.tensor` of a Python number) on the host, 0-dim operands a GPU takes as scalars; for the
    CUDA launch they are made on the header's device too (a fill, no copy), so nothing there is
    built on the host. The values are integer and sign operations of the header's floats and the
    settings: the same bits on every device."""
    return _table_on(s, header.device)(header, params)


@cache
def _table_on(s: lang.Spec, device: torch.device) -> Callable[[Tensor, dict], Tensor]:
    """`gen_torch.module(s).table` with its constants made on `device` (`device_table`)."""
    table = gen_torch.module(s).table
    scope = dict(table.__globals__, _t=lambda v, dtype: torch.full((), v, dtype=dtype, device=device))
    on_device = types.FunctionType(table.__code__, scope)

    def run(header: Tensor, params: dict) -> Tensor:
        with device:  # the codes' torch.arange, made on the device
            return on_device(header, params)

    return run


# --- selections (filter + sampled threshold) ------------------------------------------------------


class CpuSelect:
    """The generated C++ operators of a selection, as `select`'s `kernels`."""

    def __init__(self, sel: lang.Select) -> None:
        self.sel = sel

    def threshold(self, x: Tensor, sample: Tensor | None, start: int, stride: int, count: int, j: int,
                  params: dict) -> Tensor:
        return _op(self.sel.threshold_name)(x, sample, start, stride, count, j,
                                            [float(params[k]) for k in self.sel.params])

    def filter(self, x: Tensor, inputs: Tensor, params: dict) -> Tensor:
        return _op(self.sel.filter_name)(x, inputs, [float(params[k]) for k in self.sel.params])


class CudaSelect:
    """The generated RawKernel of a selection's filter (the threshold: the generated torch code on the
    GPU), as `select`'s `kernels`."""

    def __init__(self, sel: lang.Select) -> None:
        self.sel = sel
        self.threshold = gen_torch.module(sel).threshold

    def filter(self, x: Tensor, inputs: Tensor, params: dict) -> Tensor:
        """int64 indices in index order: one launch with room for n / 64 + 1024 (one host sync for
        the count), a second with room for all when more pass; then sorted."""
        import numpy as np

        from compbench.kernels.loader import as_cupy
        from compbench.kernels.ops import compaction

        n = x.numel()
        h = inputs.reshape(-1).float().contiguous()
        prm = [np.float32(params[k]) for k in self.sel.params]
        found = compaction(f"compll_{self.sel.name}", self.sel.filter_name, n, x.device,
                           (as_cupy(x), np.int64(n), as_cupy(h), *prm), max(1, min(n, n // 64 + 1024)))
        return found.sort().values


def select_decode(sel: lang.Select, values: Tensor, indices: Tensor, ctx: Ctx,
                  out: Tensor | None = None) -> Tensor:
    """The generated decode of a selection's payload (or of every rank's, concatenated): zeros with
    `values` added at `indices` (duplicates add), into `out` when given (`buffers.check_out`), in
    the gradient's shape and dtype: what `sparse.sparse_decode` gives. The generated C++ operator on
    CPU, the generated RawKernel on CUDA, else the generated torch code (half-precision gradients
    accumulate in fp32)."""
    from compbench.codec.buffers import acc_dtype, check_out
    from compbench.kernels import cpu_kernels_enabled, cuda_kernels_enabled

    acc = acc_dtype(ctx.dtype)
    buf = (torch.empty(ctx.numel, dtype=acc, device=values.device) if out is None
           else check_out(out, ctx, values.device))
    vals = values.reshape(-1).to(acc).contiguous()
    idx = indices.reshape(-1).contiguous()
    if cpu_kernels_enabled(buf) and cpu_kernels_enabled(vals):
        _op(sel.decode_name)(vals, idx, buf)
    elif buf.dtype == torch.float32 and cuda_kernels_enabled(buf):
        import numpy as np

        from compbench.kernels.loader import as_cupy, launch

        buf.zero_()
        launch(f"compll_{sel.name}", sel.decode_name, idx.numel(), buf.device,
               (as_cupy(vals), as_cupy(idx.to(torch.int32)), np.int64(idx.numel()), as_cupy(buf)))
    else:
        gen_torch.module(sel).decode(vals, idx, buf)
    return buf.to(ctx.dtype).view(ctx.shape)


@dataclass(frozen=True)
class StridedSample:
    """A selection's strided sample, gathered by a fused pass that already ran: values[t] is the
    element at start + t * stride (`strided_sample` tells where before the pass)."""

    start: int
    stride: int
    values: Tensor


def strided_sample(sel: lang.Select, n: int, m: int, gen: torch.Generator) -> tuple[int, int, int] | None:
    """(start, stride, count) of the strided sample `select_indices` will draw from `gen` for a
    tensor of n elements and m samples, without drawing from `gen` (a copy of its state does); None
    when the selection's sample is not strided or is the whole tensor."""
    if sel.sample != "strided":
        return None
    peek = torch.Generator(device=gen.device)
    peek.set_state(gen.get_state())
    _, start, stride, count = gen_torch.module(sel).draw(n, m, peek, gen.device)
    return (start, stride, count) if stride > 1 else None


class _Compaction:
    """A selection's kernels with the filter replaced by a compaction a fused pass prepared, and the
    threshold taken from the strided sample it gathered (when it did)."""

    def __init__(self, kernels: object, compaction: Callable[[Tensor], Tensor],
                 sample: StridedSample | None) -> None:
        self._threshold = kernels.threshold  # type: ignore[attr-defined]
        self.compaction, self.sample = compaction, sample

    def threshold(self, x: Tensor, sample: Tensor | None, start: int, stride: int, count: int, j: int,
                  params: dict) -> Tensor:
        got = self.sample
        if got is None:
            return self._threshold(x, sample, start, stride, count, j, params)
        assert sample is None and (start, stride, count) == (got.start, got.stride, got.values.numel()), \
            "the fused pass gathered another sample than the selection drew"
        return self._threshold(got.values, None, 0, 1, count, j, params)

    def filter(self, x: Tensor, inputs: Tensor, params: dict) -> Tensor:
        return self.compaction(inputs)


def select_indices(sel: lang.Select, flat: Tensor, ratio: float, m: int, limit: int, gen: torch.Generator,
                   params: dict | None = None, compaction: Callable[[Tensor], Tensor] | None = None,
                   sample: StridedSample | None = None) -> Tensor:
    """A selection's int64 indices of flat fp32 `flat` (the generated glue `select` of `sel`): m
    samples drawn with `gen`, the threshold of ratio, at most `limit`. The generated C++ operators on
    CPU (when built), the generated RawKernel on CUDA (with CuPy), else the generated torch code.
    `compaction`: threshold -> the indices of `sel.keep` in index order, from a pass that already
    ran (memory=dgc's fused compensation and block maxima: `sparse.AbsIndex`), instead of the
    generated filter's own read; `sample`: the strided sample that pass gathered, instead of the
    threshold's own strided read."""
    from compbench.kernels import cpu_kernels_enabled, cuda_kernels_enabled

    mod = gen_torch.module(sel)
    flat = flat.detach().reshape(-1)
    dtype = flat.dtype
    if flat.dtype != torch.float32 or not flat.is_contiguous():
        flat = flat.float().contiguous()
    kernels: object = mod
    if cpu_kernels_enabled(flat):
        kernels = CpuSelect(sel)
    elif cuda_kernels_enabled(flat):
        kernels = CudaSelect(sel)
    if compaction is not None:
        kernels = _Compaction(kernels, compaction, sample)
    return mod.select(flat, ratio, m, limit, gen, params or {}, kernels, dtype)


# --- the compressor of a registered spec ---------------------------------------------------------


class SpecCompressor(PackedCodeCompressor):
    """A compressor generated from a CompLL spec: `spec_name`'s codes packed `bits` per element and
    its fp32 header on the wire ([codes, header], or [codes] without a header). Encode and decode
    run the generated C++ kernels on CPU (when built), the generated RawKernels on CUDA (with CuPy),
    else the generated torch code, which the parity tests compare them to."""

    spec_name = ""

    def __init__(self, **settings: float | int | bool) -> None:
        s = self.spec = spec(self.spec_name)
        self.name = s.name
        self.caps = s.caps
        for key, value in settings.items():
            rule = s.settings[key]
            ok = isinstance(value, rule.kind) and not (isinstance(value, bool) and rule.kind is not bool)
            if rule.kind is float and isinstance(value, int) and not isinstance(value, bool):
                ok, value = True, float(value)
            if ok and rule.check is not None:
                ok = rule.check.holds(value)
            if not ok:
                want = rule.hint or rule.kind.__name__
                raise ValueError(f"compressor={s.name}: {key}={value!r} must be {want}; "
                                 f"pass e.g. {key}={rule.default}")
            setattr(self, key, value)
        self.settings = settings
        self._params = [float(settings[k]) for k in s.params]  # the kernels' `params`, in spec order

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        from compbench.kernels import cpu_kernels_enabled, cuda_kernels_enabled

        s = self.spec
        flat = x.reshape(-1).float().contiguous()
        seed = noise_seed(int(self.settings.get("seed", 0)), self.step, name) & 0xFFFFFFFF if s.seeded else 0
        inputs = flat.new_zeros(0)
        if cpu_kernels_enabled(flat):
            packed, header = cpu_encode(s, flat, inputs, seed, self._params)
        elif cuda_kernels_enabled(flat):
            packed, header = cuda_encode(s, flat, inputs, seed, self._params)
        else:
            packed, header = gen_torch.module(s).encode(flat, inputs, seed, dict(self.settings))
        return ([packed, header] if s.header else [packed]), make_ctx(x, name)

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        from compbench.kernels import cpu_kernels_enabled, cuda_kernels_enabled

        s = self.spec
        packed = payload[0]
        header = payload[1] if s.header else packed.new_zeros(0, dtype=torch.float32)
        n = ctx.numel
        res = torch.empty(n, dtype=torch.float32, device=packed.device) if out is None else out
        res = res.reshape(-1)[:n]
        if cpu_kernels_enabled(res) and packed.device.type == "cpu":
            return cpu_decode(s, packed.contiguous(), header, n, self._params, res)
        if cuda_kernels_enabled(res):
            return cuda_decode(s, packed, header, n, self._params, res)
        return gen_torch.module(s).decode(packed, header, n, dict(self.settings), res)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, self.spec.bits) + 4 * len(self.spec.header)
