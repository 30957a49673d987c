"""CompLL's lowering pass: a spec's expressions (`lang`) as the small typed form every printer reads.

A lowered `Node` has its kind resolved and its conversions spelled out: where the language converts
implicitly (an int or a condition in fp32 arithmetic, `where` or `minimum`), the node holds an
explicit `to_float`, so a printer never decides a type. Named values (`let`) become `Temp`s, typed
temporaries declared once, every one after those it reads; a reduction becomes a reference to its
position in `Spec.reductions` (`red` node, value "0", "1", ...): the same name in every target, read
off the spec's order, so no printer renames anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compbench.compll import lang
from compbench.compll.lang import FLOAT, INT

# Leaf node ops: a constant ("const"), the element and its draws, indexed scalars, named values.
LEAVES = {lang.X: "x", lang.Uniform: "uniform", lang.State: "state", lang.Code: "code",
          lang.Numel: "numel"}
_CONVERTED = {"+", "-", "*", "/"}  # fp32 arithmetic converts an int operand (comparisons do not)


@dataclass(frozen=True)
class Node:
    """One lowered operation: `op` is a leaf ("const", "x", "uniform", "state", "code", "numel",
    "header", "input", "param", "temp", "red"), an operator of `lang.Bin`, an op of `lang.Un`,
    "where", "min" or "max"; `value` is a leaf's payload as text (a constant as the printers
    write it, an index, a setting's or a temporary's name)."""

    op: str
    kind: str
    args: tuple[Node, ...] = ()
    value: str = ""


@dataclass(frozen=True)
class Temp:
    """A named value: `const KIND name = node;` in the C-like targets, `name = node` in torch."""

    name: str
    kind: str
    node: Node


@dataclass(frozen=True)
class Value:
    """A lowered root expression and the temporaries it reads, in declaration order."""

    node: Node
    temps: tuple[Temp, ...]


@dataclass(frozen=True)
class Red:
    """Reduction `index` of a spec (`op` over the element expression `value`)."""

    index: int
    op: str
    value: Value


@dataclass(frozen=True)
class Lowered:
    """A `lang.Spec` lowered: its reductions in order, header, codes, state update and decode."""

    reductions: tuple[Red, ...]
    header: tuple[Value, ...]
    code: Value
    update: Value | None
    value: Value


@dataclass(frozen=True)
class LoweredSelect:
    """A `lang.Select` lowered: the key it ranks by and the filter's condition."""

    key: Value
    keep: Value


def temps(*values: Value) -> tuple[Temp, ...]:
    """The temporaries of several roots, each once, in the order the roots read them."""
    seen: dict[str, Temp] = {}
    for v in values:
        for t in v.temps:
            if seen.setdefault(t.name, t) is not t:
                raise ValueError(f"CompLL: two different values are named {t.name!r}")
    return tuple(seen.values())


class _Lowering:
    """Lowers the expressions of one spec; a `let` or a reduction met twice lowers once."""

    def __init__(self, reductions: Sequence[lang.Reduction] = ()) -> None:
        self._reductions = {r: k for k, r in enumerate(reductions)}  # nodes hash by identity
        self._temps: dict[lang.Let, Temp] = {}

    def value(self, e: lang.Expr) -> Value:
        return Value(self.node(e), tuple(self._temp(v) for v in lang.lets(e)))

    def _temp(self, v: lang.Let) -> Temp:
        if v not in self._temps:
            self._temps[v] = Temp(v.name, v.kind, self.node(v.e))
        return self._temps[v]

    def node(self, e: lang.Expr) -> Node:
        if type(e) in LEAVES:
            return Node(LEAVES[type(e)], e.kind)
        if isinstance(e, lang.Const):
            return Node("const", e.kind, value=str(e.value) if e.kind == INT else repr(float(e.value)))
        if isinstance(e, (lang.Header, lang.Input)):
            return Node(type(e).__name__.lower(), e.kind, value=str(e.index))
        if isinstance(e, lang.Param):
            return Node("param", e.kind, value=e.name)
        if isinstance(e, lang.Let):
            return Node("temp", e.kind, value=e.name)
        if isinstance(e, lang.Reduction):
            return Node("red", e.kind, value=str(self._reductions[e]))
        return self._operation(e)

    def _operation(self, e: lang.Expr) -> Node:
        args = tuple(self.node(c) for c in e.children())
        if isinstance(e, lang.Bin):
            converts = e.op in _CONVERTED
            return Node(e.op, e.kind, _to_float(args) if e.kind == FLOAT and converts else args)
        if isinstance(e, lang.Un):
            return Node(e.op, e.kind, args)
        if isinstance(e, lang.Where):
            return Node("where", e.kind, (args[0], *_to_float(args[1:])) if e.kind == FLOAT else args)
        if isinstance(e, lang.MinMax):
            return Node(e.op, e.kind, _to_float(args) if e.kind == FLOAT else args)
        raise ValueError(f"CompLL: no lowering of {type(e).__name__}")


def _to_float(args: Iterable[Node]) -> tuple[Node, ...]:
    return tuple(a if a.kind == FLOAT else Node("to_float", FLOAT, (a,)) for a in args)


def lower(spec: lang.Spec) -> Lowered:
    reds = spec.reductions
    low = _Lowering(reds)
    return Lowered(reductions=tuple(Red(k, r.op, low.value(r.expr)) for k, r in enumerate(reds)),
                   header=tuple(low.value(h) for h in spec.header),
                   code=low.value(spec.code),
                   update=None if spec.update is None else low.value(spec.update),
                   value=low.value(spec.value))


def lower_select(sel: lang.Select) -> LoweredSelect:
    low = _Lowering()
    return LoweredSelect(key=low.value(sel.key), keep=low.value(sel.keep))
