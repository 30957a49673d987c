"""CompLL's language: a compression algorithm as a few expressions over CompLL's primitives.

A `Spec` says, for one flat fp32 tensor x of n elements (element i):

- reductions: `reduce(op, expr)` over every element (op: sum, max, min, count), the `reduce` of
  HiPress, used by the header; sums are taken in fp64 in a fixed order (chunks of `CHUNK`
  elements, 8 lanes per chunk, see `gen_cpu`), so a result never depends on the number of threads;
- `header`: fp32 scalars that travel in front of the codes (`concat`: the wire format is
  [packed codes uint8, header fp32] as compbench's quantizers send it), each a scalar expression
  over the reductions, `numel()`, the kernel's `inputs` (scalars the caller computes) and params;
- `code`: the element-wise `map` to a b-bit code (an int expression of x, `uniform()` (the
  counter-based stream of compbench's kernels: (murmur3_32(i, seed) >> 8) * 2^-24), `Header(k)`,
  params), packed `bits` per code LSB first (`pack`);
- `value`: the decode, a float expression of `Code()`, `Header(k)` and params, evaluated once per
  code into a table of 2^bits values (`unpack` + gather), so decoding costs one table lookup.

Expressions are built with Python operators on `Expr` nodes and translated by the generators
(`gen_torch`: the oracle, `gen_cpu`: the C++ extension, `gen_cuda`: the RawKernel). Element
arithmetic is fp32 with every operation rounded once (no FMA contraction), integers are int32.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from compbench.codec.base import Capabilities

# Elements per chunk of a reduction: the unit of parallel work and of the fixed summation order.
CHUNK = 131072

FLOAT, INT, BOOL = "float", "int", "bool"


class Expr:
    """A node of an expression; `kind` is FLOAT, INT or BOOL."""

    kind: str = FLOAT

    def _bin(self, op: str, other: Any, swap: bool = False) -> Expr:
        a, b = self, lift(other)
        return Bin(op, b, a) if swap else Bin(op, a, b)

    def __add__(self, o: Any) -> Expr: return self._bin("+", o)
    def __radd__(self, o: Any) -> Expr: return self._bin("+", o, True)
    def __sub__(self, o: Any) -> Expr: return self._bin("-", o)
    def __rsub__(self, o: Any) -> Expr: return self._bin("-", o, True)
    def __mul__(self, o: Any) -> Expr: return self._bin("*", o)
    def __rmul__(self, o: Any) -> Expr: return self._bin("*", o, True)
    def __truediv__(self, o: Any) -> Expr: return self._bin("/", o)
    def __rtruediv__(self, o: Any) -> Expr: return self._bin("/", o, True)
    def __lt__(self, o: Any) -> Expr: return self._bin("<", o)
    def __le__(self, o: Any) -> Expr: return self._bin("<=", o)
    def __gt__(self, o: Any) -> Expr: return self._bin(">", o)
    def __ge__(self, o: Any) -> Expr: return self._bin(">=", o)
    def eq(self, o: Any) -> Expr: return self._bin("==", o)
    def __and__(self, o: Any) -> Expr: return self._bin("&", o)
    def __or__(self, o: Any) -> Expr: return self._bin("|", o)
    def __lshift__(self, o: Any) -> Expr: return self._bin("<<", o)
    def __rshift__(self, o: Any) -> Expr: return self._bin(">>", o)
    def __neg__(self) -> Expr: return Un("neg", self)
    def __bool__(self) -> bool:
        raise ValueError("a CompLL expression has no truth value: write where(cond, a, b), & and |, "
                         "not `if`, `and`, `or` or chained comparisons")

    def children(self) -> tuple[Expr, ...]:
        """The element-wise operands of this node (a leaf has none; a reduction's own expression is
        another pass, not an operand)."""
        return ()


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: float | int
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class X(Expr):
    """Element i of the input tensor (fp32)."""
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class Uniform(Expr):
    """U[0, 1) of element i from the counter-based stream of the kernel's seed."""
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class Code(Expr):
    """The decoded element's code (decode only)."""
    kind: str = INT


