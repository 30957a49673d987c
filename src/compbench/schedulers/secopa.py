"""`scheduler=secopa`: HiPress SeCoPa, selective compression and partitioning from a cost model.

Each gradient follows its line of the plan (`name,numel,y|n,K`, see `compbench plan`): `n` goes
dense (fp32 allreduce, no error feedback); `y` is compressed through the run's communicator
(comm=ps or comm=ring), split into K contiguous partitions of the flat gradient that are compressed
and sent separately as groups `NAME#p0 .. NAME#p{K-1}` (K = 1 sends the tensor itself).

`plan=FILE` reads a plan file; `plan=null` plans at the first step: the network lines come from
`gbps`/`latency_us` (the `net` group) or, when gbps is null, from a short probe of the engine that
every rank takes part in; rank 0 then times the compressor, plans, and broadcasts the plan, so that
every rank submits the same groups in the same order. A plan file is also read on rank 0 only and
broadcast (it must match the model: same names, same sizes); it is also parsed when the scheduler is
built, so that `compbench train` stops on a missing or malformed file before any output exists.

The communicators SeCoPa plans for block for the whole exchange, so groups are submitted after
back-propagation, in back-propagation order.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from compbench.comm.ps import shard_bounds
from compbench.schedulers import SchedulerTraits
from compbench.schedulers.fusion import land
from compbench.schedulers.secopa_cost import PlanLine, plan_gradients, read_plan, summarize
from compbench.schedulers.secopa_fit import PROBE_SIZES, fit_primitives, net_lines, probe_engine
from compbench.seam.pipeline import GradientPipeline


def topology_of(comm: Any) -> str:
    """`ps` or `ring` for the communicators SeCoPa's cost model describes; ValueError otherwise."""
    from compbench.comm.ps import PSComm
    from compbench.comm.ring import RingComm

    if isinstance(comm, PSComm):
        return "ps"
    if isinstance(comm, RingComm):
        return "ring"
    raise ValueError(f"scheduler=secopa plans for comm=ps or comm=ring, not {type(comm).__name__}; "
                     "add comm=ps")


