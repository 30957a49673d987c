"""Encode cost of a whole model's gradients: layer by layer, fused into groups, or one flat buffer.

    python scripts/bench_fusion.py            # resnet50; dgc, dragonn, topk at 1e-3; signsgd
    python scripts/bench_fusion.py --model vgg16 --compressors dgc --groups 1,2,8

The gradients have the model's real shapes (161 tensors, 25.6M floats for resnet50), filled with
Gaussian noise. Each variant encodes all of them once per call, through the schedulers' own
grouping code (`schedulers/fusion.py`): as in training, a fused group's members' gradients are views
of its flat buffer (bound, then filled as back-propagation would), so a group is one compress call
on its buffer, nothing copied:
- layerwise: one compress call per tensor (`scheduler=layerwise`);
- groups=G: G groups balanced by bytes (`scheduler=mergecomp scheduler.groups=G`);
- flat: one compress call on a buffer that already holds all gradients (the floor fusion aims at).
Median of `--repeats` calls after a warm-up, 1 thread, side by side in one process; the table gives
each variant as a multiple of `flat`. Buffers are allocated as in training (THP_MEM_ALLOC_ENABLE=1,
as compbench's launcher sets for its workers: huge pages, so that random sampling is not a TLB miss
per sample); the script re-runs itself with it when it is not set.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time

import torch
from torch import nn

from compbench.catalog import registry
from compbench.compressors import build_compressor
from compbench.schedulers.fusion import balanced_cuts, build_groups, split


def model_parameters(model: str) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) in back-propagation order (reverse of definition) with Gaussian gradients."""
    from compbench.compose.config import compose
    from compbench.seam.build import build_model

    net = build_model(compose([f"model={model}", "dataset=synthetic", "dataset.num_classes=1000",
                               "dataset.image_size=224"]))
    gen = torch.Generator().manual_seed(0)
    params = [(n, p) for n, p in reversed(list(net.named_parameters())) if p.requires_grad]
    for _, p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1e-2
    return params


def bound_groups(params: list[tuple[str, nn.Parameter]], runs: list[list[int]],
                 grads: dict[str, torch.Tensor]) -> list:
    """Groups for `runs` with their members bound to the group buffers and holding `grads`."""
    groups = build_groups(params, runs, 1)
    for g in groups:
        g.bind()
        for name, p in g.members:
            p.grad.copy_(grads[name])  # what back-propagation accumulates into the bound view
    return groups


def timed(fn, repeats: int) -> float:
    fn()  # warm-up: buffers, scratch, page faults
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(name: str, ratio: float | None, params: list[tuple[str, nn.Parameter]], group_counts: list[int],
            repeats: int) -> dict[str, float]:
    kwargs = {"ratio": ratio} if ratio is not None else {}
    comp = build_compressor(name, **kwargs)
    comp.begin_step(1, 100.0)  # past any warm-up schedule
    order = list(range(len(params)))
    nbytes = [p.numel() * p.element_size() for _, p in params]
    out: dict[str, float] = {}
    grads = {n: p.grad.clone() for n, p in params}

    def encode(groups) -> None:
        for g in groups:
            for part in g.parts:
                comp.compress(part.gradient(), part.name)

    layerwise = bound_groups(params, [[i] for i in order], grads)
    out["layerwise"] = timed(lambda: encode(layerwise), repeats)
    for count in group_counts:
        groups = bound_groups(params, split(order, balanced_cuts(nbytes, count)), grads)
        out[f"groups={count}"] = timed(lambda groups=groups: encode(groups), repeats)
    flat = torch.cat([p.grad.reshape(-1) for _, p in params])
    out["flat"] = timed(lambda: comp.compress(flat, "flat"), repeats)
    return out


def main() -> None:
    if "THP_MEM_ALLOC_ENABLE" not in os.environ:  # torch reads it once, at start-up: start again
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "THP_MEM_ALLOC_ENABLE": "1"})
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--compressors", default="dgc,dragonn,topk,signsgd")
    ap.add_argument("--ratio", type=float, default=1e-3, help="for the compressors that have one")
    ap.add_argument("--groups", default="1,4", help="group counts to time")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)
    params = model_parameters(args.model)
    counts = [int(g) for g in args.groups.split(",") if g]
    numel = sum(p.numel() for _, p in params)
    print(f"{args.model}: {len(params)} tensors, {numel / 1e6:.1f}M floats; 1 thread, "
          f"median of {args.repeats}; THP_MEM_ALLOC_ENABLE={os.environ['THP_MEM_ALLOC_ENABLE']}; "
          f"load {os.getloadavg()[0]:.2f}\n")
    cols = ["layerwise", *[f"groups={c}" for c in counts], "flat"]
    print("| compressor | " + " | ".join(f"{c} ms" for c in cols) + " | " +
          " | ".join(f"{c} / flat" for c in cols[:-1]) + " |")
    print("|---" * (2 * len(cols)) + "|")
    for name in args.compressors.split(","):
        has_ratio = "ratio" in inspect.signature(registry.component_class("compressor", name)).parameters
        ms = measure(name, args.ratio if has_ratio else None, params, counts, args.repeats)
        label = f"{name} {args.ratio:g}" if has_ratio else name
        print(f"| {label} | " + " | ".join(f"{ms[c]:.1f}" for c in cols) + " | " +
              " | ".join(f"{ms[c] / ms['flat']:.2f}" for c in cols[:-1]) + " |", flush=True)


if __name__ == "__main__":
    main()
