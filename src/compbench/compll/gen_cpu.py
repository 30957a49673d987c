"""The C++ generator: a spec as two operators of the CPU extension (`torch.ops.compbench_cpu.*`).

encode(x, inputs, seed, params) -> (packed codes, fp32 header): ATen's parallel_for over chunks of
`lang.CHUNK` elements, 8 elements at a time in SIMD registers (GCC's vector extensions: the
`printer.VECTOR` target; the tensor's last n mod 8 elements one by one: `printer.CPP`). Each chunk
keeps its reductions in 8 lanes (lane l takes the elements i = l mod 8; lanes combined as
((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)), then the tensor's last n mod 8 elements, then the chunks in
order): the same result at any number of threads. The codes of 8 elements are packed straight into
the output (`cl_pack8`: one bit plane per movemask). When the codes read no header (onebit's bits),
reductions and codes share one read of x; otherwise a first pass reduces and a second encodes.

decode(packed, header, numel, params, out) -> out: the 2^bits values computed once from the header
(the spec's `value`), then out[i] = table[code i].

Element arithmetic is fp32, one rounding per operation (the extension is built with
-ffp-contract=off); header arithmetic is fp64, rounded to fp32 once. The fixed code is in
templates/cpu_*.tmpl; this module fills it.
"""

from __future__ import annotations

from compbench.compll import catalog, lang, lower, skeleton
from compbench.compll.lower import Lowered, Red, Value
from compbench.compll.printer import CPP, CPP_HEADER, VECTOR, Target, declare, text

# Per reduction op: (accumulator type, initial value) in one lane, on 8 lanes, and how a value joins.
_INF = "std::numeric_limits<float>::infinity()"
ACCUMULATORS = {
    "sum": ("double", "0.0", "v8d", "v8d{}"),
    "count": ("int64_t", "0", "v8i", "v8i{}"),
    "max": ("float", f"-{_INF}", "v8f", f"bf(-{_INF})"),
    "min": ("float", _INF, "v8f", f"bf({_INF})"),
}
_STEP = {"sum": "{acc} += static_cast<double>({e});", "count": "{acc} += ({e}) ? 1 : 0;"}
_VSTEP = {"sum": "{acc} += __builtin_convertvector({e}, v8d);", "count": "{acc} += ({e}) & bi(1);"}


def _step(r: Red, acc: str, vector: bool) -> str:
    """One element (or 8 lanes) of reduction r joining accumulator `acc`."""
    table, t = (_VSTEP, VECTOR) if vector else (_STEP, CPP)
    fallback = "{acc} = cl_v{op}({acc}, {e});" if vector else "{acc} = cl_{op}f({acc}, {e});"
    return table.get(r.op, fallback).format(acc=acc, e=text(r.value.node, t), op=r.op)


def _combine(r: Red) -> str:
    """The 8 lanes of accumulator a{k} in the fixed order ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7))."""
    a = [f"a{r.index}[{j}]" for j in range(8)]
    if r.op == "count":
        a = [f"int64_t({v})" for v in a]
    if r.op in ("sum", "count"):
        return f"(({a[0]} + {a[4]}) + ({a[1]} + {a[5]})) + (({a[2]} + {a[6]}) + ({a[3]} + {a[7]}))"
    m = f"cl_{r.op}f"
    return (f"{m}({m}({m}({a[0]}, {a[4]}), {m}({a[1]}, {a[5]})), "
            f"{m}({m}({a[2]}, {a[6]}), {m}({a[3]}, {a[7]})))")


def _merge(r: Red) -> str:
    total, part = f"total.t{r.index}", f"q.t{r.index}"
    if r.op in ("sum", "count"):
        return f"{total} += {part};"
    return f"{total} = cl_{r.op}f({total}, {part});"


def _decls(t: Target, *values: Value) -> str:
    """The declarations of the values' temporaries, on one line."""
    return " ".join(declare(lower.temps(*values), t))


def _scalars(spec: lang.Spec | lang.Select, inputs: int = 0) -> list[str]:
    """The inputs and settings as C++ scalars, then an empty line when no setting is read."""
    params = [f"const double prm_{p} = params.at({j});" for j, p in enumerate(spec.params)]
    return [*(f"const float in{k} = in_p[{k}];" for k in range(inputs)), *(params or [""])]


def _reduce_chunk(low: Lowered, lanes: bool) -> list[str]:
    """A chunk's lane accumulators and, with `lanes`, the loop over its whole groups of 8 that fills
    them (without: the codes' loop fills them, one read for both)."""
    reds = low.reductions
    out = [f"{ACCUMULATORS[r.op][2]} a{r.index} = {ACCUMULATORS[r.op][3]};" for r in reds]
    if lanes:
        steps = [_decls(VECTOR, *(r.value for r in reds)), *(_step(r, f"a{r.index}", True) for r in reds)]
        out += skeleton.fill("cpu_lanes.cpp", steps=" ".join(steps))
    return out


def _finish_chunk(low: Lowered, name: str) -> list[str]:
    reds = low.reductions
    return skeleton.fill("cpu_finish.cpp", name=name,
                         combine=[f"part.t{r.index} = {_combine(r)};" for r in reds],
                         temps=_decls(CPP, *(r.value for r in reds)),
                         steps=[_step(r, f"part.t{r.index}", False) for r in reds])