class SeCoPa:
    """Follows a SeCoPa plan: dense, or compressed in K partitions, per gradient."""

    name = "secopa"
    # The optimizer's momentum split of memory=dgc does not follow the plan's partitions yet.
    traits = SchedulerTraits(partitions=True, plans=True, comms=("ps", "ring"), momentum_memory=False)

    def __init__(self, plan: str | None = None, gbps: float | None = None, latency_us: float = 25.0,
                 probe_sizes: list[int] | tuple[int, ...] = PROBE_SIZES, probe_reps: int = 5) -> None:
        self.plan_path = str(plan) if plan else None
        if self.plan_path is not None:
            read_plan(self.plan_path)  # a missing or malformed file stops `compbench train` before any output
        self.gbps, self.latency_us = _setting(gbps, None), float(_setting(latency_us, 25.0))
        if self.gbps is not None:
            net_lines(self.gbps, self.latency_us, 2)  # bad values stop `compbench train` before any output
        self.probe_sizes, self.probe_reps = tuple(int(s) for s in probe_sizes), int(probe_reps)
        self.lines: dict[str, PlanLine] | None = None
        self.info: dict[str, Any] = {}

    def setup(self, model: nn.Module) -> None:
        self.params = [(n, p) for n, p in reversed(list(model.named_parameters())) if p.requires_grad]

    overlapping = False  # ps and ring block for the whole exchange: everything goes after backward

    def before_backward(self, pipeline: GradientPipeline) -> None:
        pass  # ps and ring block for the whole exchange: nothing to overlap

    def synchronize(self, pipeline: GradientPipeline) -> None:
        if self.lines is None:
            self.lines = self._agree_on_plan(pipeline)
        targets: dict[str, tuple[torch.Tensor, int, int]] = {}
        for name, p in self.params:
            if p.grad is None:  # unused this step: every rank still sends it (same collectives everywhere)
                p.grad = torch.zeros_like(p)
            elif not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()  # partitions are views of the flat gradient
            line = self.lines[name]
            if not line.compress:
                pipeline.submit(name, p.grad, dense=True)
                targets[name] = (p.grad, 0, p.numel())
            elif line.k == 1:
                # `fused`: the plan already applied the per-tensor rules (min_dims); only the warm-up applies.
                pipeline.submit(name, p.grad, fused=True)
                targets[name] = (p.grad, 0, p.numel())
            else:
                flat = p.grad.view(-1)
                for i, (a, b) in enumerate(shard_bounds(flat.numel(), line.k)):
                    pipeline.submit(f"{name}#p{i}", flat[a:b], fused=True)
                    targets[f"{name}#p{i}"] = (p.grad, a, b)
        collected = pipeline.collect()
        with pipeline.stats.time("write_back"):  # the averages into .grad: a part of the step's `other`
            for group, averaged in collected:
                grad, a, b = targets[group]
                land(grad.view(-1)[a:b], averaged.reshape(-1))

    def summary(self) -> dict:
        lines = list((self.lines or {}).values())
        chosen = [ln for ln in lines if ln.compress]
        partitions: dict[int, int] = {}
        for ln in chosen:
            partitions[ln.k] = partitions.get(ln.k, 0) + 1
        return {"name": self.name, "plan": self.plan_path or "planned at startup", **self.info,
                "gradients": len(lines), "compressed": len(chosen),
                "groups": sum(ln.k if ln.compress else 1 for ln in lines), "partitions": partitions,
                "lines": [f"{ln.name},{ln.numel},{'y' if ln.compress else 'n'},{ln.k}" for ln in lines]}

    def state_dict(self) -> dict:
        """The plan in force (None before the first step), so that a resumed run keeps it instead of
        planning again (a plan made at startup depends on timings). Plain data: each line a dict."""
        lines = None if self.lines is None else [asdict(ln) for ln in self.lines.values()]
        return {"lines": lines, "info": json.loads(json.dumps(self.info))}

    def load_state_dict(self, state: dict) -> None:
        if state["lines"] is None:
            return  # saved before the first step: plan then, as a new run would
        self.lines = {d["name"]: PlanLine(str(d["name"]), int(d["numel"]), bool(d["compress"]), int(d["k"]))
                      for d in state["lines"]}
        self.info = state["info"]

    # -- the plan, the same on every rank -------------------------------------------------------

    def _agree_on_plan(self, pipeline: GradientPipeline) -> dict[str, PlanLine]:
        engine = pipeline.engine
        topology = topology_of(pipeline.comm)
        sel = pipeline.selection
        grads = [(n, p.numel(), sel.compresses(p, sel.dense_steps)) for n, p in reversed(self.params)]
        # Collective, every rank: the engine probe when the network is to be measured.
        net = None
        if self.plan_path is None and self.gbps is None and engine.size > 1:
            net = probe_engine(engine)
        result: Any = None
        if engine.rank == 0:
            try:
                if self.plan_path is not None:
                    result = ("ok", self._read(grads, topology, pipeline.compressor, engine.size), {})
                else:
                    result = ("ok", *self._plan(grads, topology, pipeline, net))
            except ValueError as e:  # every rank must learn of it, not wait for the plan forever
                result = ("user error", str(e), None)
            except Exception as e:  # noqa: BLE001
                why = f"{type(e).__name__}: {e}"
                result = ("crash", f"scheduler=secopa: planning failed on rank 0: {why}", None)
        status, lines, info = engine.broadcast_object(result, 0)
        if status != "ok":
            raise (ValueError if status == "user error" else RuntimeError)(lines)
        self.info = info
        return {ln.name: ln for ln in lines}

    def _read(self, grads: list[tuple[str, int, bool]], topology: str, compressor: Any,
              world: int) -> list[PlanLine]:
        path = Path(cast(str, self.plan_path))  # only called with a plan file
        plan = read_plan(path)
        names = {n for n, _, _ in grads}
        for name, numel, _ in grads:
            line = plan.get(name)
            if line is None:
                raise ValueError(f"plan {path} has no line for {name}; write a plan for this model with "
                                 "`compbench plan`")
            if line.numel != numel:
                raise ValueError(f"plan {path} says {name} has {line.numel} elements, the model has {numel}; "
                                 "write a plan for this model with `compbench plan`")
        extra = sorted(set(plan) - names)
        if extra:
            raise ValueError(f"plan {path} names {extra[0]}, which this model does not have; "
                             "write a plan for this model")
        _warn_if_other_setting(path, topology, compressor.name, world)
        return [plan[n] for n, _, _ in grads]

    def _plan(self, grads: list[tuple[str, int, bool]], topology: str, pipeline: GradientPipeline,
              net: Any) -> tuple[list[PlanLine], dict[str, Any]]:
        world = pipeline.engine.size
        prims, rho, details = fit_primitives(pipeline.compressor, world, self.gbps, self.latency_us, net=net,
                                             sizes=self.probe_sizes, reps=self.probe_reps,
                                             device=pipeline.engine.device)  # the training's
        decisions = plan_gradients(grads, world, topology, prims, rho, pipeline.selection.compress_threshold)
        s: dict[str, Any] = summarize(decisions)
        info = {"topology": topology, "network": details["network"], "lines_s": details["lines"],
                "predicted_ms": {"plan": s["plan_s"] * 1e3, "all_dense": s["all_dense_s"] * 1e3,
                                 "all_compressed": s["all_compressed_s"] * 1e3}}
        return [PlanLine(d.name, d.numel, d.compress, d.k) for d in decisions], info


def _setting(value: Any, default: Any) -> Any:
    """The `net` interpolations stay unresolved when the scheduler is built from its yaml alone
    (`wrap_compress_optimizer`): then the setting was not given."""
    return default if isinstance(value, str) and value.startswith("${") else value


def _warn_if_other_setting(path: Path, topology: str, compressor: str, world: int) -> None:
    """`compbench plan` writes PLAN.json beside the plan: warn when it was made for another setting."""
    sidecar = path.with_suffix(".json")
    if not sidecar.is_file():
        return
    try:
        made = json.loads(sidecar.read_text())
        planned = (made["topology"], made["choices"]["compressor"], made["world"])
    except (ValueError, KeyError, TypeError):
        return
    if planned != (topology, compressor, world):
        warnings.warn(f"plan {path} was made for comm={planned[0]} compressor={planned[1]} {planned[2]} "
                      f"workers; this run has comm={topology} compressor={compressor} {world} workers",
                      stacklevel=2)
