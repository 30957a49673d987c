"""The C++ generator: a spec as two operators of the CPU extension (`torch.ops.compbench_cpu.*`).

encode(x, inputs, seed, params) -> (packed codes, fp32 header): ATen's parallel_for over chunks of
`lang.CHUNK` elements, 8 elements at a time in SIMD registers (GCC's vector extensions: `vexpr`;
the tensor's last n mod 8 elements one by one: `expr`). Each chunk keeps its reductions in 8 lanes
(lane l takes the elements i = l mod 8; lanes combined as ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)),
then the tensor's last n mod 8 elements, then the chunks in order): the same result at any number
of threads. The codes of 8 elements are packed straight into the output (`cl_pack8`: one bit plane
per movemask). When the codes read no header (onebit's bits), reductions and codes share one read
of x; otherwise a first pass reduces and a second encodes.

decode(packed, header, numel, params, out) -> out: the 2^bits values computed once from the header
(the spec's `value`), then out[i] = table[code i].

Element arithmetic is fp32, one rounding per operation (the extension is built with
-ffp-contract=off); header arithmetic is fp64, rounded to fp32 once.
"""

from __future__ import annotations

from compbench.compll import lang
from compbench.compll.lang import FLOAT, INT, Expr

_OPS = {"+", "-", "*", "/", "<", "<=", ">", ">=", "==", "&", "|", "<<", ">>"}


def expr(e: Expr, scalar: bool = False, names: dict[int, str] | None = None) -> str:
    """A C++ expression: element context (x_i `xv`, draw `u`, `h[k]`, code `code`: fp32/int32) or
    scalar context (reductions by name, n: fp64/int64)."""
    f, i_ = ("double", "int64_t") if scalar else ("float", "int32_t")
    if isinstance(e, lang.Const):
        if e.kind == INT:
            return f"{i_}({e.value})"
        return f"{f}({float(e.value)!r})" if scalar else f"{float(e.value)!r}f"
    if isinstance(e, lang.Let):
        return e.name
    if isinstance(e, lang.X):
        return "xv"
    if isinstance(e, lang.Uniform):
        return "cl_uniform(sd, i)"
    if isinstance(e, lang.State):
        return "stv"
    if isinstance(e, lang.Code):
        return "code"
    if isinstance(e, lang.Header):
        return f"h{e.index}"
    if isinstance(e, lang.Input):
        return f"{f}(in{e.index})"
    if isinstance(e, lang.Param):
        return f"{f}(prm_{e.name})"
    if isinstance(e, lang.Numel):
        return "n"
    if isinstance(e, lang.Reduction):
        assert names is not None
        return names[id(e)]
    if isinstance(e, lang.Bin):
        a, b = expr(e.a, scalar, names), expr(e.b, scalar, names)
        if e.kind == FLOAT and e.op in ("+", "-", "*", "/"):
            a = a if e.a.kind == FLOAT else f"{f}({a})"
            b = b if e.b.kind == FLOAT else f"{f}({b})"
        return f"({a} {e.op} {b})"
    if isinstance(e, lang.Un):
        a = expr(e.a, scalar, names)
        return {"neg": f"(-{a})", "abs": f"std::fabs({a})" if e.a.kind == FLOAT else f"std::abs({a})",
                "isnan": f"std::isnan({a})", "to_int": f"{i_}({a})", "to_float": f"{f}({a})",
                "exponent": f"cl_exponent({a})", "pow2": f"cl_pow2({a})"}[e.op]
    if isinstance(e, lang.Where):
        a, b = expr(e.a, scalar, names), expr(e.b, scalar, names)
        if e.kind == FLOAT:
            a = a if e.a.kind == FLOAT else f"{f}({a})"
            b = b if e.b.kind == FLOAT else f"{f}({b})"
        return f"({expr(e.cond, scalar, names)} ? {a} : {b})"
    if isinstance(e, lang.MinMax):
        a, b = expr(e.a, scalar, names), expr(e.b, scalar, names)
        if e.kind == FLOAT:
            a = a if e.a.kind == FLOAT else f"{f}({a})"
            b = b if e.b.kind == FLOAT else f"{f}({b})"
            return f"cl_{e.op}f<{f}>({a}, {b})"
        return f"std::{e.op}<{i_}>({a}, {b})"
    raise ValueError(f"CompLL: no C++ translation of {type(e).__name__}")