@dataclass(frozen=True, eq=False)
class Header(Expr):
    """Header scalar k (fp32), as it travels."""
    index: int
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class Param(Expr):
    """A hyper-parameter of the compressor (a Hydra setting), fp32 in element expressions."""
    name: str
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class State(Expr):
    """Element i of the compressor's per-element state (fp32, e.g. TBQ's residual), as it was before
    this encode; the spec's `update` is its new value, written in place by the same pass."""
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class Input(Expr):
    """Scalar k handed to the encode kernel by the caller (fp32; e.g. TernGrad's clipped scale)."""
    index: int
    kind: str = FLOAT


@dataclass(frozen=True, eq=False)
class Reduction(Expr):
    """`reduce(op, expr)` over every element, as a scalar (header expressions only): op sum (fp64,
    a fixed order), max / min (fp32, NaN-propagating), count (of a condition, int64)."""
    op: str
    expr: Expr

    @property
    def kind(self) -> str:  # type: ignore[override]
        return INT if self.op == "count" else FLOAT


@dataclass(frozen=True, eq=False)
class Numel(Expr):
    """n, the number of elements (scalar expressions only)."""
    kind: str = INT


@dataclass(frozen=True, eq=False)
class Let(Expr):
    """A named intermediate value (`let("name", expr)`): the generators compute it once, as a local
    variable of that name, which keeps the generated code readable."""
    name: str
    e: Expr

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.e.kind

    def children(self) -> tuple[Expr, ...]:
        return (self.e,)


_ARITH = {"+", "-", "*", "/"}
_CMP = {"<", "<=", ">", ">=", "=="}
_BITS = {"&", "|", "<<", ">>"}


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr

    @property
    def kind(self) -> str:  # type: ignore[override]
        if self.op in _CMP:
            return BOOL
        if self.op in _BITS:
            if self.op in ("&", "|") and self.a.kind == BOOL and self.b.kind == BOOL:
                return BOOL
            if self.a.kind != INT or self.b.kind != INT:
                raise ValueError(f"CompLL: {self.op} takes two ints (or & | two bools); wrap with to_int()")
            return INT
        if self.a.kind == BOOL or self.b.kind == BOOL:
            raise ValueError(f"CompLL: {self.op} of a condition; use to_int(cond) or where(cond, a, b)")
        return FLOAT if FLOAT in (self.a.kind, self.b.kind) or self.op == "/" else INT

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b,)


@dataclass(frozen=True, eq=False)
class Un(Expr):
    """neg, abs, to_int (truncation; bool -> 0/1), to_float, exponent (the biased 8-bit exponent
    field of an fp32), pow2 (the fp32 whose biased exponent is the int, mantissa 0), isnan."""
    op: str
    a: Expr

    @property
    def kind(self) -> str:  # type: ignore[override]
        if self.op in ("to_int", "exponent"):
            return INT
        if self.op == "isnan":
            return BOOL
        if self.op in ("to_float", "pow2"):
            return FLOAT
        return self.a.kind

    def children(self) -> tuple[Expr, ...]:
        return (self.a,)


@dataclass(frozen=True, eq=False)
class Where(Expr):
    cond: Expr
    a: Expr
    b: Expr

    @property
    def kind(self) -> str:  # type: ignore[override]
        if self.cond.kind != BOOL:
            raise ValueError("CompLL: where(cond, a, b) needs a comparison as cond")
        return FLOAT if FLOAT in (self.a.kind, self.b.kind) else self.a.kind

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b,)


@dataclass(frozen=True, eq=False)
class MinMax(Expr):
    """minimum / maximum, NaN-propagating as torch.minimum: min(NaN, v) = NaN."""
    op: str
    a: Expr
    b: Expr

    @property
    def kind(self) -> str:  # type: ignore[override]
        return FLOAT if FLOAT in (self.a.kind, self.b.kind) else INT

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)


def lift(v: Any) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"CompLL: {v!r} is not an expression or a number")
    return Const(v, INT if isinstance(v, int) else FLOAT)


# The primitives, as a spec writes them.
x = X()


def let(name: str, e: Any) -> Expr:
    """Name an intermediate value (a C identifier): it becomes a local variable of the generated code."""
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"CompLL: let({name!r}, ...) needs an identifier such as 'scale'")
    return Let(name, lift(e))


