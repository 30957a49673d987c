"""The one expression printer of CompLL: a lowered node (`lower`) as the text of a target.

A `Target` is data: a format per node (`forms`, keyed "OP.KIND", then "OP", then "binary"; KIND is
the operand's for a unary op, the result's otherwise), the type of a temporary per kind and the
form of its declaration. C++ element code (fp32 / int32), C++ header code (fp64 / int64), C++ on 8
lanes (GCC vector extensions), CUDA (fp32 sums and products spelled __fadd_rn / __fsub_rn /
__fmul_rn, which nvcc cannot contract into FMAs) and torch (whole-tensor operations, element or
0-dim fp64) differ only in these tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from compbench.compll.lang import BOOL, FLOAT, INT
from compbench.compll.lower import Node, Temp

_UNARY = {"neg", "abs", "to_int", "to_float", "exponent", "pow2", "isnan"}


@dataclass(frozen=True)
class Target:
    name: str
    forms: Mapping[str, str]
    types: Mapping[str, str]
    decl: str = "const {type} {name} = {expr};"


def text(n: Node, t: Target) -> str:
    """The expression `n` in target `t`."""
    args = [text(a, t) for a in n.args]
    fields = dict(zip("abc", args if n.op != "where" else [args[1], args[2], args[0]], strict=False))
    kind = n.args[0].kind if n.op in _UNARY else n.kind
    form = t.forms.get(f"{n.op}.{kind}") or t.forms.get(n.op) or t.forms["binary"]
    return form.format(op=n.op, v=n.value, **fields)


def declare(temps: Iterable[Temp], t: Target) -> list[str]:
    """One declaration per temporary, in order."""
    return [t.decl.format(type=t.types[v.kind], name=v.name, expr=text(v.node, t)) for v in temps]


_NAMES = {"temp": "{v}", "code": "code", "neg": "(-{a})", "binary": "({a} {op} {b})"}


def _cpp(f: str, i: str, scalar: bool) -> Target:
    """C++ one element at a time (f, i: float, int32_t) or header code (double, int64_t)."""
    return Target(f"cpp-{f}", {
        **_NAMES, "x": "xv", "uniform": "cl_uniform(sd, i)", "state": "stv", "numel": "n",
        "header": "h{v}", "input": f"{f}(in{{v}})", "param": f"{f}(prm_{{v}})", "red": "t{v}",
        "const.int": f"{i}({{v}})", "const.float": f"{f}({{v}})" if scalar else "{v}f",
        "abs.float": "std::fabs({a})", "abs": "std::abs({a})", "isnan": "std::isnan({a})",
        "to_int": f"{i}({{a}})", "to_float": f"{f}({{a}})", "exponent": "cl_exponent({a})",
        "pow2": "cl_pow2({a})", "where": "({c} ? {a} : {b})",
        "min.float": f"cl_minf<{f}>({{a}}, {{b}})", "max.float": f"cl_maxf<{f}>({{a}}, {{b}})",
        "min.int": f"std::min<{i}>({{a}}, {{b}})", "max.int": f"std::max<{i}>({{a}}, {{b}})",
    }, {FLOAT: f, INT: i, BOOL: "bool"})


CPP = _cpp("float", "int32_t", scalar=False)
CPP_HEADER = _cpp("double", "int64_t", scalar=True)

VECTOR = Target("cpp-v8", {
    **_NAMES, "x": "xv", "uniform": "uv", "state": "sv", "header": "bf(h{v})", "input": "bf(in{v})",
    "param": "bf(float(prm_{v}))", "const.int": "bi({v})", "const.float": "bf({v}f)",
    "to_float.float": "{a}", "to_float.int": "__builtin_convertvector({a}, v8f)",
    "to_float.bool": "__builtin_convertvector(({a} & bi(1)), v8f)",
    "to_int.float": "__builtin_convertvector({a}, v8i)", "to_int.int": "{a}", "to_int.bool": "({a} & bi(1))",
    "abs.float": "cl_vabs({a})", "abs": "(({a} < bi(0)) ? -{a} : {a})", "isnan": "({a} != {a})",
    "exponent": "(((v8i)({a}) >> 23) & bi(255))", "pow2": "(v8f)(({a}) << 23)",
    "where": "({c} ? {a} : {b})", "min.float": "cl_vmin({a}, {b})", "max.float": "cl_vmax({a}, {b})",
    "min.int": "(({a} < {b}) ? {a} : {b})", "max.int": "(({a} > {b}) ? {a} : {b})",
}, {FLOAT: "v8f", INT: "v8i", BOOL: "v8i"})

CUDA = Target("cuda", {
    **_NAMES, "x": "xv", "uniform": "cb_uniform(seed, i)", "state": "stv", "header": "h[{v}]",
    "input": "h[{v}]", "param": "{v}", "const.int": "(int)({v})", "const.float": "{v}f",
    "+.float": "__fadd_rn({a}, {b})", "-.float": "__fsub_rn({a}, {b})", "*.float": "__fmul_rn({a}, {b})",
    "abs.float": "fabsf({a})", "abs": "abs({a})", "isnan": "({a} != {a})", "to_int": "(int)({a})",
    "to_float": "(float)({a})", "exponent": "cl_exponent({a})", "pow2": "cl_pow2({a})",
    "where": "({c} ? {a} : {b})", "min.float": "cl_minf({a}, {b})", "max.float": "cl_maxf({a}, {b})",
    "min.int": "(({a}) < ({b}) ? ({a}) : ({b}))", "max.int": "(({a}) > ({b}) ? ({a}) : ({b}))",
}, {FLOAT: "float", INT: "int", BOOL: "bool"})


def _torch(f: str, i: str) -> Target:
    """Whole-tensor torch code: elements (torch.float32, torch.int32) or 0-dim header scalars
    (torch.float64, torch.int64)."""
    return Target(f"torch-{f}", {
        **_NAMES, "x": "x", "uniform": "u", "state": "state", "numel": "_t(n, torch.int64)",
        "header": "h[{v}]", "input": f"inputs[{{v}}].to({f})", "param": f"_t(params['{{v}}'], {f})",
        "red": "r{v}", "const.int": f"_t({{v}}, {i})", "const.float": f"_t({{v}}, {f})",
        "abs": "({a}).abs()", "isnan": "({a}).isnan()", "to_int": f"({{a}}).to({i})",
        "to_float": f"({{a}}).to({f})", "exponent": "((({a}).view(torch.int32) >> 23) & 255)",
        "pow2": "(({a}).to(torch.int32) << 23).view(torch.float32)",
        "where": "torch.where({c}, {a}, {b})", "min": "torch.minimum({a}, {b})",
        "max": "torch.maximum({a}, {b})",
    }, {FLOAT: f, INT: i, BOOL: "bool"}, decl="{name} = {expr}")


TORCH = _torch("torch.float32", "torch.int32")
TORCH_HEADER = _torch("torch.float64", "torch.int64")