def lets(*roots: Expr, scalar: bool = False, names: dict[int, str] | None = None) -> str:
    """Declarations of the named values under `roots` (one line of statements)."""
    types = {FLOAT: "double" if scalar else "float", INT: "int64_t" if scalar else "int32_t",
             lang.BOOL: "bool"}
    return " ".join(f"const {types[v.kind]} {v.name} = {expr(v.e, scalar, names)};"
                    for v in lang.lets(*roots))


def vexpr(e: Expr) -> str:
    """The element expression on 8 consecutive elements at once, with GCC's vector extensions
    (v8f: fp32, v8i: int32 and conditions as -1/0 masks): the same operations lane by lane, so the
    same roundings as `expr`, in SIMD registers."""
    def as_float(node: Expr, text: str) -> str:
        if node.kind == FLOAT:
            return text
        return f"__builtin_convertvector({text if node.kind == INT else f'({text} & bi(1))'}, v8f)"

    if isinstance(e, lang.Let):
        return e.name
    if isinstance(e, lang.Const):
        return f"bi({e.value})" if e.kind == INT else f"bf({float(e.value)!r}f)"
    if isinstance(e, lang.X):
        return "xv"
    if isinstance(e, lang.Uniform):
        return "uv"
    if isinstance(e, lang.State):
        return "sv"
    if isinstance(e, lang.Header):
        return f"bf(h{e.index})"
    if isinstance(e, lang.Input):
        return f"bf(in{e.index})"
    if isinstance(e, lang.Param):
        return f"bf(float(prm_{e.name}))"
    if isinstance(e, lang.Bin):
        a, b = vexpr(e.a), vexpr(e.b)
        if e.kind == FLOAT and e.op in ("+", "-", "*", "/"):
            a, b = as_float(e.a, a), as_float(e.b, b)
        return f"({a} {e.op} {b})"
    if isinstance(e, lang.Un):
        a = vexpr(e.a)
        if e.op == "abs":
            return f"cl_vabs({a})" if e.a.kind == FLOAT else f"(({a} < bi(0)) ? -{a} : {a})"
        if e.op == "to_int":
            return {FLOAT: f"__builtin_convertvector({a}, v8i)", INT: a}.get(e.a.kind, f"({a} & bi(1))")
        if e.op == "to_float":
            return as_float(e.a, a)
        return {"neg": f"(-{a})", "isnan": f"({a} != {a})", "exponent": f"(((v8i)({a}) >> 23) & bi(255))",
                "pow2": f"(v8f)(({a}) << 23)"}[e.op]
    if isinstance(e, lang.Where):
        a, b = vexpr(e.a), vexpr(e.b)
        if e.kind == FLOAT:
            a, b = as_float(e.a, a), as_float(e.b, b)
        return f"({vexpr(e.cond)} ? {a} : {b})"
    if isinstance(e, lang.MinMax):
        a, b = vexpr(e.a), vexpr(e.b)
        if e.kind == FLOAT:
            a, b = as_float(e.a, a), as_float(e.b, b)
            return f"cl_v{e.op}({a}, {b})"
        return f"(({a} {'<' if e.op == 'min' else '>'} {b}) ? {a} : {b})"
    raise ValueError(f"CompLL: no vector translation of {type(e).__name__}")


def vlets(*roots: Expr) -> str:
    types = {FLOAT: "v8f", INT: "v8i", lang.BOOL: "v8i"}
    return " ".join(f"const {types[v.kind]} {v.name} = {vexpr(v.e)};" for v in lang.lets(*roots))