def uniform() -> Expr:
    return Uniform()


def abs_(e: Any) -> Expr:
    return Un("abs", lift(e))


def to_int(e: Any) -> Expr:
    return Un("to_int", lift(e))


def to_float(e: Any) -> Expr:
    return Un("to_float", lift(e))


def exponent(e: Any) -> Expr:
    return Un("exponent", lift(e))


def pow2(e: Any) -> Expr:
    return Un("pow2", lift(e))


def isnan(e: Any) -> Expr:
    return Un("isnan", lift(e))


def where(cond: Expr, a: Any, b: Any) -> Expr:
    return Where(cond, lift(a), lift(b))


def minimum(a: Any, b: Any) -> Expr:
    return MinMax("min", lift(a), lift(b))


def maximum(a: Any, b: Any) -> Expr:
    return MinMax("max", lift(a), lift(b))


REDUCE_OPS = ("sum", "max", "min", "count")


def reduce(op: str, e: Any) -> Expr:
    """HiPress's `reduce`: sum, max, min or count (of a condition) of an element expression."""
    if op not in REDUCE_OPS:
        raise ValueError(f"CompLL: reduce({op!r}, ...); use one of {', '.join(REDUCE_OPS)}")
    e = lift(e)
    if (op == "count") != (e.kind == BOOL):
        raise ValueError("CompLL: count takes a condition; sum, max and min take numbers")
    return Reduction(op, e)


def numel() -> Expr:
    return Numel()


_BOUNDS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


@dataclass(frozen=True)
class Bound:
    """A setting's check as data: the value `op` `limit` (e.g. Bound(">", 0): positive)."""
    op: str
    limit: float

    def __post_init__(self) -> None:
        if self.op not in _BOUNDS:
            raise ValueError(f"CompLL: Bound({self.op!r}, ...); use one of {', '.join(_BOUNDS)}")

    def holds(self, v: float) -> bool:
        return bool(_BOUNDS[self.op](v, self.limit))


@dataclass(frozen=True)
class Setting:
    """A hyper-parameter: its default, its type, the bound a value must meet (a ValueError with the
    fix, `hint`, otherwise) or None."""
    default: float | int | bool
    kind: type = float
    check: Bound | None = None
    hint: str = ""

    def __post_init__(self) -> None:
        if self.check is not None and not isinstance(self.check, Bound):
            raise ValueError(f"CompLL: Setting(check={self.check!r}); write a Bound such as "
                             "Bound('>', 0), or None")


