"""HiPress SeCoPa's cost model (ALGORITHMS.md) and the plan file it produces.

Every primitive costs `max(overhead, w*x + b)` seconds for an argument of x floats (a compressed
payload counts as its wire bytes / 4). For a gradient of s floats split into K partitions over N
workers:

    PS dense       gather(s/K) + bcast(s/K) + (N-1)*aggr(s/K)
    PS compressed  gather(s*rho/K) + bcast(s*rho/K) + min(K+1, N)*enc(s/K)
                   + min(N-1+K, 2(N-1))*dec(s*rho/K) + (N-1)*aggr(s/K)
    Ring dense     2(N-1)*send(s/K) + (N-1)*aggr(s/K)
    Ring compressed 2(N-1)*send(s*rho/K) + N*enc(s/K) + N*dec(s*rho/K) + (N-1)*aggr(s/K)

The best K in 1..N is taken for each side; the gradient is compressed when that is strictly cheaper.
What the primitives mean: gather(x) = a server receives x floats from each of the N-1 others, bcast(x)
= it sends x floats to each of them, send(x) = one ring hop of x floats, aggr(x) = adding two vectors
of x floats, enc(x) = encoding x floats, dec(y) = decoding a payload of y float-equivalents.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

TOPOLOGIES = ("ps", "ring")
PRIMITIVES = ("enc", "dec", "aggr", "gather", "bcast", "send")


@dataclass(frozen=True)
class Line:
    """cost(x) = max(overhead, w*x + b), in seconds."""

    w: float
    b: float = 0.0
    overhead: float = 0.0

    def __call__(self, x: float) -> float:
        return max(self.overhead, self.w * x + self.b)


@dataclass(frozen=True)
class Primitives:
    """The fitted cost line of every SeCoPa primitive."""

    enc: Line
    dec: Line
    aggr: Line
    gather: Line
    bcast: Line
    send: Line

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {k: asdict(getattr(self, k)) for k in PRIMITIVES}


def ps_dense(s: float, k: int, n: int, p: Primitives) -> float:
    x = s / k
    return p.gather(x) + p.bcast(x) + (n - 1) * p.aggr(x)


def ps_compressed(s: float, k: int, n: int, rho: float, p: Primitives) -> float:
    x, y = s / k, s * rho / k
    return (p.gather(y) + p.bcast(y) + min(k + 1, n) * p.enc(x) + min(n - 1 + k, 2 * (n - 1)) * p.dec(y)
            + (n - 1) * p.aggr(x))


def ring_dense(s: float, k: int, n: int, p: Primitives) -> float:
    x = s / k
    return 2 * (n - 1) * p.send(x) + (n - 1) * p.aggr(x)


def ring_compressed(s: float, k: int, n: int, rho: float, p: Primitives) -> float:
    x, y = s / k, s * rho / k
    return 2 * (n - 1) * p.send(y) + n * p.enc(x) + n * p.dec(y) + (n - 1) * p.aggr(x)


_DENSE = {"ps": ps_dense, "ring": ring_dense}
_COMPRESSED = {"ps": ps_compressed, "ring": ring_compressed}


@dataclass(frozen=True)
class Decision:
    """One line of the plan, plus the costs that decided it (seconds)."""

    name: str
    numel: int
    compress: bool
    k: int
    dense_s: float          # best dense cost (at k_dense)
    k_dense: int
    compressed_s: float     # best compressed cost (at k_compressed); inf when not allowed
    k_compressed: int

    @property
    def cost_s(self) -> float:
        return self.compressed_s if self.compress else self.dense_s

    def line(self) -> str:
        return f"{self.name},{self.numel},{'y' if self.compress else 'n'},{self.k}"


def decide(name: str, s: int, n: int, topology: str, p: Primitives, rho: Callable[[int], float],
           allowed: bool = True, min_partition: int = 0) -> Decision:
    """Best K for each side (ties: the smaller K), compress when strictly cheaper.

    `rho(m)` is the compression rate (wire bytes / 4m) of a partition of m floats; `allowed=False`
    (the compressor's selection rules never compress this tensor) forces dense; compressed
    partitions must keep more than `min_partition` floats (the pipeline sends smaller ones dense).
    """
    if topology not in TOPOLOGIES:
        raise ValueError(f"SeCoPa plans for comm=ps or comm=ring, not {topology}; add comm=ps")
    ks = range(1, max(1, min(n, s)) + 1)
    dense = [(_DENSE[topology](s, k, n, p), k) for k in ks]
    best_dense, k_dense = min(dense)
    best_comp, k_comp = math.inf, 1
    if allowed and n > 1:
        comp = [(_COMPRESSED[topology](s, k, n, rho(math.ceil(s / k)), p), k) for k in ks
                if math.ceil(s / k) > min_partition]
        if comp:
            best_comp, k_comp = min(comp)
    compress = best_comp < best_dense
    k = k_comp if compress else k_dense
    return Decision(name, s, compress, k, best_dense, k_dense, best_comp, k_comp)


@dataclass(frozen=True)
class PlanLine:
    """One gradient in a plan file: `name,numel,y|n,K`."""

    name: str
    numel: int
    compress: bool
    k: int


def write_plan(path: Path, decisions: list[Decision]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(d.line() + "\n" for d in decisions))


def read_plan(path: str | Path) -> dict[str, PlanLine]:
    """Parse a plan file (HiPress's format; blank lines and `#` comments are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"plan file {path} does not exist; write one with `compbench plan ...` "
                         "or pass scheduler.plan=null")
    plan: dict[str, PlanLine] = {}
    for no, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        # Parameter names never contain commas, so split from the right.
        parts = text.rsplit(",", 3)
        try:
            name, numel, flag, k = parts[0], int(parts[1]), parts[2].strip(), int(parts[3])
        except (IndexError, ValueError):
            raise ValueError(f"{path}:{no}: expected name,numel,y|n,K, got {text!r}") from None
        if flag not in ("y", "n") or k < 1 or numel < 0:
            raise ValueError(f"{path}:{no}: expected name,numel,y|n,K with K >= 1, got {text!r}")
        if name in plan:
            raise ValueError(f"{path}:{no}: {name} appears twice")
        plan[name] = PlanLine(name, numel, flag == "y", k)
    return plan


def plan_gradients(grads: list[tuple[str, int, bool]], world: int, topology: str, p: Primitives,
                   rho: Callable[[int], float], min_partition: int = 0) -> list[Decision]:
    """A decision for each (name, numel, compressible) gradient, in the order given."""
    return [decide(name, numel, world, topology, p, rho, ok, min_partition) for name, numel, ok in grads]


def summarize(decisions: list[Decision]) -> dict[str, float | int | dict[int, int]]:
    """Counts and predicted synchronization times (seconds, gradients one after another)."""
    chosen = [d for d in decisions if d.compress]
    partitions: dict[int, int] = {}
    for d in chosen:
        partitions[d.k] = partitions.get(d.k, 0) + 1
    return {
        "gradients": len(decisions),
        "compressed": len(chosen),
        "numel": sum(d.numel for d in decisions),
        "numel_compressed": sum(d.numel for d in chosen),
        "partitions": dict(sorted(partitions.items())),
        "plan_s": sum(d.cost_s for d in decisions),
        "all_dense_s": sum(d.dense_s for d in decisions),
        "all_compressed_s": sum(d.compressed_s if math.isfinite(d.compressed_s) else d.dense_s
                                for d in decisions),
    }