HELPERS = """\
inline int32_t cl_exponent(float v) {  // the biased exponent field of an fp32
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return static_cast<int32_t>((b >> 23) & 255u);
}
inline float cl_pow2(int32_t e) {  // the fp32 with biased exponent e and mantissa 0
  const uint32_t b = static_cast<uint32_t>(e) << 23;
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}
// The counter-based stream of every compbench kernel: (murmur3_32(i, seed) >> 8) * 2^-24.
inline float cl_uniform(uint32_t seed, int64_t i) {
  return static_cast<float>(murmur3_32(static_cast<uint32_t>(i), seed) >> 8) * 5.9604644775390625e-08f;
}
// NaN-propagating min / max (torch.minimum / maximum); both are NaN-free selects otherwise.
template <typename T> inline T cl_minf(T a, T b) { return (std::isnan(a) || a < b) ? a : b; }
template <typename T> inline T cl_maxf(T a, T b) { return (std::isnan(a) || a > b) ? a : b; }
// 8 lanes at once (GCC vector extensions): lane l is element 8j + l.
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));
typedef uint8_t v8b __attribute__((vector_size(8)));
inline v8f bf(float c) { return v8f{c, c, c, c, c, c, c, c}; }
inline v8i bi(int32_t c) { return v8i{c, c, c, c, c, c, c, c}; }
inline v8f cl_vabs(v8f a) { return (v8f)((v8i)a & bi(0x7FFFFFFF)); }
inline v8f cl_vmin(v8f a, v8f b) { return ((a != a) | (a < b)) ? a : b; }
inline v8f cl_vmax(v8f a, v8f b) { return ((a != a) | (a > b)) ? a : b; }
inline v8u cl_vrotl(v8u x, int r) { return (x << r) | (x >> (32 - r)); }
// cl_uniform of elements i..i+7 (murmur3_32 lane by lane).
inline v8f cl_uniform8(uint32_t seed, int64_t i) {
  const v8u key = v8u{0, 1, 2, 3, 4, 5, 6, 7} + static_cast<uint32_t>(i);
  v8u k = cl_vrotl(key * 0xCC9E2D51u, 15) * 0x1B873593u;
  v8u h = cl_vrotl(k ^ seed, 13) * 5u + 0xE6546B64u;
  h ^= 4u;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return __builtin_convertvector((v8i)(h >> 8), v8f) * bf(5.9604644775390625e-08f);
}
// Bit k of each lane's code as 8 bits (bit l: lane l).
inline unsigned cl_plane(v8i code, int k) {
#if defined(__AVX2__)
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps((__m256i)((code >> k) << 31))));
#else
  unsigned m = 0;
  for (int l = 0; l < 8; ++l) m |= static_cast<unsigned>((code[l] >> k) & 1) << l;
  return m;
#endif
}
// Bit l of m moved to bit B*l.
template <int B> struct Spread {
  uint32_t v[256];
  constexpr Spread() : v() {
    for (int m = 0; m < 256; ++m) {
      uint32_t w = 0;
      for (int l = 0; l < 8; ++l) w |= static_cast<uint32_t>((m >> l) & 1) << (B * l);
      v[m] = w;
    }
  }
};
// The B bytes of 8 codes of B bits (code l at bits B*l), written to out.
template <int B> inline void cl_pack8(v8i code, uint8_t* out) {
  if constexpr (B == 8) {
    const v8b c = __builtin_convertvector(code, v8b);
    std::memcpy(out, &c, 8);
  } else {
    static constexpr Spread<B> spread;
    uint32_t w = 0;
    for (int k = 0; k < B; ++k) w |= spread.v[cl_plane(code, k)] << k;
    std::memcpy(out, &w, B);
  }
}
inline v8f cl_load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
"""


def _acc_type(r: lang.Reduction) -> tuple[str, str]:
    return {"sum": ("double", "0.0"), "count": ("int64_t", "0"),
            "max": ("float", "-std::numeric_limits<float>::infinity()"),
            "min": ("float", "std::numeric_limits<float>::infinity()")}[r.op]


def _vacc(r: lang.Reduction) -> tuple[str, str]:
    return {"sum": ("v8d", "v8d{}"), "count": ("v8i", "v8i{}"),
            "max": ("v8f", "bf(-std::numeric_limits<float>::infinity())"),
            "min": ("v8f", "bf(std::numeric_limits<float>::infinity())")}[r.op]


def _vacc_step(r: lang.Reduction, acc: str) -> str:
    body = vexpr(r.expr)
    if r.op == "sum":
        return f"{acc} += __builtin_convertvector({body}, v8d);"
    if r.op == "count":
        return f"{acc} += ({body}) & bi(1);"
    return f"{acc} = cl_v{r.op}({acc}, {body});"


def _acc_step(r: lang.Reduction, acc: str) -> str:
    body = expr(r.expr)
    if r.op == "sum":
        return f"{acc} += static_cast<double>({body});"
    if r.op == "count":
        return f"{acc} += ({body}) ? 1 : 0;"
    return f"{acc} = cl_{r.op}f({acc}, {body});"


def _combine(r: lang.Reduction, k: int) -> str:
    a = [f"a{k}[{j}]" for j in range(8)]
    if r.op == "count":
        a = [f"int64_t({v})" for v in a]
    if r.op in ("sum", "count"):
        return f"(({a[0]} + {a[4]}) + ({a[1]} + {a[5]})) + (({a[2]} + {a[6]}) + ({a[3]} + {a[7]}))"
    m = f"cl_{r.op}f"
    return (f"{m}({m}({m}({a[0]}, {a[4]}), {m}({a[1]}, {a[5]})), "
            f"{m}({m}({a[2]}, {a[6]}), {m}({a[3]}, {a[7]})))")


