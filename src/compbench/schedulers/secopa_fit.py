"""Fit SeCoPa's cost lines from short measurements on this machine (or from network settings).

- enc / dec: the compressor itself, timed at a few sizes (best of a few repetitions); dec is fitted
  against the payload's float-equivalents (wire bytes / 4), as the cost model calls it.
- aggr: adding two fp32 vectors.
- gather / bcast / send: either the alpha-beta model of `gbps` and `latency_us` (planning for a
  cluster that is not this one), or a short probe of the engine with every rank taking part:
  all-to-all (a server receiving x floats from each peer), allgather (sending x floats to each
  peer) and allreduce of N*x floats (2(N-1) ring hops of x floats each).

`compbench plan` runs the engine probe as every rank of a job (compbench.plan.probe).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from compbench.codec.base import payload_nbytes
from compbench.schedulers.secopa_cost import Line, Primitives

# Default sizes (floats) of the timing probes: small enough to take well under a second each.
PROBE_SIZES = (4096, 65536, 1048576)
ENGINE_SIZES = (1024, 16384, 262144)
# A compressor is probed in its steady state: warm-ups keyed on the epoch (DGC's ratio) are over.
_STEADY_EPOCH = 1e9


_CPU = torch.device("cpu")

def fit_line(xs: list[float], ts: list[float]) -> Line:
    """cost(x) = max(overhead, w*x + b): least squares on relative errors (the sizes span decades,
    so plain least squares would ignore the small ones); overhead = the time at the smallest size."""
    if len(xs) != len(ts) or not xs:
        raise ValueError("fit_line needs as many times as sizes")
    floor = ts[min(range(len(xs)), key=lambda i: xs[i])]
    weights = [1.0 / max(t, 1e-9) ** 2 for t in ts]
    sw = sum(weights)
    sx = sum(w * x for w, x in zip(weights, xs, strict=True))
    st = sum(w * t for w, t in zip(weights, ts, strict=True))
    sxx = sum(w * x * x for w, x in zip(weights, xs, strict=True))
    sxt = sum(w * x * t for w, x, t in zip(weights, xs, ts, strict=True))
    det = sw * sxx - sx * sx
    if len(set(xs)) < 2 or det <= 0:
        return Line(w=0.0, b=st / sw, overhead=floor)
    w = (sw * sxt - sx * st) / det
    b = (st - w * sx) / sw
    if w < 0:  # noise on a flat profile: a constant cost
        w, b = 0.0, st / sw
    return Line(w=w, b=b, overhead=floor)


def best_time(fn: Callable[[], Any], reps: int, device: torch.device = _CPU) -> float:
    """The least wall time of `reps` calls of `fn` in seconds, after one untimed warm-up call:
    interference from other processes (a shared machine) only ever adds time. On a GPU each call is
    timed to the end of its work (synchronized before and after), not to the end of its launches."""
    wait = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(max(1, reps)):
        wait()
        t0 = time.perf_counter()
        fn()
        wait()
        times.append(time.perf_counter() - t0)
    return min(times)


def probe_compressor(compressor: Any, sizes: tuple[int, ...] = PROBE_SIZES, reps: int = 5,
                     device: torch.device = _CPU) -> tuple[Line, Line, float, list[dict[str, float]]]:
    """Time encode and decode at each size on `device` (the training's) on a private copy of
    `compressor` (its per-tensor state must not leak into training). Returns (enc, dec, measured wire
    rate at the largest size, samples)."""
    comp = copy.deepcopy(compressor)
    comp.begin_step(0, _STEADY_EPOCH)
    gen = torch.Generator().manual_seed(0)
    samples = []
    for m in sizes:
        x = torch.randn(int(m), generator=gen, device="cpu").to(device)  # the same values on every device
        name = f"secopa.probe.{m}"
        t_enc = best_time(partial(comp.compress, x, name), reps, device)
        payload, ctx = comp.compress(x, name)
        t_dec = best_time(partial(comp.decompress, payload, ctx), reps, device)
        samples.append({"numel": int(m), "wire_bytes": payload_nbytes(payload), "enc_s": t_enc,
                        "dec_s": t_dec})
    enc = fit_line([s["numel"] for s in samples], [s["enc_s"] for s in samples])
    dec = fit_line([max(1.0, s["wire_bytes"] / 4) for s in samples], [s["dec_s"] for s in samples])
    rate = samples[-1]["wire_bytes"] / (4 * samples[-1]["numel"])
    return enc, dec, rate, samples


def probe_aggr(sizes: tuple[int, ...] = PROBE_SIZES, reps: int = 5, device: torch.device = _CPU) -> Line:
    """Adding two fp32 vectors on `device` (a server summing a peer's decoded shard into its own)."""
    times = []
    for m in sizes:
        a, b = torch.zeros(int(m), device=device), torch.ones(int(m), device=device)
        times.append(best_time(partial(a.add_, b), reps, device))
    return fit_line([float(m) for m in sizes], times)


def net_lines(gbps: float, latency_us: float, world: int) -> dict[str, Line]:
    """The alpha-beta model: send(x) = alpha + 4x/B; gather(x) = bcast(x) = alpha + (N-1)*4x/B (a
    server's link carries x floats to or from each of the N-1 others, concurrently)."""
    if not (isinstance(gbps, int | float) and gbps > 0):
        raise ValueError(f"net.gbps={gbps} must be a number > 0 (link bandwidth in Gbit/s), "
                         "or null to measure")
    if not (isinstance(latency_us, int | float) and latency_us >= 0):
        raise ValueError(f"net.latency_us={latency_us} must be a number >= 0 (microseconds)")
    alpha, per_float = latency_us * 1e-6, 4.0 / (gbps * 1e9 / 8)
    peers = max(1, world - 1)
    return {"gather": Line(peers * per_float, alpha, alpha), "bcast": Line(peers * per_float, alpha, alpha),
            "send": Line(per_float, alpha, alpha)}


def probe_engine(engine: Any, sizes: tuple[int, ...] = ENGINE_SIZES, reps: int = 5) -> dict[str, Line]:
    """Collective: every rank calls it with the same arguments. Times all-to-all, allgather and
    allreduce at each size (x floats per peer) of tensors on the engine's device (the training's
    collectives) and fits gather, bcast and send."""
    n, device = engine.size, engine.device
    gather, bcast, send = [], [], []
    for x in sizes:
        x = int(x)
        buf, mine, whole = (torch.ones(count, device=device) for count in (n * x, x, n * x))
        gather.append(best_time(partial(engine.alltoall, buf, [x] * n, "secopa.probe.a2a"), reps, device))
        bcast.append(best_time(partial(engine.allgather, [mine], "secopa.probe.ag"), reps, device))
        # A ring allreduce of N*x floats is 2(N-1) hops of x floats.
        hops = 2 * max(1, n - 1)
        send.append(best_time(partial(engine.allreduce, whole, "secopa.probe.ar"), reps, device) / hops)
    xs = [float(x) for x in sizes]
    return {"gather": fit_line(xs, gather), "bcast": fit_line(xs, bcast), "send": fit_line(xs, send)}


def primitives(enc: Line, dec: Line, aggr: Line, net: dict[str, Line]) -> Primitives:
    return Primitives(enc=enc, dec=dec, aggr=aggr, gather=net["gather"], bcast=net["bcast"], send=net["send"])


def rate_function(compressor: Any, measured: float) -> Callable[[int], float]:
    """rho(m) = wire bytes / 4m for a partition of m floats: exact where the compressor knows its
    payload size, else the rate measured by the probe (data-dependent sparsifiers)."""
    comp = copy.deepcopy(compressor)
    comp.begin_step(0, _STEADY_EPOCH)

    def rho(m: int) -> float:
        exact = comp.wire_bytes(m) if m > 0 else None
        return exact / (4 * m) if exact is not None else measured

    return rho


def fit_primitives(compressor: Any, world: int, gbps: float | None, latency_us: float,
                   net: dict[str, Line] | None = None, sizes: tuple[int, ...] = PROBE_SIZES, reps: int = 5,
                   device: torch.device = _CPU) -> tuple[Primitives, Callable[[int], float], dict[str, Any]]:
    """Every primitive's line: enc/dec/aggr timed here on `device`; the network from `gbps` (with
    `latency_us`), else `net` (lines from `probe_engine`), else zero (one worker sends nothing).
    Returns (lines, rho(m), details for the record)."""
    if gbps is not None:
        net, source = net_lines(gbps, latency_us, world), f"net model: {gbps} Gbit/s, {latency_us} us"
    elif net is not None and world > 1:
        source = "engine probe"
    else:
        net, source = {k: Line(0.0) for k in ("gather", "bcast", "send")}, "no network (1 worker)"
    enc, dec, measured_rate, samples = probe_compressor(compressor, sizes, reps, device)
    aggr = probe_aggr(sizes, reps, device)
    prims = primitives(enc, dec, aggr, net)
    details = {"network": source, "lines": prims.as_dict(), "measured_rate": measured_rate, "probe": samples}
    return prims, rate_function(compressor, measured_rate), details


def lines_to_json(lines: dict[str, Line]) -> dict[str, dict[str, float]]:
    return {k: {"w": v.w, "b": v.b, "overhead": v.overhead} for k, v in lines.items()}


def lines_from_json(data: dict[str, dict[str, float]]) -> dict[str, Line]:
    return {k: Line(**v) for k, v in data.items()}
