"""The measurements of `compbench bench`, run as `python -m compbench.bench.micro SPEC.json OUT.json`.

A child process of its own: the thread count (OMP_NUM_THREADS) and torch's allocator setting
(THP_MEM_ALLOC_ENABLE) only take effect when set before torch starts, and the parent's imports must
not skew them. SPEC is the checked plain config that `main.py` writes; OUT receives the results
(schema below), which `main.py` prints as a table and saves with the config.

Every time is the median of `repeats` calls after `warmup` untimed ones (with min, max and a
`noisy` flag when (max - min) / median exceeds `spread_limit`), Python's garbage collector off,
and, on CUDA, a synchronization before and after each call. Floors are measured in the same run on
the same tensor: one read pass (`x.sum()`), one copy into a warm buffer, one zero fill of a warm
buffer, and exact `torch.topk(abs(x), k)`.

OUT = {"environment": {...}, "floors": [{numel, device, read_ms, copy_ms, zero_ms, topk_ms: {ratio: stat}}],
       "results": [{compressor, numel, shape, ratio, k, encode_ms, decode_ms, decode_peers, ef_update_ms,
                    payload_bytes, sent_elements, bits_per_element, relative_error, encode_x_read,
                    encode_x_copy, speedup_vs_topk, decode_floor_ms, decode_x_floor,
                    vs_floors: {encode|decode|ef_update: {x_read, x_copy, topk_speedup}}, noisy, ...}],
       "overhead": [{compressor, numel, encode_us, decode_us}]}
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from compbench.codec.base import decodes_into
from compbench.codec.buffers import OutputBuffers
from compbench.compressors import SELECTION_KEYS, build_compressor, payload_nbytes
from compbench.compressors.sparse import SparseCompressor

# A compressor is measured in its steady state: warm-ups keyed on the epoch (DGC's ratio) are over.
_STEADY_EPOCH = 1e9


class Timer:
    """Median-of-N wall times in ms, with warm-ups, gc off and CUDA synchronization."""

    def __init__(self, repeats: int, warmup: int, spread_limit: float, device: torch.device) -> None:
        self.repeats, self.warmup, self.spread_limit = repeats, warmup, spread_limit
        self.sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def __call__(self, fn: Callable[[], Any], setup: Callable[[], Any] | None = None,
                 repeats: int | None = None) -> dict[str, Any]:
        times = []
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for i in range(self.warmup + (repeats or self.repeats)):
                if setup is not None:
                    setup()
                self.sync()
                t0 = time.perf_counter()
                fn()
                self.sync()
                if i >= self.warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
        finally:
            if was_enabled:
                gc.enable()
        return stat(times, self.spread_limit)


def stat(times_ms: list[float], spread_limit: float) -> dict[str, Any]:
    med = statistics.median(times_ms)
    lo, hi = min(times_ms), max(times_ms)
    spread = (hi - lo) / med if med > 0 else 0.0
    return {"median": med, "min": lo, "max": hi, "spread": spread, "noisy": spread > spread_limit,
            "n": len(times_ms)}


def matrix_shape(n: int) -> tuple[int, ...]:
    """(rows, cols) with rows the largest divisor of n not above sqrt(n): low-rank compressors see a
    matrix (a prime n stays 1-D; sparsifiers and quantizers read any shape flat)."""
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return (n,) if rows == 1 else (rows, n // rows)


def environment(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: threads, allocator, load, versions, processor, device."""
    import numpy

    from compbench.kernels import cpu as cpu_kernels

    env: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "allocator": {
            "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE"),
            "transparent_hugepage": _read_first("/sys/kernel/mm/transparent_hugepage/enabled"),
            "libc": " ".join(platform.libc_ver()),
            **{k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "PYTORCH_CUDA_ALLOC"))},
        },
        "load_average": list(os.getloadavg()),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_kernels.cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "device": str(device),
        "cpu_kernels": cpu_kernels.status(),  # compiled extension, or the torch twins and why
    }
    try:
        from importlib.metadata import version

        env["compbench"] = version("compbench")
    except Exception:  # not installed as a distribution (plain checkout on sys.path)
        env["compbench"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        from compbench.kernels import cuda_kernels_enabled

        env["cuda_kernels"] = cuda_kernels_enabled(torch.empty(1, device=device))
        if env["cuda_kernels"]:
            import cupy

            env["cupy"] = cupy.__version__
    return env


def _read_first(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _ratio_of(spec_params: dict[str, Any]) -> bool:
    return "ratio" in spec_params


def _topk_abs(flat: Tensor, k: int) -> Any:
    return torch.topk(flat.abs(), k, sorted=False)


def floors(x: Tensor, ratios: list[float], timer: Timer, topk: bool) -> dict[str, Any]:
    """Same-run floors for the tensor `x`: read pass, copy, zero fill, exact torch.topk per ratio."""
    flat = x.reshape(-1)
    buf = torch.empty_like(flat)
    out: dict[str, Any] = {
        "numel": flat.numel(),
        "device": str(flat.device),
        "read_ms": timer(lambda: flat.sum()),
        "copy_ms": timer(lambda: buf.copy_(flat)),
        "zero_ms": timer(lambda: buf.zero_()),
        "topk_ms": {},
    }
    if topk:
        for r in ratios:
            k = max(1, math.ceil(flat.numel() * r))
            out["topk_ms"][str(r)] = timer(partial(_topk_abs, flat, k))
    return out


def bench_one(name: str, params: dict[str, Any], ratio: float | None, x: Tensor, floor: dict[str, Any],
              timer: Timer, peers: int) -> dict[str, Any]:
    """Encode, decode of `peers` payloads, error-feedback update, bytes and error of one compressor."""
    from compbench.memory.residual import ResidualMemory

    kwargs = {k: v for k, v in params.items() if k not in SELECTION_KEYS}
    if ratio is not None:
        kwargs["ratio"] = ratio
    comp = build_compressor(name, **kwargs)
    tensor = f"bench.{x.numel()}"
    step = [0]

    def next_step() -> None:
        step[0] += 1
        comp.begin_step(step[0], _STEADY_EPOCH)

    last: dict[str, Any] = {}

    def encode() -> None:
        last["payload"], last["ctx"] = comp.compress(x, tensor)

    enc = timer(encode, setup=next_step)
    payload, ctx = last["payload"], last["ctx"]
    nbytes = payload_nbytes(payload)
    decoded = comp.decompress(payload, ctx)
    norm = float(torch.linalg.vector_norm(x.double()))
    err = float(torch.linalg.vector_norm((decoded - x).double())) / max(norm, 1e-30)

    # N ranks' payloads: the same tensor at N different steps (different seeds, hash tables, noise).
    payloads = [payload]
    for _ in range(peers - 1):
        next_step()
        payloads.append(comp.compress(x, tensor)[0])
    buffers = OutputBuffers()
    with_out = comp.caps.decodes_into
    if with_out and decodes_into(comp):
        into = comp
        dec = timer(lambda: into.decompress_all(payloads, ctx, out=buffers.get(ctx)))
    else:
        dec = timer(lambda: comp.decompress_all(payloads, ctx))

    # The decode floor: a zero fill of a warm buffer, plus the scatter of the sent values (sparse).
    sparse = isinstance(comp, SparseCompressor) and len(payload) == 2
    fill = torch.empty(x.numel(), dtype=torch.float32, device=x.device)
    if sparse:
        idx = torch.cat([p[1] for p in payloads])
        vals = torch.cat([p[0].float() for p in payloads])
        dec_floor = timer(lambda: fill.zero_().index_add_(0, idx, vals))
    else:
        dec_floor = floor["zero_ms"]

    # The update a step makes: on the memory's own buffer, which compensate returned and the
    # compressor read (the residual is kept in place).
    memory = ResidualMemory()
    compensated = memory.compensate(x, tensor)
    ef = timer(lambda: memory.update(compensated, tensor, comp, payload, ctx))

    read, copy = floor["read_ms"]["median"], floor["copy_ms"]["median"]
    topk = floor["topk_ms"].get(str(ratio)) if ratio is not None else None
    row: dict[str, Any] = {
        "compressor": name,
        "params": kwargs,
        "numel": x.numel(),
        "shape": list(x.shape),
        "ratio": ratio,
        "k": max(1, math.ceil(x.numel() * ratio)) if ratio is not None else None,
        "encode_ms": enc,
        "decode_ms": dec,
        "decode_peers": peers,
        "decode_into_buffer": with_out,
        "decode_floor_ms": dec_floor,
        "ef_update_ms": ef,
        "payload_bytes": nbytes,
        "dense_bytes": 4 * x.numel(),
        "sent_elements": payload[0].numel() if sparse or name == "randk" else None,
        "bits_per_element": 8.0 * nbytes / max(1, x.numel()),
        "relative_error": err,
        "encode_x_read": enc["median"] / read if read > 0 else None,
        "encode_x_copy": enc["median"] / copy if copy > 0 else None,
        "speedup_vs_topk": topk["median"] / enc["median"] if topk and enc["median"] > 0 else None,
        "decode_x_floor": dec["median"] / dec_floor["median"] if dec_floor["median"] > 0 else None,
    }
    # Every time against every same-run floor: multiples of the read pass and of the copy, speed-up
    # of exact torch.topk over it (at this ratio).
    row["vs_floors"] = {
        phase: {
            "x_read": t["median"] / read if read > 0 else None,
            "x_copy": t["median"] / copy if copy > 0 else None,
            "topk_speedup": topk["median"] / t["median"] if topk and t["median"] > 0 else None,
        }
        for phase, t in (("encode", enc), ("decode", dec), ("ef_update", ef))
    }
    row["noisy"] = any(s["noisy"] for s in (enc, dec, ef, dec_floor, floor["read_ms"], floor["copy_ms"]))
    return row


def overhead(name: str, params: dict[str, Any], numel: int, calls: int, timer: Timer,
             device: torch.device) -> dict[str, Any]:
    """Per-call cost on a small tensor: median of `calls` encodes and of `calls` decodes, in us."""
    kwargs = {k: v for k, v in params.items() if k not in SELECTION_KEYS}
    comp = build_compressor(name, **kwargs)
    comp.begin_step(1, _STEADY_EPOCH)
    x = torch.randn(matrix_shape(numel), generator=torch.Generator().manual_seed(1)).to(device)
    payload, ctx = comp.compress(x, "bench.small")
    enc = timer(lambda: comp.compress(x, "bench.small"), repeats=calls)
    dec = timer(lambda: comp.decompress(payload, ctx), repeats=calls)
    return {"compressor": name, "numel": numel, "encode_us": enc["median"] * 1e3,
            "decode_us": dec["median"] * 1e3, "encode_min_us": enc["min"] * 1e3,
            "decode_min_us": dec["min"] * 1e3}


def run(spec: dict[str, Any], progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """All measurements of a checked spec (see main.py's `check`)."""
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    device = torch.device(spec["device"])
    timer = Timer(spec["repeats"], spec["warmup"], spec["spread_limit"], device)
    load_before = list(os.getloadavg())
    out: dict[str, Any] = {"environment": environment(device), "floors": [], "results": [], "overhead": []}
    gen = torch.Generator().manual_seed(int(spec["seed"]))
    for n in spec["sizes"]:
        x = torch.randn(matrix_shape(n), generator=gen).to(device)
        progress(f"n={n}: floors")
        floor = floors(x, spec["ratios"], timer, spec["topk_baseline"])
        out["floors"].append(floor)
        for name, params in spec["compressors"].items():
            for ratio in spec["ratios"] if _ratio_of(params) else [None]:
                progress(f"n={n}: {name}" + (f" ratio={ratio}" if ratio is not None else ""))
                out["results"].append(bench_one(name, params, ratio, x, floor, timer, spec["peers"]))
        del x
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if spec["overhead_numel"]:
        for name, params in spec["compressors"].items():
            progress(f"overhead: {name}")
            out["overhead"].append(overhead(name, params, spec["overhead_numel"], spec["overhead_calls"],
                                            timer, device))
    out["environment"]["load_average_before"] = load_before
    out["environment"]["load_average_after"] = list(os.getloadavg())
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m compbench.bench.micro SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    result = run(spec, progress=lambda s: print(f"compbench bench: {s}", file=sys.stderr, flush=True))
    Path(argv[1]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