def _merge(r: lang.Reduction, total: str, part: str) -> str:
    if r.op in ("sum", "count"):
        return f"{total} += {part};"
    return f"{total} = cl_{r.op}f({total}, {part});"


def source(spec: lang.Spec | lang.Select) -> str:
    """The generated C++ translation unit of `spec` (registers its two operators)."""
    if isinstance(spec, lang.Select):
        return select_source(spec)
    reds = spec.reductions
    per = 8 // spec.bits
    names = {id(r): f"t{k}" for k, r in enumerate(reds)}
    ins = "".join(f"  const float in{k} = in_p[{k}];\n" for k in range(spec.inputs))
    prm = "".join(f"  const double prm_{p} = params.at({j});\n" for j, p in enumerate(spec.params))
    dprm = prm
    enc, dec = spec.encode_name, spec.decode_name
    out = [f"// Generated by compbench.compll from src/compbench/compll/specs/{spec.name}.py: do not edit",
           f"// (`compbench gen {spec.name} --target cpu` prints it). {spec.doc.splitlines()[0]}",
           '#include "common.h"', "", "#include <torch/library.h>", "",
           "#include <algorithm>", "#include <cmath>", "#include <cstring>", "#include <limits>",
           "#include <vector>", "", "namespace compbench_cpu {", f"namespace compll_{spec.name} {{", "",
           HELPERS, f"constexpr int64_t kChunk = {lang.CHUNK};", "",
           "struct Part {"]
    for k, r in enumerate(reds):
        t, init = _acc_type(r)
        out.append(f"  {t} t{k} = {init};  // reduce {r.op}")
    out += ["};", "", f"}}  // namespace compll_{spec.name}", f"using namespace compll_{spec.name};", ""]
    out[out.index(f"namespace compll_{spec.name} {{")] = f"namespace compll_{spec.name} {{"
    # encode
    state_arg = ", at::Tensor& state" if spec.stateful else ""
    out += [f"std::tuple<at::Tensor, at::Tensor> {enc}(const at::Tensor& x, const at::Tensor& inputs, "
            f"int64_t seed, at::ArrayRef<double> params{state_arg}) {{",
            f'  check_flat_f32(x, "{enc}");',
            f'  TORCH_CHECK(x.numel() < (int64_t{{1}} << 32), "{enc}: counts 32-bit indices; '
            'split the tensor");',
            f'  TORCH_CHECK(inputs.numel() == {spec.inputs}, "{enc}: takes {spec.inputs} inputs");',
            f'  TORCH_CHECK(params.size() == {len(spec.params)}, "{enc}: takes {len(spec.params)} params");',
            "  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;",
            f"  const int64_t nbytes = (n + {per - 1}) / {per};",
            "  const float* p = x.data_ptr<float>();",
            *([f'  check_flat_f32(state, "{enc}");',
               f'  TORCH_CHECK(state.numel() == x.numel(), "{enc}: state and x sizes differ");',
               "  float* sp = state.data_ptr<float>();"] if spec.stateful else []),
            "  const at::Tensor in_t = inputs.to(at::kFloat).contiguous();",
            "  const float* in_p = in_t.data_ptr<float>();",
            "  (void)in_p;",
            "  const uint32_t sd = static_cast<uint32_t>(seed);", "  (void)sd;",
            ins + prm.rstrip("\n") if (ins or prm) else "",
            "  at::Tensor packed = at::empty({nbytes}, x.options().dtype(at::kByte));",
            "  uint8_t* o = packed.data_ptr<uint8_t>();",
            f"  at::Tensor header = at::empty({{{len(spec.header)}}}, x.options());",
            "  std::vector<compll_" + spec.name + "::Part> parts(static_cast<size_t>(chunks));"]
    hdecl = "".join(f"  float h{k} = 0.f;\n" for k in range(len(spec.header))).rstrip("\n")
    if hdecl:
        out.append(hdecl)
    if spec.header:
        out.append("  float* hp = header.data_ptr<float>();")

    def reduce_chunk(indent: str) -> list[str]:
        lines = []
        for k, r in enumerate(reds):
            t, init = _vacc(r)
            lines.append(f"{indent}{t} a{k} = {init};")
        return lines

    def lanes(indent: str, lo: str, hi: str) -> list[str]:
        accs = (_vacc_step(r, f"a{k}") for k, r in enumerate(reds))
        steps = " ".join([vlets(*(r.expr for r in reds)), *accs])
        return [f"{indent}for (int64_t b = {lo}; b + 8 <= {hi}; b += 8) {{",
                f"{indent}  const v8f xv = cl_load8(p + b); {steps}",
                f"{indent}}}"]

    def finish_chunk(indent: str) -> list[str]:
        lines = [f"{indent}compll_{spec.name}::Part& part = parts[static_cast<size_t>(c)];"]
        for k, r in enumerate(reds):
            lines.append(f"{indent}part.t{k} = {_combine(r, k)};")
        lines.append(f"{indent}for (int64_t i = lo + (hi - lo) / 8 * 8; i < hi; ++i) {{")
        lines.append(f"{indent}  const float xv = p[i]; {lets(*(r.expr for r in reds))}")
        for k, r in enumerate(reds):
            lines.append(f"{indent}  {_acc_step(r, f'part.t{k}')}")
        lines.append(f"{indent}}}")
        return lines

    def codes(indent: str, lo: str, hi: str, fused: bool = False) -> list[str]:
        """One loop over [lo, hi): 8 elements at a time (one load; with `fused`, the reductions'
        lanes too), their codes packed straight into the output; the tensor's last n mod 8
        elements one by one."""
        mask = (1 << spec.bits) - 1
        upd = [spec.update] if spec.update is not None else []
        roots = [*(r.expr for r in reds), spec.code, *upd] if fused else [spec.code, *upd]
        sv = "const v8f sv = cl_load8(sp + i); " if spec.stateful else ""
        store = ([f"{indent}  const v8f su = {vexpr(spec.update)};",
                  f"{indent}  std::memcpy(sp + i, &su, sizeof(su));"] if spec.update is not None else [])
        tail_state = "const float stv = sp[i]; " if spec.stateful else ""
        tail_store = [f"{indent}  sp[i] = {expr(spec.update)};"] if spec.update is not None else []
        accs = [_vacc_step(r, f"a{k}") for k, r in enumerate(reds)] if fused else []
        uv = "const v8f uv = cl_uniform8(sd, i); " if spec.seeded else ""
        return [f"{indent}int64_t i = {lo};",
                f"{indent}for (; i + 8 <= {hi}; i += 8) {{",
                f"{indent}  const v8f xv = cl_load8(p + i); {sv}{uv}{vlets(*roots)}",
                *(f"{indent}  {step}" for step in accs),
                f"{indent}  cl_pack8<{spec.bits}>(({vexpr(spec.code)}) & bi({mask}), o + i / {per});",
                *store,
                f"{indent}}}",
                f"{indent}for (; i < {hi}; ++i) {{  // the last n mod 8 elements",
                f"{indent}  const float xv = p[i]; (void)xv; {tail_state}{lets(spec.code, *upd)}",
                f"{indent}  if (i % {per} == 0) o[i / {per}] = 0;",
                f"{indent}  o[i / {per}] |= static_cast<uint8_t>((({expr(spec.code)}) & {mask}) << "
                f"({spec.bits} * (i % {per})));",
                *tail_store,
                f"{indent}}}"]

    chunk_head = ["  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {",
                  "    for (int64_t c = c0; c < c1; ++c) {",
                  "      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);"]
    chunk_tail = ["    }", "  });"]
    header_lines = []
    if reds:
        header_lines.append("  compll_" + spec.name + "::Part total;")
        for k, r in enumerate(reds):
            header_lines.append(f"  for (const auto& q : parts) {{ {_merge(r, f'total.t{k}', f'q.t{k}')} }}")
            header_lines.append(f"  const auto t{k} = total.t{k}; (void)t{k};")
    if lang.lets(*spec.header):
        header_lines.append(f"  {lets(*spec.header, scalar=True, names=names)}")
    for k, h in enumerate(spec.header):
        header_lines.append(f"  h{k} = static_cast<float>({expr(h, scalar=True, names=names)});")
        header_lines.append(f"  hp[{k}] = h{k};")
    if spec.fused:
        out += chunk_head
        if reds:
            out += reduce_chunk("      ")
            out += codes("      ", "lo", "hi", fused=True)
            out += finish_chunk("      ")
        else:
            out += codes("      ", "lo", "hi")
        out += chunk_tail
        out += header_lines
    else:
        out += [*chunk_head, *reduce_chunk("      "), *lanes("      ", "lo", "hi"), *finish_chunk("      "),
                *chunk_tail]
        out += header_lines
        out += chunk_head + codes("      ", "lo", "hi") + chunk_tail
    out += ["  return {packed, header};", "}", ""]
    # decode
    out += [f"at::Tensor {dec}(const at::Tensor& packed, const at::Tensor& header, int64_t numel, "
            "at::ArrayRef<double> params, at::Tensor& out) {",
            '  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kByte && '
            'packed.is_contiguous(), '
            f'"{dec}: packed must be contiguous CPU uint8");',
            f'  TORCH_CHECK(packed.numel() * {per} >= numel, "{dec}: too few packed bytes");',
            f'  TORCH_CHECK(header.numel() == {len(spec.header)}, '
            f'"{dec}: the header has {len(spec.header)} values");',
            f'  TORCH_CHECK(params.size() == {len(spec.params)}, "{dec}: takes {len(spec.params)} params");',
            f'  check_flat_f32(out, "{dec}");',
            f'  TORCH_CHECK(out.numel() >= numel, "{dec}: out is too small");',
            "  const at::Tensor hd = header.to(at::kFloat).contiguous();",
            "  const float* hv = hd.data_ptr<float>();",
            "  (void)hv;"]
    out += [f"  const float h{k} = hv[{k}];" for k in range(len(spec.header))]
    if dprm:
        out.append(dprm.rstrip("\n"))
    out += [f"  float table[{1 << spec.bits}];",
            f"  for (int32_t code = 0; code < {1 << spec.bits}; ++code) {{",
            f"    {lets(spec.value)}" if lang.lets(spec.value) else "",
            f"    table[code] = {expr(spec.value)};",
            "  }",
            "  const uint8_t* in = packed.data_ptr<uint8_t>();",
            "  float* o = out.data_ptr<float>();"]
    if spec.bits == 8:
        out += ["  at::parallel_for(0, numel, 65536, [&](int64_t i0, int64_t i1) {",
                "    for (int64_t i = i0; i < i1; ++i) o[i] = table[in[i]];", "  });"]
    else:
        mask = (1 << spec.bits) - 1
        out += [f"  // One row of {per} values per packed byte (a 256-row table, in L1).",
                f"  std::vector<float> rows(256 * {per});",
                f"  for (int b = 0; b < 256; ++b) for (int j = 0; j < {per}; ++j) "
                f"rows[b * {per} + j] = table[(b >> ({spec.bits} * j)) & {mask}];",
                "  const float* r = rows.data();",
                f"  const int64_t whole = numel / {per};",
                "  at::parallel_for(0, whole, 16384, [&](int64_t b0, int64_t b1) {",
                f"    for (int64_t b = b0; b < b1; ++b) std::memcpy(o + b * {per}, r + in[b] * {per}, "
                f"sizeof(float) * {per});",
                "  });",
                f"  for (int64_t k = whole * {per}; k < numel; ++k) "
                f"o[k] = r[in[whole] * {per} + (k - whole * {per})];"]
    out += ["  return out;", "}", "",
            "TORCH_LIBRARY_FRAGMENT(compbench_cpu, m) {",
            f'  m.def("{enc}(Tensor x, Tensor inputs, int seed, float[] params'
            f'{", Tensor(a!) state" if spec.stateful else ""}) -> (Tensor, Tensor)", &{enc});',
            f'  m.def("{dec}(Tensor packed, Tensor header, int numel, float[] params, Tensor(a!) out) '
            '-> Tensor(a!)", '
            f"&{dec});",
            "}", "", "}  // namespace compbench_cpu", ""]
    return "\n".join(out)


