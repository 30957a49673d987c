"""`compbench plan [overrides]`: a SeCoPa compression plan for a model, written in HiPress's format.

    compbench plan model=vgg16 engine.np=4 comm=ps net.gbps=1
    compbench train model=vgg16 engine.np=4 comm=ps scheduler=secopa scheduler.plan=PLAN.csv

Runs without workers: the model is built on the meta device (names and sizes only), the compressor
is timed here, and the network comes from `net.gbps`/`net.latency_us` or, when `net.gbps` is null
and engine.np > 1, from a short probe of the engine with engine.np local ranks.
Writes PLAN.csv (`name,numel,y|n,K` per gradient) and PLAN.json (fitted lines, costs, settings).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, open_dict
from torch import nn

from compbench.base.leftovers import scratch_dir
from compbench.base.values import require_int
from compbench.catalog import registry
from compbench.codec.base import check_ratio
from compbench.compose.checks import check_writable_file, is_json_with
from compbench.schedulers.secopa_cost import TOPOLOGIES, Decision, plan_gradients, summarize, write_plan
from compbench.schedulers.secopa_fit import fit_primitives, lines_from_json


def main(overrides: list[str]) -> int:
    from compbench.compose import config
    from compbench.seam.build import build_compressor_and_selection

    if {"-h", "--help"} & set(overrides):
        print(__doc__.strip())
        return 0
    cfg = config.compose(overrides, config_name="plan")
    _apply_ratio(cfg)
    picked = cfg.choices
    topology = picked["comm"]
    if topology not in TOPOLOGIES:
        raise ValueError(f"compbench plan models comm=ps or comm=ring, not comm={topology}; add comm=ps")
    world = cfg.engine.get("np", 1)
    require_int("engine.np", world, 1, "the number of workers to plan for")
    default = f"{picked['model']}-{picked['compressor']}-{topology}-np{world}.csv"
    path = Path(cfg.output) if cfg.output else Path(cfg.outputs_root) / "plans" / default
    sidecar = path.with_suffix(".json")
    # Before the probe and the fit, not after. The CSV is ours when its sidecar is (a plan written
    # by hand has none).
    for file in (path, sidecar):
        check_writable_file("output", file, ours=lambda _: _is_sidecar(sidecar),
                            what="a plan compbench wrote")
    compressor, selection = build_compressor_and_selection(cfg)
    from compbench.compose import compat

    compat.check_comm(picked["compressor"], topology, compressor.caps,
                      registry.declared("comm", topology))
    gbps, latency_us = cfg.net.get("gbps"), cfg.net.get("latency_us", 0.0)
    net = None
    if gbps is None and world > 1:
        net = _probe_engine(cfg, world)
        if net is None:
            return 1
    # Time encode/decode with the threads one of `world` workers on this machine would get
    # (also keeps OpenMP from stalling on an oversubscribed machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(int(cfg.threads or max(1, (os.cpu_count() or 1) // world)))
    try:
        prims, rho, details = fit_primitives(compressor, world, gbps, latency_us, net=net,
                                             sizes=tuple(cfg.probe_sizes), reps=cfg.probe_reps)
    finally:
        torch.set_num_threads(threads)
    model = _model_on_meta(cfg)
    grads = [(n, p.numel(), selection.compresses(p, selection.dense_steps))
             for n, p in model.named_parameters() if p.requires_grad]
    decisions = plan_gradients(grads, world, topology, prims, rho, selection.compress_threshold)

    write_plan(path, decisions)
    summary = summarize(decisions)
    sidecar.write_text(json.dumps({
        "choices": dict(picked), "world": world, "topology": topology,
        "compressor": registry.plain(cfg.compressor), "net": registry.plain(cfg.net), **details,
        "summary": summary, "gradients": [_decision_json(d) for d in decisions]}, indent=1, default=str))
    _print_summary(cfg, path, sidecar, world, details["network"], summary, overrides)
    return 0


def _is_sidecar(path: Path) -> bool:
    """A PLAN.json `main` wrote."""
    return is_json_with(path, {"choices", "world", "topology", "summary", "gradients"})


def _apply_ratio(cfg: DictConfig) -> None:
    """The `ratio=` shorthand, as for `compbench train`."""
    with open_dict(cfg):
        if cfg.get("ratio") is not None:
            check_ratio(cfg.ratio, "ratio")
            if "ratio" not in cfg.compressor:
                raise ValueError(f"ratio={cfg.ratio}: compressor={cfg.choices['compressor']} has no ratio; "
                                 "drop it")
            cfg.compressor.ratio = float(cfg.ratio)


def _model_on_meta(cfg: DictConfig) -> nn.Module:
    """Names and sizes are all a plan needs: build on the meta device (no memory, no init time);
    models whose constructor reads tensor values (timm's drop-path schedules) are built on the CPU."""
    node = registry.plain(cfg.model)
    if "pretrained" in node:
        node["pretrained"] = None
    try:
        with torch.device("meta"):
            return registry.build(node)
    except (NotImplementedError, RuntimeError):
        return registry.build(node)


def _probe_engine(cfg: DictConfig, world: int) -> dict[str, Any] | None:
    from compbench.launch.processes import run_processes

    with scratch_dir("compbench-plan-") as tmp:
        out = Path(tmp) / "net.json"
        engine = json.dumps(registry.plain(cfg.engine))
        argv = [sys.executable, "-m", "compbench.plan.probe", str(out), engine]
        print(f"compbench: probing engine={cfg.choices['engine']} with {world} local ranks "
              "(pass net.gbps=G net.latency_us=L to plan for another network)", flush=True)
        code, message = run_processes(argv, cfg.choices["engine"], world)
        if code != 0 or not out.is_file():
            print(f"error: the engine probe failed ({message or 'no output'}); "
                  "pass net.gbps=G to plan without it", file=sys.stderr)
            return None
        return lines_from_json(json.loads(out.read_text())["lines"])


def _decision_json(d: Decision) -> dict[str, Any]:
    finite = (lambda v: v if math.isfinite(v) else None)
    return {"name": d.name, "numel": d.numel, "compress": d.compress, "k": d.k, "dense_s": d.dense_s,
            "k_dense": d.k_dense, "compressed_s": finite(d.compressed_s), "k_compressed": d.k_compressed}


def _print_summary(cfg: DictConfig, path: Path, sidecar: Path, world: int, network: str, s: dict[str, Any],
                   overrides: list[str]) -> None:
    c = cfg.choices
    parts = ", ".join(f"K={k} x {v}" for k, v in s["partitions"].items()) or "none"
    print(f"compbench: SeCoPa plan for model={c['model']} compressor={c['compressor']} comm={c['comm']} "
          f"over {world} worker(s) ({network})")
    print(f"  {s['gradients']} gradients: {s['compressed']} compressed "
          f"({s['numel_compressed'] / 1e6:.2f}M of {s['numel'] / 1e6:.2f}M floats), "
          f"{s['gradients'] - s['compressed']} dense; compressed partitions: {parts}")
    print(f"  predicted sync per step: plan {s['plan_s'] * 1e3:.2f} ms, "
          f"all dense {s['all_dense_s'] * 1e3:.2f} ms, all compressed {s['all_compressed_s'] * 1e3:.2f} ms")
    print(f"  wrote {path} (details: {sidecar})")
    # The plan holds for this model, compressor, topology and world size: say so in the command.
    named = ("model", "compressor", "comm", "engine", "engine.np", "output", "outputs_root", "probe_sizes",
             "probe_reps", "threads")
    keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides]
    rest = [o for o, k in zip(overrides, keys, strict=True) if k not in named and k.split(".")[0] != "net"]
    engine = "torch" if c["comm"] == "ring" else c["engine"]  # the ring needs point-to-point sends
    print(f"  train with: compbench train model={c['model']} compressor={c['compressor']} comm={c['comm']} "
          f"engine={engine} engine.np={world} {' '.join([*rest, 'scheduler=secopa'])} "
          f"scheduler.plan={path}")


if __name__ == "__main__":
    from compbench.base.errors import report_user_error

    with report_user_error():
        sys.exit(main(sys.argv[1:]))
