"""The torch generator: a spec as plain torch code, the oracle of the compiled kernels.

`source(spec)` is Python text (what `compbench gen SPEC --target torch` prints); `module(spec)`
executes it once. Element expressions become whole-tensor operations with the same fp32 roundings
as the kernels (one rounding per operation), so codes match the kernels bit for bit; fp64 sums may
differ from the kernels' fixed-order sums in the last bits of the header. The expressions are the
lowered form every generator prints (`printer.TORCH`, `printer.TORCH_HEADER`); the fixed code is in
templates/torch_*.tmpl.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

from compbench.compll import catalog, lang, lower, skeleton
from compbench.compll.lang import FLOAT
from compbench.compll.lower import Lowered, Red, Value
from compbench.compll.printer import TORCH, TORCH_HEADER, Target, declare, text

# A reduction of an element expression {e} of n elements, as a 0-dim fp64 (count: int64) tensor.
REDUCTIONS = {
    "sum": "({e}).to(torch.float64).sum() if n else _t(0.0, torch.float64)",
    "count": "torch.count_nonzero({e}).to(torch.int64)",
    "max": "({e}).amax().to(torch.float64) if n else _t(float('-inf'), torch.float64)",
    "min": "({e}).amin().to(torch.float64) if n else _t(float('inf'), torch.float64)",
}


def _temps(t: Target, *values: Value) -> list[str]:
    return declare(lower.temps(*values), t)


def _reduction(r: Red) -> list[str]:
    body = REDUCTIONS[r.op].format(e=text(r.value.node, TORCH))
    return [*_temps(TORCH, r.value), f"r{r.index} = {body}  # reduce {r.op}"]


def _header_return(low: Lowered) -> str:
    if not low.header:
        return "return torch.zeros(0, dtype=torch.float32, device=x.device)"
    values = [text(h.node, TORCH_HEADER) for h in low.header]
    values = [v if h.node.kind == FLOAT else f"({v}).to(torch.float64)" for v, h in zip(values, low.header,
                                                                                          strict=True)]
    return ("return torch.stack([" + ", ".join(f"({v}).to(torch.float64)" for v in values)
            + "]).to(torch.float32).to(x.device)")


def _compressor(spec: lang.Spec) -> list[str]:
    """The compressor class of a registered spec (its settings as keyword arguments)."""
    if not spec.register:
        return []
    args = ", ".join(f"{k}: {v.kind.__name__} = {v.default!r}" for k, v in spec.settings.items())
    return skeleton.fill("torch_compressor.py", doc=spec.doc, name=repr(spec.name),
                         args=f", {args}" if args else "",
                         kwargs=", ".join(f"{k}={k}" for k in spec.settings))


def source(spec: lang.Spec | lang.Select) -> str:
    """The generated torch module of `spec`: encode(x, inputs, seed, params) -> (packed, header),
    table(header, params) -> the 2^bits decoded values, decode(packed, header, numel, params, out)
    (a `Select`: `select_source`)."""
    if isinstance(spec, lang.Select):
        return select_source(spec)
    low = lower.lower(spec)
    upd = [low.update] if low.update is not None else []
    return skeleton.render(
        "torch_spec.py", origin=_origin(spec.name), bits=spec.bits, nheader=len(spec.header),
        reductions=[line for r in low.reductions for line in _reduction(r)],
        header_temps=_temps(TORCH_HEADER, *low.header), header_return=_header_return(low),
        draw=["u = counter_uniform(seed, n, x.device)"] if spec.seeded else [],
        code_temps=_temps(TORCH, low.code, *upd), code=text(low.code.node, TORCH),
        update=[f"state.copy_({text(u.node, TORCH)})  # the state's new value, in place"
                ] if (u := low.update) else [],
        value_temps=_temps(TORCH, low.value), value=text(low.value.node, TORCH),
        compressor=_compressor(spec))


def select_source(sel: lang.Select) -> str:
    """The generated torch module of a selection: `draw` (the host-side sample, torch's generator),
    the oracles `threshold` and `filter` of the compiled kernels, and `select`, the glue that runs
    them (with the kernels a launcher hands it) through the adaptation and the limit."""
    low = lower.lower_select(sel)
    adapt = [] if sel.adapt is None else skeleton.fill(
        "torch_adapt.py", factor=repr(sel.adapt[0]), times=sel.adapt[1])
    return skeleton.render(
        "torch_select.py", origin=_origin(sel.name), doc=sel.doc.splitlines()[0],
        draw=skeleton.lines(f"torch_draw_{sel.sample}.py"),
        key_temps=_temps(TORCH, low.key), key=text(low.key.node, TORCH),
        keep_temps=_temps(TORCH, low.keep), keep=text(low.keep.node, TORCH),
        adapting=", the adaptation" if sel.adapt else "", adapt=adapt)


def _origin(name: str) -> str:
    """The spec's file as the generated module cites it (compbench's own: relative to compll/)."""
    return catalog.origin(name).removeprefix("src/compbench/compll/")


@cache
def module(spec: lang.Spec | lang.Select) -> ModuleType:
    """The executed torch module of `spec` (once per process)."""
    mod = ModuleType(f"compbench.compll.generated_torch.{spec.name}")
    exec(compile(source(spec), f"<compll torch {spec.name}>", "exec"), mod.__dict__)  # noqa: S102
    return mod