def select_source(sel: lang.Select) -> str:
    """The generated C++ translation unit of a selection: NAME_threshold (the j-th largest key of a
    sample in numpy's order, NaN largest: the j largest of each fixed chunk of samples kept in a
    heap, when j is at most 1/8 of the samples, else one nth_element over all) and NAME_filter
    (compaction: each fixed chunk of `lang.CHUNK` elements appends its passing indices to its own
    list, 8 conditions per movemask, then the lists are joined in chunk order: index order at any
    number of threads)."""
    thr, flt = sel.threshold_name, sel.filter_name
    prm = "".join(f"  const double prm_{p} = params.at({j});\n" for j, p in enumerate(sel.params))
    nprm = len(sel.params)
    return "\n".join([
        f"// Generated by compbench.compll from src/compbench/compll/specs/{sel.name}.py: do not edit",
        f"// (`compbench gen {sel.name} --target cpu` prints it). {sel.doc.splitlines()[0]}",
        '#include "common.h"', "", "#include <torch/library.h>", "",
        "#include <algorithm>", "#include <cmath>", "#include <cstring>", "#include <limits>",
        "#include <queue>", "#include <vector>", "",
        "namespace compbench_cpu {", f"namespace compll_{sel.name} {{", "",
        HELPERS, f"constexpr int64_t kChunk = {lang.CHUNK};", "",
        "// numpy's order for np.partition: NaN above every number.",
        "inline bool cl_below(float a, float b) { return a < b || (!std::isnan(a) && std::isnan(b)); }",
        "struct cl_above {  // a std::priority_queue with it keeps its smallest (numpy's order) on top",
        "  bool operator()(float a, float b) const { return cl_below(b, a); }",
        "};",
        "constexpr int64_t kSampleChunk = 65536, kAhead = 32;  // samples per chunk; gathers in flight", "",
        f"}}  // namespace compll_{sel.name}", f"using namespace compll_{sel.name};", "",
        f"at::Tensor {thr}(const at::Tensor& x, const c10::optional<at::Tensor>& sample, int64_t start, "
        "int64_t stride, int64_t count, int64_t j, at::ArrayRef<double> params) {",
        f'  check_flat_f32(x, "{thr}");',
        f'  TORCH_CHECK(params.size() == {nprm}, "{thr}: takes {nprm} params");',
        "  const bool drawn = sample.has_value() && sample->defined();",
        "  at::Tensor s = drawn ? sample->to(at::kLong).contiguous() : at::Tensor();",
        "  const int64_t m = drawn ? s.numel() : count, n = x.numel();",
        f'  TORCH_CHECK(0 < j && j <= m, "{thr}: needs 0 < j <= samples, got j=", j, ", samples=", m);',
        f'  TORCH_CHECK(drawn || (start >= 0 && stride > 0 && start + (m - 1) * stride < n), '
        f'"{thr}: the strided sample leaves x");',
        "  const float* p = x.data_ptr<float>();",
        "  const int64_t* sp = drawn ? s.data_ptr<int64_t>() : nullptr;",
        prm.rstrip("\n"),
        "  auto key_at = [&](int64_t t) {",
        "    const int64_t e = drawn ? sp[t] : start + t * stride;",
        f'    TORCH_CHECK(0 <= e && e < n, "{thr}: sample index ", e, " outside x");',
        f"    const float xv = p[e]; {lets(sel.key)}",
        f"    return {expr(sel.key)};",
        "  };",
        "  if (j * 8 > m) {  // a large share of the samples: one nth_element over all of them",
        "    std::vector<float> keys(static_cast<size_t>(m));",
        "    at::parallel_for(0, m, kSampleChunk, [&](int64_t t0, int64_t t1) {",
        "      for (int64_t t = t0; t < t1; ++t) keys[static_cast<size_t>(t)] = key_at(t);",
        "    });",
        "    std::nth_element(keys.begin(), keys.begin() + (m - j), keys.end(), cl_below);",
        "    return at::full({1}, keys[static_cast<size_t>(m - j)], x.options());",
        "  }",
        "  // A few of many: each fixed chunk of samples keeps its j largest in a heap (most samples",
        "  // are compared once with its smallest and rejected), and the j-th largest of the chunks'",
        "  // union is the j-th largest of all samples, at any number of threads.",
        "  const int64_t chunks = (m + kSampleChunk - 1) / kSampleChunk;",
        "  std::vector<std::vector<float>> tops(static_cast<size_t>(chunks));",
        "  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {",
        "    for (int64_t c = c0; c < c1; ++c) {",
        "      std::priority_queue<float, std::vector<float>, cl_above> heap;",
        "      const int64_t begin = c * kSampleChunk, end = std::min(m, begin + kSampleChunk);",
        "      for (int64_t t = begin; t < end; ++t) {",
        "        if (drawn && t + kAhead < end) __builtin_prefetch(p + sp[t + kAhead]);  // random gathers",
        "        const float v = key_at(t);",
        "        if (static_cast<int64_t>(heap.size()) < j) {",
        "          heap.push(v);",
        "        } else if (cl_below(heap.top(), v)) {",
        "          heap.pop();",
        "          heap.push(v);",
        "        }",
        "      }",
        "      auto& out = tops[static_cast<size_t>(c)];",
        "      for (; !heap.empty(); heap.pop()) out.push_back(heap.top());",
        "    }",
        "  });",
        "  std::vector<float> all;",
        "  for (const auto& t : tops) all.insert(all.end(), t.begin(), t.end());",
        "  std::nth_element(all.begin(), all.begin() + (j - 1), all.end(), cl_above());",
        "  return at::full({1}, all[static_cast<size_t>(j - 1)], x.options());",
        "}", "",
        f"at::Tensor {flt}(const at::Tensor& x, const at::Tensor& inputs, at::ArrayRef<double> params) {{",
        f'  check_flat_f32(x, "{flt}");',
        f'  TORCH_CHECK(inputs.numel() == 1, "{flt}: takes 1 input, the threshold");',
        f'  TORCH_CHECK(params.size() == {nprm}, "{flt}: takes {nprm} params");',
        "  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;",
        "  const float* p = x.data_ptr<float>();",
        "  const float in0 = inputs.to(at::kFloat).item<float>();",
        prm.rstrip("\n"),
        "  std::vector<std::vector<int64_t>> found(static_cast<size_t>(chunks));",
        "  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {",
        "    for (int64_t c = c0; c < c1; ++c) {",
        "      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);",
        "      std::vector<int64_t>& f = found[static_cast<size_t>(c)];",
        "      int64_t i = lo;",
        "      for (; i + 8 <= hi; i += 8) {",
        f"        const v8f xv = cl_load8(p + i); {vlets(sel.keep)}",
        f"        for (unsigned m = cl_plane(({vexpr(sel.keep)}) & bi(1), 0); m; m &= m - 1) "
        "f.push_back(i + __builtin_ctz(m));",
        "      }",
        "      for (; i < hi; ++i) {  // the last n mod 8 elements",
        f"        const float xv = p[i]; {lets(sel.keep)}",
        f"        if ({expr(sel.keep)}) f.push_back(i);",
        "      }",
        "    }",
        "  });",
        "  int64_t total = 0;",
        "  for (const auto& f : found) total += static_cast<int64_t>(f.size());",
        "  at::Tensor out = at::empty({total}, x.options().dtype(at::kLong));",
        "  int64_t* o = out.data_ptr<int64_t>();",
        "  for (const auto& f : found) {",
        "    std::copy(f.begin(), f.end(), o);",
        "    o += f.size();",
        "  }",
        "  return out;",
        "}", "",
        "// The scatter: out zero-filled (in parallel), then out[indices[t]] += values[t] in payload order",
        "// (index_add_'s order: duplicates add the same way at any number of threads).",
        f"at::Tensor {sel.decode_name}(const at::Tensor& values, const at::Tensor& indices, "
        "at::Tensor& out) {",
        f'  check_flat_f32(out, "{sel.decode_name}");',
        f'  check_flat_f32(values, "{sel.decode_name}");',
        f'  TORCH_CHECK(indices.device().is_cpu() && indices.is_contiguous() && indices.dim() == 1 && '
        f'(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong) && '
        f'indices.numel() == values.numel(), "{sel.decode_name}: indices must be contiguous CPU int32 or '
        f'int64, one per value");',
        "  const int64_t n = out.numel(), k = values.numel();",
        "  float* o = out.data_ptr<float>();",
        "  const float* v = values.data_ptr<float>();",
        "  at::parallel_for(0, n, 1 << 16, [&](int64_t a, int64_t b) {",
        "    std::memset(o + a, 0, sizeof(float) * static_cast<size_t>(b - a));",
        "  });",
        "  auto add = [&](const auto* idx) {",
        "    for (int64_t t = 0; t < k; ++t) {",
        "      const int64_t i = static_cast<int64_t>(idx[t]);",
        f'      TORCH_CHECK(0 <= i && i < n, "{sel.decode_name}: index ", i, " outside the output of ", n);',
        "      o[i] += v[t];",
        "    }",
        "  };",
        "  if (indices.scalar_type() == at::kInt) {",
        "    add(indices.data_ptr<int32_t>());",
        "  } else {",
        "    add(indices.data_ptr<int64_t>());",
        "  }",
        "  return out;",
        "}", "",
        "TORCH_LIBRARY_FRAGMENT(compbench_cpu, m) {",
        f'  m.def("{thr}(Tensor x, Tensor? sample, int start, int stride, int count, int j, float[] params) '
        f'-> Tensor", &{thr});',
        f'  m.def("{flt}(Tensor x, Tensor inputs, float[] params) -> Tensor", &{flt});',
        f'  m.def("{sel.decode_name}(Tensor values, Tensor indices, Tensor(a!) out) -> Tensor(a!)", '
        f'&{sel.decode_name});',
        "}", "", "}  // namespace compbench_cpu", ""])