@dataclass(frozen=True, eq=False)  # hashed by identity: generated code is cached per spec
class Spec:
    """One compression algorithm (see the module docstring). `register`: the spec is a compressor
    of its own (compressor=NAME, built from this spec); False for a kernel that a hand-written
    compressor calls (HiPress's built-ins whose Python side stays: TernGrad's clipping, ...).
    `encode_name` / `decode_name`: the kernels' names (torch.ops.compbench_cpu.* and the CUDA
    entry points); `seeded`: the codes draw `uniform()` (the compressor then mixes a noise seed
    per rank, step and tensor)."""

    name: str
    doc: str
    bits: int
    code: Expr
    value: Expr
    header: tuple[Expr, ...] = ()
    inputs: int = 0
    settings: Mapping[str, Setting] = field(default_factory=dict)
    caps: Capabilities = Capabilities()
    update: Expr | None = None
    register: bool = True
    encode_name: str = ""
    decode_name: str = ""
    conf_comment: str = ""

    def __post_init__(self) -> None:
        if self.bits not in (1, 2, 4, 8):
            raise ValueError(f"spec {self.name}: bits={self.bits}; codes pack 1, 2, 4 or 8 bits per element")
        if not self.encode_name:
            object.__setattr__(self, "encode_name", f"{self.name}_encode")
        if not self.decode_name:
            object.__setattr__(self, "decode_name", f"{self.name}_decode")
        if self.code.kind != INT:
            raise ValueError(f"spec {self.name}: code must be an int expression (to_int(...) or where)")
        check(self, self.code, element=True, decode=False)
        check(self, self.value, element=True, decode=True)
        if self.inputs and self.register:
            raise ValueError(f"spec {self.name}: a compressor of its own has no caller to hand it inputs; "
                             "compute them as reductions in the header, or set register=False")
        if self.update is not None and self.register:
            raise ValueError(f"spec {self.name}: a compressor of its own keeps no state yet; "
                             "set register=False and keep the state in a hand-written compressor")
        if self.update is not None:
            check(self, self.update, element=True, decode=False)
            if self.update.kind != FLOAT:
                raise ValueError(f"spec {self.name}: update is the state's new fp32 value")
        for h in self.header:
            check(self, h, element=False, decode=False)
        for r in self.reductions:
            check(self, r.expr, element=True, decode=False)
            if any(isinstance(n, (Header, Uniform)) for n in walk(r.expr)):
                raise ValueError(f"spec {self.name}: a reduction reads x, inputs and settings only")

    @property
    def reductions(self) -> list[Reduction]:
        """Every reduction the header reads, in order of first appearance."""
        found: list[Reduction] = []
        for h in self.header:
            for n in walk(h):
                if isinstance(n, Reduction) and all(n is not f for f in found):
                    found.append(n)
        return found

    @property
    def params(self) -> list[str]:
        """The settings the kernels read (`Param` nodes), in the order of `settings`: the kernels'
        `params` argument."""
        roots = [*self._code_roots, self.value, *self.header, *(r.expr for r in self.reductions)]
        used = {n.name for r in roots for n in walk(r) if isinstance(n, Param)}
        used |= {n.name for r in roots for v in lets(r) for n in walk(v.e) if isinstance(n, Param)}
        return [k for k in self.settings if k in used]

    @property
    def stateful(self) -> bool:
        """The encode reads and updates a per-element state (`State()`, `update`)."""
        return self.update is not None

    @property
    def reads_header(self) -> bool:
        """The codes read the header or the inputs (the CUDA encode then takes them as `h`)."""
        return any(isinstance(n, (Header, Input)) for r in self._code_roots for n in walk(r))

    @property
    def _code_roots(self) -> list[Expr]:
        roots = [self.code, *([self.update] if self.update is not None else [])]
        return roots + [v.e for v in lets(*roots)]

    @property
    def seeded(self) -> bool:
        return any(isinstance(n, Uniform) for r in self._code_roots for n in walk(r))

    @property
    def fused(self) -> bool:
        """The codes need no reduction: one read computes both (onebit's bits and means)."""
        return not any(isinstance(n, Header) for r in self._code_roots for n in walk(r))


def walk(e: Expr):
    """The nodes of e, depth first (a reduction's own expression is not entered)."""
    yield e
    for child in e.children():
        yield from walk(child)


def check(spec: Spec, e: Expr, *, element: bool, decode: bool) -> None:
    """ValueError for a node that has no meaning where it is used."""
    for n in walk(e):
        where_ = "value" if decode else ("code" if element else "header")
        bad = ((isinstance(n, (X, Uniform, Input, State)) and (decode or not element))
               or (isinstance(n, Code) and not decode)
               or (isinstance(n, (Reduction, Numel)) and element)
               or (isinstance(n, Header) and not element))
        if isinstance(n, Input) and not element and not decode:
            bad = False
        if bad:
            raise ValueError(f"spec {spec.name}: {type(n).__name__} cannot appear in the {where_} expression")
        if isinstance(n, Header) and not 0 <= n.index < len(spec.header):
            raise ValueError(f"spec {spec.name}: Header({n.index}) but the header has "
                             f"{len(spec.header)} entries")
        if isinstance(n, Input) and not 0 <= n.index < spec.inputs:
            raise ValueError(f"spec {spec.name}: Input({n.index}) but inputs={spec.inputs}")
        if isinstance(n, Param) and n.name not in spec.settings:
            raise ValueError(f"spec {spec.name}: Param({n.name!r}) is not among its settings")
        n.kind  # noqa: B018 (type-checks the node)


def lets(*roots: Expr) -> list[Let]:
    """The named values under `roots`, each once, every one after those it reads."""
    order: list[Let] = []

    def visit(e: Expr) -> None:
        for child in e.children():
            visit(child)
        if isinstance(e, Let) and all(e is not o for o in order):
            if any(e.name == o.name for o in order):
                raise ValueError(f"CompLL: two different values are named {e.name!r}")
            order.append(e)

    for r in roots:
        visit(r)
    return order


