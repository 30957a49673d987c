"""Every phase of a step next to its floor: the time it cannot go below on this machine.

A floor is what a phase must at least do, priced on this machine: the memory passes it has to make
over the gradients or the parameters (each pass priced at the read bandwidth that one `x.sum()` over
a gradient-sized tensor reaches here, the "read pass" of `compbench bench`), or the bytes it has to
put on the link (priced at the shaped link's rate). A phase far above its floor is the harness (or an
implementation) at work, not the algorithm. The declarations are data (the memory's traits, the
optimizer table below):

- compress: the encode reads the (compensated) gradient once; error-feedback memory adds the passes
  over its own state that it cannot avoid (`MemoryTraits.state_passes`: reading and writing each
  state tensor). Priced over the fp32 bytes of the compressed tensors. A threshold drawn from a
  uniform sample (`Capabilities.random_sample`: dragonn, graddrop) adds its reads at random places,
  each priced as one element of a sorted gather here (the cheapest order any reader of those places
  could take; `measure_sampled_read_ns`).
- exposed comm: the wire time of the step's bytes at the link rate, by the communicator's declared
  collective pattern (ring allgather: N-1 payloads through each link; ring allreduce: 2(N-1)/N of the
  tensor). Communication hidden behind back-propagation may expose less; the wire time is the mark
  that a step which waits for all of it cannot beat. Unknown (None) without a shaped link.
- decompress: one pass writing the averaged dense gradient of the compressed tensors, except those
  whose sparse average goes to the optimizer as it is (`handed_over` bytes of them: the sparse
  hand-over of comm=allgather); for those, one read of the payloads received.
- optimizer: its passes over the parameters and their state (`OPTIMIZER_PASSES`: read parameter and
  gradient, write the parameter, read and write each state tensor).
- compute: the model's own work (no floor from the harness); other: 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

# Passes over the parameters per optimizer step: read p and g, write p (3), plus a read and a write
# per state tensor (momentum: 1; Adam and AdamW: 2).
OPTIMIZER_STATE = {"sgd": 1, "adam": 2, "adamw": 2}
PHASES = ("compute", "compress", "comm_exposed", "decompress", "optimizer", "other")
LABELS = {"comm_exposed": "exposed comm"}


def optimizer_passes(optim: Mapping[str, Any]) -> int | None:
    """Passes over the parameters of one step of `optim` (a config's optim group), None if unknown."""
    name = str(optim.get("name") or optim.get("_name") or "")
    if name not in OPTIMIZER_STATE:
        return None
    state = OPTIMIZER_STATE[name]
    if name == "sgd" and not optim.get("momentum"):
        state = 0
    return 3 + 2 * state


READ_PASS_BYTES = (32 << 20, 256 << 20)  # the read pass's tensor: gradient-sized, within these bounds


def measure_read_gbps(nbytes: int, device: torch.device | str = "cpu", repeats: int = 7) -> float:
    """GB/s of one read pass (`x.sum()`) over an fp32 tensor of `nbytes`, with this process's
    threads: the fastest of `repeats` after one warm-up, since a floor is the best this machine does
    (a busy machine's median undersells it). The tensor is at least 32 MiB, so that caches do not
    flatter it, and at most 256 MiB (past the caches the rate no longer depends on the size; ViT-B's
    gradients would allocate 344 MB at the end of a run)."""
    x = _read_pass_tensor(nbytes, device)
    return x.numel() * 4 / _fastest(x.sum, x, repeats) / 1e9


def measure_sampled_read_ns(nbytes: int, count: int, device: torch.device | str = "cpu",
                            repeats: int = 7) -> float:
    """ns per element of reading `count` elements at uniformly random places of an fp32 tensor of
    `nbytes` (bounded as the read pass's), in ascending order: the fastest of `repeats` after one
    warm-up, as `measure_read_gbps`."""
    x = _read_pass_tensor(nbytes, device)
    count = max(1, min(count, x.numel()))
    places = torch.randint(x.numel(), (count,), generator=torch.Generator().manual_seed(0),
                           device="cpu").sort().values
    places = places.to(x.device)
    return _fastest(lambda: x.index_select(0, places), x, repeats) / count * 1e9


def _read_pass_tensor(nbytes: int, device: torch.device | str) -> torch.Tensor:
    low, high = READ_PASS_BYTES
    return torch.ones(min(max(nbytes, low), high) // 4, device=device)


def _fastest(run: Callable[[], object], x: torch.Tensor, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of `run` after one warm-up (on x's device)."""
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    run()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def wire_ms(summary: Mapping[str, Any], world_size: int, pattern: str,
            link_gbps: float | None) -> float | None:
    """Time the step's bytes take through one worker's link: the dense allreduce part as a ring
    allreduce, the compressed part by the communicator's pattern (allgather and all-to-all plus
    gather alike: each link carries N-1 payloads of the rank's size)."""
    if not link_gbps or world_size < 2:
        return None
    n = world_size
    sent = float(summary.get("bytes_sent_per_step") or 0.0)
    dense = float(summary.get("bytes_allreduce_per_step") or 0.0)
    compressed = sent - dense
    through = 2 * (n - 1) / n * dense
    through += (2 * (n - 1) / n if pattern == "allreduce" else (n - 1)) * compressed
    return through / (link_gbps * 1e9 / 8) * 1e3


def phase_floors(summary: Mapping[str, Any], *, world_size: int, read_gbps: float, link_gbps: float | None,
                 memory_passes: int, optim: Mapping[str, Any], pattern: str,
                 handed_over: float = 0.0, sampled_read_ns: float = 0.0) -> dict[str, Any]:
    """Each phase's time and floor (ms) with what the floor is made of, for results.json.
    `handed_over`: fp32 bytes of the compressed tensors whose sparse averages skip the dense decode;
    `sampled_read_ns`: the price of one of the summary's `sampled_reads_per_step`."""
    per_ms = 1e3 / (read_gbps * 1e9)  # ms per byte of one pass
    dense = float(summary.get("bytes_dense_per_step") or 0.0)
    compressed = max(0.0, dense - float(summary.get("bytes_allreduce_per_step") or 0.0))
    enc = 1 + memory_passes if compressed else 0
    sampled = float(summary.get("sampled_reads_per_step") or 0.0)
    compress_basis = f"{enc} pass(es) over {compressed / 1e6:.3g} MB"
    if sampled:
        compress_basis += f" + {sampled:,.0f} sampled reads at {sampled_read_ns:.2g} ns"
    opt = optimizer_passes(optim)
    wire = wire_ms(summary, world_size, pattern, link_gbps)
    mb_p = f"{dense / 1e6:.3g} MB"
    floors: dict[str, tuple[float | None, str]] = {
        "compute": (None, "the model's forward and backward"),
        "compress": (enc * compressed * per_ms + sampled * sampled_read_ns / 1e6, compress_basis),
        "comm_exposed": (wire, "no shaped link" if wire is None else f"wire time at {link_gbps:g} Gbit/s"),
        "decompress": _decompress_floor(summary, compressed, min(handed_over, compressed), world_size,
                                        per_ms),
        "optimizer": (None if opt is None else opt * dense * per_ms, f"{opt} passes over {mb_p}"),
        "other": (0.0, "nothing"),
    }
    out: dict[str, Any] = {}
    for phase in PHASES:
        ms = summary.get(f"{phase}_ms")
        floor, basis = floors[phase]
        times = None if ms is None or not floor else float(ms) / floor
        out[phase] = {"ms": ms, "floor_ms": floor, "x_floor": times, "basis": basis}
    return {"read_gbps": read_gbps, "sampled_read_ns": sampled_read_ns or None, "link_gbps": link_gbps,
            "phases": out}


def _decompress_floor(summary: Mapping[str, Any], compressed: float, handed: float, world_size: int,
                      per_ms: float) -> tuple[float, str]:
    dense = compressed - handed
    if not handed:
        return dense * per_ms, f"1 pass over {dense / 1e6:.3g} MB"
    sent = float(summary.get("bytes_sent_per_step") or 0.0)
    sent -= float(summary.get("bytes_allreduce_per_step") or 0.0)
    received = world_size * max(0.0, sent) * handed / compressed  # the handed-over tensors' share
    basis = f"1 pass over {dense / 1e6:.3g} MB + the {received / 1e6:.3g} MB received"
    return (dense + received) * per_ms, basis


def format_floors(floors: Mapping[str, Any]) -> list[str]:
    """The summary's lines: each phase, its floor and how many times the floor it takes."""
    link = f", link {floors['link_gbps']:g} Gbit/s" if floors.get("link_gbps") else ""
    sampled = f", sampled read {floors['sampled_read_ns']:.2g} ns" if floors.get("sampled_read_ns") else ""
    lines = [f"  vs floor     (this machine: read pass {floors['read_gbps']:.1f} GB/s{sampled}{link})"]
    for phase, row in floors["phases"].items():
        ms, floor, times = row["ms"], row["floor_ms"], row["x_floor"]
        shown = "-" if ms is None else f"{ms:.1f}"
        bound = "-" if floor is None else f"{floor:.1f}"
        ratio = f"{times:.1f}x" if times is not None else ""
        lines.append(f"    {LABELS.get(phase, phase):13s}{shown:>8s} ms  floor {bound:>6s} ms "
                     f"{ratio:>7s}  ({row['basis']})")
    return lines
