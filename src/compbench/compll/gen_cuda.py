"""The CUDA generator: a spec's codes as a RawKernel for CuPy, following extensions/cuda/README.md
(no #include but common.cuh, `extern "C" __global__` entry points, grid-stride loops, no shared
memory or warp intrinsics, fp32 sums and products spelled __fadd_rn / __fsub_rn / __fmul_rn so that
nvcc cannot contract them into FMAs; division is IEEE-rounded by default).

Entry points: ENCODE(x, n, h, seed, out, nbytes): one thread per packed byte, the codes of its
8 / bits elements from the header `h` (device fp32: the spec's header, or its inputs when it has
none; computed by the generated torch code on the GPU, where reductions are torch's own), and
DECODE(packed, numel, table, out): out[i] = table[code i], the 2^bits values computed from the
header. The launcher is `compll.runtime.cuda_encode` / `cuda_decode`.
"""

from __future__ import annotations

from compbench.compll import lang
from compbench.compll.lang import FLOAT, INT, Expr

_F = {"+": "__fadd_rn", "-": "__fsub_rn", "*": "__fmul_rn"}

HELPERS = """\
#ifndef COMPLL_HELPERS  // once per translation unit (the host shim compiles every source in one)
#define COMPLL_HELPERS
#ifdef __CUDACC__
__device__ __forceinline__ unsigned int cl_f2u(float v) { return __float_as_uint(v); }
__device__ __forceinline__ float cl_u2f(unsigned int b) { return __uint_as_float(b); }
#else  // the host shim of tests/unit/test_kernel_logic_host.py
union cl_bits { float f; unsigned int u; };
__device__ __forceinline__ unsigned int cl_f2u(float v) { cl_bits c; c.f = v; return c.u; }
__device__ __forceinline__ float cl_u2f(unsigned int b) { cl_bits c; c.u = b; return c.f; }
#endif
__device__ __forceinline__ int cl_exponent(float v) { return (int)((cl_f2u(v) >> 23) & 255u); }
__device__ __forceinline__ float cl_pow2(int e) { return cl_u2f((unsigned int)e << 23); }
__device__ __forceinline__ float cl_minf(float a, float b) { return (a != a || a < b) ? a : b; }
__device__ __forceinline__ float cl_maxf(float a, float b) { return (a != a || a > b) ? a : b; }
#endif
"""


def expr(e: Expr) -> str:
    """A CUDA element expression (x_i `xv`, `h[k]` or the inputs, code `code`)."""
    if isinstance(e, lang.Const):
        return f"(int)({e.value})" if e.kind == INT else f"{float(e.value)!r}f"
    if isinstance(e, lang.Let):
        return e.name
    if isinstance(e, lang.X):
        return "xv"
    if isinstance(e, lang.Uniform):
        return "cb_uniform(seed, i)"
    if isinstance(e, lang.State):
        return "stv"
    if isinstance(e, lang.Code):
        return "code"
    if isinstance(e, (lang.Header, lang.Input)):
        return f"h[{e.index}]"
    if isinstance(e, lang.Param):
        return e.name
    if isinstance(e, lang.Bin):
        a, b = expr(e.a), expr(e.b)
        if e.kind == FLOAT and e.op in ("+", "-", "*", "/"):
            a = a if e.a.kind == FLOAT else f"(float)({a})"
            b = b if e.b.kind == FLOAT else f"(float)({b})"
            return f"({a} / {b})" if e.op == "/" else f"{_F[e.op]}({a}, {b})"
        return f"({a} {e.op} {b})"
    if isinstance(e, lang.Un):
        a = expr(e.a)
        if e.op == "abs":
            return f"fabsf({a})" if e.a.kind == FLOAT else f"abs({a})"
        return {"neg": f"(-{a})", "isnan": f"({a} != {a})", "to_int": f"(int)({a})",
                "to_float": f"(float)({a})", "exponent": f"cl_exponent({a})", "pow2": f"cl_pow2({a})"}[e.op]
    if isinstance(e, lang.Where):
        a, b = expr(e.a), expr(e.b)
        if e.kind == FLOAT:
            a = a if e.a.kind == FLOAT else f"(float)({a})"
            b = b if e.b.kind == FLOAT else f"(float)({b})"
        return f"({expr(e.cond)} ? {a} : {b})"
    if isinstance(e, lang.MinMax):
        a, b = expr(e.a), expr(e.b)
        if e.kind == FLOAT:
            a = a if e.a.kind == FLOAT else f"(float)({a})"
            b = b if e.b.kind == FLOAT else f"(float)({b})"
            return f"cl_{e.op}f({a}, {b})"
        return f"(({a}) {'<' if e.op == 'min' else '>'} ({b}) ? ({a}) : ({b}))"
    raise ValueError(f"CompLL: no CUDA translation of {type(e).__name__}")


