"""The CUDA generator: a spec's codes as a RawKernel for CuPy, following extensions/cuda/README.md
(no #include but common.cuh, `extern "C" __global__` entry points, grid-stride loops, no shared
memory or warp intrinsics, fp32 sums and products spelled __fadd_rn / __fsub_rn / __fmul_rn so that
nvcc cannot contract them into FMAs (`printer.CUDA`); division is IEEE-rounded by default).

Entry points: ENCODE(x, n, h, seed, out, nbytes): one thread per packed byte, the codes of its
8 / bits elements from the header `h` (device fp32: the spec's header, or its inputs when it has
none; computed by the generated torch code on the GPU, where reductions are torch's own), and
DECODE(packed, numel, table, out): out[i] = table[code i], the 2^bits values computed from the
header. The launcher is `compll.runtime.cuda_encode` / `cuda_decode`. The fixed code is in
templates/cuda_*.tmpl; this module fills it.
"""

from __future__ import annotations

from compbench.compll import catalog, lang, lower, skeleton
from compbench.compll.lower import Value
from compbench.compll.printer import CUDA, declare, text

# A statement of the kernels' innermost loop starts on a new line at this indentation.
_LINE = "\n" + " " * 16


def _temps(*values: Value) -> str:
    return "".join(_LINE + d for d in declare(lower.temps(*values), CUDA))


def _signature(args: list[tuple[str, str]]) -> str:
    return ",\n        ".join(f"{t} {name}" for t, name in args)


def encode_args(spec: lang.Spec) -> list[tuple[str, str]]:
    """The encode kernel's parameters as (C type, name): [state,] x, n, [h,] [seed,] params..., out,
    nbytes; `h` (the header, or the inputs) only when the codes read it."""
    args = [("float* __restrict__", "state")] if spec.stateful else []
    args += [("const float* __restrict__", "x"), ("long long", "n")]
    args += [("const float* __restrict__", "h")] if spec.reads_header else []
    args += [("unsigned int", "seed")] if spec.seeded else []
    args += [("float", p) for p in spec.params]
    return args + [("unsigned char* __restrict__", "out"), ("long long", "nbytes")]


def source(spec: lang.Spec | lang.Select) -> str:
    """The generated .cu of `spec` (loaded by `kernels.loader` as module `compll_NAME`)."""
    if isinstance(spec, lang.Select):
        return select_source(spec)
    low = lower.lower(spec)
    upd = [low.update] if low.update is not None else []
    return skeleton.render(
        "cuda_spec.cu", origin=catalog.origin(spec.name), name=spec.name, doc=spec.doc.splitlines()[0],
        helpers=skeleton.lines("cuda_helpers.cuh"), per=8 // spec.bits, bits=spec.bits,
        mask=(1 << spec.bits) - 1, enc=spec.encode_name, dec=spec.decode_name,
        signature=_signature(encode_args(spec)), temps=_temps(low.code, *upd), code=text(low.code.node, CUDA),
        state_in=f"{_LINE}const float stv = state[i];" if spec.stateful else "",
        state_out=f"{_LINE}state[i] = {text(u.node, CUDA)};" if (u := low.update) else "")


def filter_args(sel: lang.Select) -> list[tuple[str, str]]:
    """The filter kernel's parameters as (C type, name): x, n, h (the threshold), params..., out,
    count, cap."""
    return [("const float* __restrict__", "x"), ("long long", "n"), ("const float* __restrict__", "h"),
            *(("float", p) for p in sel.params),
            ("long long* __restrict__", "out"), ("unsigned long long* __restrict__", "count"),
            ("long long", "cap")]


def select_source(sel: lang.Select) -> str:
    """The generated .cu of a selection: NAME_filter, the compaction, and NAME_decode, the scatter
    (module `compll_NAME`). The sampled threshold runs as the generated torch code on the GPU
    (torch's sort), like a spec's header; the launcher (`compll.runtime.cuda_filter`) sorts the
    indices into index order."""
    low = lower.lower_select(sel)
    return skeleton.render(
        "cuda_select.cu", origin=catalog.origin(sel.name), name=sel.name, doc=sel.doc.splitlines()[0],
        helpers=skeleton.lines("cuda_helpers.cuh"), flt=sel.filter_name, dec=sel.decode_name,
        signature=_signature(filter_args(sel)), temps=_temps(low.keep), keep=text(low.keep.node, CUDA))