def _codes(spec: lang.Spec, low: Lowered, fused: bool) -> list[str]:
    """One loop over the chunk: 8 elements at a time (one load; `fused`: the reductions' lanes too),
    their codes packed straight into the output; the tensor's last n mod 8 elements one by one."""
    upd = [low.update] if low.update is not None else []
    reds = low.reductions if fused else ()
    return skeleton.fill(
        "cpu_codes.cpp", bits=spec.bits, per=8 // spec.bits, mask=(1 << spec.bits) - 1,
        loads=("const v8f sv = cl_load8(sp + i); " if spec.stateful else "")
        + ("const v8f uv = cl_uniform8(sd, i); " if spec.seeded else ""),
        temps=_decls(VECTOR, *(r.value for r in reds), low.code, *upd),
        steps=[_step(r, f"a{r.index}", True) for r in reds], code=text(low.code.node, VECTOR),
        store=[f"const v8f su = {text(u.node, VECTOR)};", "std::memcpy(sp + i, &su, sizeof(su));"
               ] if (u := low.update) else [],
        tail_load="const float stv = sp[i]; " if spec.stateful else "",
        tail_temps=_decls(CPP, low.code, *upd), tail_code=text(low.code.node, CPP),
        tail_store=[f"sp[i] = {text(u.node, CPP)};"] if (u := low.update) else [])


def _header(spec: lang.Spec, low: Lowered) -> list[str]:
    """The chunks' parts merged in order, then the header from the reductions (fp64)."""
    out = [f"compll_{spec.name}::Part total;"] if low.reductions else []
    for r in low.reductions:
        out += [f"for (const auto& q : parts) {{ {_merge(r)} }}",
                f"const auto t{r.index} = total.t{r.index}; (void)t{r.index};"]
    out += [_decls(CPP_HEADER, *low.header)] if lower.temps(*low.header) else []
    for k, h in enumerate(low.header):
        out += [f"h{k} = static_cast<float>({text(h.node, CPP_HEADER)});", f"hp[{k}] = h{k};"]
    return out


def _passes(spec: lang.Spec, low: Lowered) -> list[str]:
    """The encode's passes over the chunks: one when the codes read no header, else two."""
    def chunks(*body: list[str]) -> list[str]:
        return skeleton.fill("cpu_chunks.cpp", body=[line for part in body for line in part])

    reduce_ = _reduce_chunk(low, lanes=not spec.fused)
    finish = _finish_chunk(low, spec.name)
    if not spec.fused:
        return [*chunks(reduce_, finish), *_header(spec, low), *chunks(_codes(spec, low, False))]
    if low.reductions:
        return [*chunks(reduce_, _codes(spec, low, True), finish), *_header(spec, low)]
    return [*chunks(_codes(spec, low, False)), *_header(spec, low)]


def _decode(spec: lang.Spec) -> list[str]:
    if spec.bits == 8:
        return skeleton.fill("cpu_decode_bytes.cpp")
    return skeleton.fill("cpu_decode_rows.cpp", per=8 // spec.bits, bits=spec.bits,
                         mask=(1 << spec.bits) - 1)


def source(spec: lang.Spec | lang.Select) -> str:
    """The generated C++ translation unit of `spec` (registers its two operators)."""
    if isinstance(spec, lang.Select):
        return select_source(spec)
    low = lower.lower(spec)
    enc, nh = spec.encode_name, len(spec.header)
    return skeleton.render(
        "cpu_spec.cpp", origin=catalog.origin(spec.name), name=spec.name, doc=spec.doc.splitlines()[0],
        helpers=skeleton.lines("cpu_helpers.h"), chunk=lang.CHUNK, enc=enc, dec=spec.decode_name,
        part=[f"{ACCUMULATORS[r.op][0]} t{r.index} = {ACCUMULATORS[r.op][1]};  // reduce {r.op}"
              for r in low.reductions],
        state_arg=", at::Tensor& state" if spec.stateful else "",
        state_schema=", Tensor(a!) state" if spec.stateful else "",
        state=skeleton.fill("cpu_state.cpp", enc=enc) if spec.stateful else [],
        inputs=spec.inputs, nparams=len(spec.params), per=8 // spec.bits, per_less=8 // spec.bits - 1,
        scalars=_scalars(spec, spec.inputs), nheader=nh,
        header_out=[*(f"float h{k} = 0.f;" for k in range(nh)),
                    *(["float* hp = header.data_ptr<float>();"] if nh else [])],
        passes=_passes(spec, low), header_in=[f"const float h{k} = hv[{k}];" for k in range(nh)],
        params=[ln for ln in _scalars(spec) if ln], ncodes=1 << spec.bits,
        value_temps=[_decls(CPP, low.value)], value=text(low.value.node, CPP), decode=_decode(spec))


def select_source(sel: lang.Select) -> str:
    """The generated C++ translation unit of a selection: NAME_threshold (the j-th largest key of a
    sample in numpy's order, NaN largest: the j largest of each fixed chunk of samples kept in a
    heap, when j is at most 1/8 of the samples, else one nth_element over all) and NAME_filter
    (compaction: each fixed chunk of `lang.CHUNK` elements appends its passing indices to its own
    list, 8 conditions per movemask, then the lists are joined in chunk order: index order at any
    number of threads), and NAME_decode (the scatter); the fixed code is templates/cpu_select.cpp."""
    low = lower.lower_select(sel)
    return skeleton.render(
        "cpu_select.cpp", origin=catalog.origin(sel.name), name=sel.name, doc=sel.doc.splitlines()[0],
        helpers=skeleton.lines("cpu_helpers.h"), chunk=lang.CHUNK, thr=sel.threshold_name,
        flt=sel.filter_name, dec=sel.decode_name, nparams=len(sel.params), params=_scalars(sel),
        key_temps=_decls(CPP, low.key), key=text(low.key.node, CPP),
        keep_vtemps=_decls(VECTOR, low.keep), keep_v=text(low.keep.node, VECTOR),
        keep_temps=_decls(CPP, low.keep), keep=text(low.keep.node, CPP))