# --- selections: filter / compaction and a sampled threshold (the sparsifiers) -------------------

SAMPLES = ("random", "strided")


def threshold() -> Expr:
    """The selection's threshold in the filter's condition: the sampled threshold (a host-side
    step's result handed to the filter kernel as its input 0)."""
    return Input(0)


@dataclass(frozen=True, eq=False)  # hashed by identity, as Spec
class Select:
    """A sparsifier's selection: a sampled threshold, then `filter`/compaction, then at most `limit`.

    - `key`: an element expression of x (fp32), the magnitude the selection ranks by;
    - `sample`: how the threshold's sample is drawn, a host-side step of the generated torch glue
      with torch's generator (`draw`): "random" (m indices uniform over [0, n), GradDrop) or
      "strided" (every (n // m)-th element from a random start, DGC); the whole tensor when m >= n;
    - the threshold: the j-th largest key of the sample, j = ceil(samples * ratio) (NaN largest, as
      numpy's partition): the generated `threshold` kernel;
    - `keep`: the filter's condition over x, `threshold()` and settings; the generated `filter`
      kernel returns the int64 indices passing it in index order (`compaction`);
    - `adapt`: (factor, times): while fewer than factor * limit pass, threshold *= factor and filter
      again, at most `times` times (DGC: (0.8, 10)); None for one shot (GradDrop);
    - then at most `limit` (the caller's k or 2k): the `limit` candidates of largest key
      (torch.topk among the candidates, in the glue);
    - the decode (`scatter`): zeros with the sent values added at their indices, duplicates adding
      in payload order (every rank's payloads at once: their concatenation).
    Registered as kernels of a hand-written compressor (its Python side: ratios, seeds, payload)."""

    name: str
    doc: str
    key: Expr
    keep: Expr
    sample: str = "random"
    adapt: tuple[float, int] | None = None
    settings: Mapping[str, Setting] = field(default_factory=dict)
    register: bool = False

    def __post_init__(self) -> None:
        if self.sample not in SAMPLES:
            raise ValueError(f"select {self.name}: sample={self.sample!r}; use one of {', '.join(SAMPLES)}")
        if self.register:
            raise ValueError(f"select {self.name}: a selection is a kernel of a hand-written compressor; "
                             "set register=False")
        if self.key.kind != FLOAT:
            raise ValueError(f"select {self.name}: key must be an fp32 expression of x, e.g. abs_(x)")
        if self.keep.kind != BOOL:
            raise ValueError(f"select {self.name}: keep must be a condition, e.g. abs_(x) >= threshold()")
        for root, what, inputs in ((self.key, "key", False), (self.keep, "keep", True)):
            for n in walk(root):
                if isinstance(n, Let):
                    continue
                ok = isinstance(n, (X, Const, Bin, Un, Where, MinMax)) or (inputs and isinstance(n, Input))
                if isinstance(n, Param):
                    ok = n.name in self.settings
                if not ok:
                    raise ValueError(f"select {self.name}: {type(n).__name__} cannot appear in its {what}")
                if isinstance(n, Input) and n.index != 0:
                    raise ValueError(f"select {self.name}: the filter has one input, threshold()")
                n.kind  # noqa: B018 (type-checks the node)
        if self.adapt is not None and not (0 < self.adapt[0] < 1 and self.adapt[1] >= 1):
            raise ValueError(f"select {self.name}: adapt=(factor, times) needs 0 < factor < 1 and times >= 1")

    @property
    def params(self) -> list[str]:
        """The settings the kernels read, in the order of `settings`."""
        roots = [self.key, self.keep]
        used = {n.name for r in roots for n in walk(r) if isinstance(n, Param)}
        used |= {n.name for r in roots for v in lets(r) for n in walk(v.e) if isinstance(n, Param)}
        return [k for k in self.settings if k in used]

    @property
    def threshold_name(self) -> str:
        return f"{self.name}_threshold"

    @property
    def filter_name(self) -> str:
        return f"{self.name}_filter"

    @property
    def decode_name(self) -> str:
        return f"{self.name}_decode"