def _lets(*roots: Expr) -> str:
    types = {FLOAT: "float", INT: "int", lang.BOOL: "bool"}
    indent = "\n" + " " * 16
    return "".join(f"{indent}const {types[v.kind]} {v.name} = {expr(v.e)};" for v in lang.lets(*roots))


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
    per = 8 // spec.bits
    mask = (1 << spec.bits) - 1
    upd = [spec.update] if spec.update is not None else []
    signature = ",\n        ".join(f"{t} {name}" for t, name in encode_args(spec))
    state_in = "\n                const float stv = state[i];" if spec.stateful else ""
    state_out = f"\n                state[i] = {expr(spec.update)};" if spec.update is not None else ""
    return f"""\
// Generated by compbench.compll from src/compbench/compll/specs/{spec.name}.py: do not edit
// (`compbench gen {spec.name} --target cuda` prints it). {spec.doc.splitlines()[0]}
#include "common.cuh"

{HELPERS}
// {per} codes of {spec.bits} bits per byte, code k of byte j at bits {spec.bits}*k (element {per}j + k).
extern "C" __global__ void {spec.encode_name}({signature}) {{
    CB_FOR_EACH(j, nbytes) {{
        unsigned int b = 0;
        for (int t = 0; t < {per}; ++t) {{
            long long i = j * {per} + t;
            if (i < n) {{
                const float xv = x[i];{state_in}{_lets(spec.code, *upd)}
                const int code = ({expr(spec.code)}) & {mask};{state_out}
                b |= (unsigned int)code << ({spec.bits} * t);
            }}
        }}
        out[j] = (unsigned char)b;
    }}
}}

// Decode: out[i] = table[code i] (the 2^{spec.bits} values of the header).
extern "C" __global__ void {spec.decode_name}(const unsigned char* __restrict__ packed, long long numel,
        const float* __restrict__ table, float* __restrict__ out) {{
    CB_FOR_EACH(i, numel) {{
        out[i] = table[(packed[i / {per}] >> ({spec.bits} * (int)(i % {per}))) & {mask}];
    }}
}}
"""


def filter_args(sel: lang.Select) -> list[tuple[str, str]]:
    """The filter kernel's parameters as (C type, name): x, n, h (the threshold), params..., out,
    count, cap."""
    return [("const float* __restrict__", "x"), ("long long", "n"), ("const float* __restrict__", "h"),
            *(("float", p) for p in sel.params),
            ("long long* __restrict__", "out"), ("unsigned long long* __restrict__", "count"),
            ("long long", "cap")]


def select_source(sel: lang.Select) -> str:
    """The generated .cu of a selection: NAME_filter, the compaction, and NAME_decode, the scatter
    (module `compll_NAME`). The
    sampled threshold runs as the generated torch code on the GPU (torch's sort), like a spec's
    header; the launcher (`compll.runtime.cuda_filter`) sorts the indices into index order."""
    signature = ",\n        ".join(f"{t} {name}" for t, name in filter_args(sel))
    return f"""\
// Generated by compbench.compll from src/compbench/compll/specs/{sel.name}.py: do not edit
// (`compbench gen {sel.name} --target cuda` prints it). {sel.doc.splitlines()[0]}
#include "common.cuh"

{HELPERS}
// Compaction: the index of every element that passes, in arbitrary order, written to out[0 .. cap)
// through one atomic counter; the counter ends at the number that pass even beyond cap (the
// launcher then launches again with room for all).
extern "C" __global__ void {sel.filter_name}({signature}) {{
    CB_FOR_EACH(i, n) {{
        const float xv = x[i];{_lets(sel.keep)}
        if ({expr(sel.keep)}) {{
            unsigned long long pos = atomicAdd(count, 1ULL);
            if (pos < (unsigned long long)cap) out[pos] = i;
        }}
    }}
}}

// The scatter: out[idx[t]] += values[t] (the launcher zero-fills out first); duplicates add through
// atomicAdd, in any order.
extern "C" __global__ void {sel.decode_name}(const float* __restrict__ values, const int* __restrict__ idx,
        long long k, float* __restrict__ out) {{
    CB_FOR_EACH(t, k) {{ atomicAdd(&out[idx[t]], values[t]); }}
}}
"""
