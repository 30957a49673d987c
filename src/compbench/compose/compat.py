"""Which combinations work: every compressor x memory x comm x scheduler x engine x optimizer
question, answered in one place from the records the components declare (`Capabilities`,
`MemoryTraits`, `CommTraits`, `SchedulerTraits`, `SyncTraits`), at compose time, before anything is written.

A combination either does what its settings say or is refused with one line that names a valid
alternative. Recipes (a compressor's known-good memory and optimizer settings) are applied here too,
unless the user set the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from compbench.base.values import show
from compbench.codec.base import Capabilities
from compbench.comm.base import CommTraits, packs
from compbench.memory.base import MemoryTraits
from compbench.optim.schedule import SCHEDULE_KEYS
from compbench.schedulers import SchedulerTraits
from compbench.sync import SyncTraits

STEP = SyncTraits()  # sync=step, the default mode

# Optimizer keys of a recipe were tuned with plain SGD; other optimizers keep their own settings.
RECIPE_OPTIMIZER = "sgd"


def recipe(caps: Capabilities, comm_traits: CommTraits, optim: str,
           sync: SyncTraits = STEP) -> dict[str, Any]:
    """The compressor's recipe over a communicator with these traits, optimizer `optim` and
    synchronization mode `sync` (key -> value); the mode's own recipe (`SyncTraits.recipe`) comes
    first, in `config`."""
    out = dict(caps.recipe)
    if _runs_collective(caps, comm_traits):
        out["memory"] = "none"  # the collective keeps its own error feedback
    if not sync.pipeline:
        return {}  # the mode synchronizes by itself; the compressor is not used
    # Optimizer settings were tuned for per-step SGD on gradients, not for an optimizer a mode builds.
    if optim != RECIPE_OPTIMIZER or not sync.per_step or sync.optimizer_keys is not None:
        out = {k: v for k, v in out.items() if not k.startswith("optim.")}
    return out


def _runs_collective(caps: Capabilities, comm_traits: CommTraits) -> bool:
    return caps.collective and comm_traits.needs_summable


def check(choices: Mapping[str, str], caps: Capabilities, memory: MemoryTraits, comm: CommTraits,
          scheduler: SchedulerTraits, optim: Mapping[str, Any], sync: SyncTraits = STEP,
          optim_defaults: Mapping[str, Any] | None = None) -> None:
    """ValueError (one line, naming an alternative) unless the combination works as configured.

    `choices` are the options picked per group (compressor, memory, comm, scheduler, sync, engine,
    optim); `optim` the optimizer's settings, `optim_defaults` those of its config file."""
    c, m, k, s, e = (choices[g] for g in ("compressor", "memory", "comm", "scheduler", "engine"))
    y = choices.get("sync", "step")
    if e not in sync.engines:
        raise ValueError(f"sync={y} runs on {_either('engine', sync.engines)}, not engine={e}; "
                         f"add engine={sync.engines[0]}")
    if e not in comm.engines:
        raise ValueError(f"comm={k} runs on {_either('engine', comm.engines)}, not engine={e}; "
                         f"add engine={comm.engines[0]}")
    _check_sync_optimizer(y, sync, choices["optim"], optim, optim_defaults or {})
    if not sync.pipeline:
        _check_unused(f"sync={y} synchronizes by itself", "sync=step",
                      (("compressor", c, "none"), ("memory", m, "none"), ("comm", k, "allreduce"),
                       ("scheduler", s, "layerwise")))
        return
    check_comm(c, k, caps, comm)
    _check_memory(c, m, k, caps, memory, comm)
    if not sync.per_step:
        _check_rounds(y, m, s, memory)
        return
    _check_optimizer(c, m, caps, memory, choices["optim"], optim)
    _check_scheduler(c, m, k, s, caps, memory, comm, scheduler)


def _check_sync_optimizer(y: str, sync: SyncTraits, optim_name: str, optim: Mapping[str, Any],
                          defaults: Mapping[str, Any]) -> None:
    if sync.optimizers is not None and optim_name not in sync.optimizers:
        raise ValueError(f"sync={y} builds its own optimizer from {_either('optim', sync.optimizers)}'s "
                         f"settings, not optim={optim_name}'s; add optim={sync.optimizers[0]}")
    if sync.optimizer_keys is None:
        return
    taken = {*sync.optimizer_keys, *SCHEDULE_KEYS, "name"}
    for key, value in optim.items():
        if key not in taken and key in defaults and value != defaults[key]:
            raise ValueError(f"sync={y} takes only optim.{', optim.'.join(sync.optimizer_keys)} and the "
                             f"schedule from optim={optim_name}, so optim.{key}={show(value)} would not be "
                             f"used; drop optim.{key}")


def _check_rounds(y: str, m: str, s: str, memory: MemoryTraits) -> None:
    """A periodic mode sends the outer gradient once per round, tensor by tensor."""
    if s != "layerwise":
        raise ValueError(f"sync={y} sends the outer gradient once per round, tensor by tensor, so "
                         f"scheduler={s} would not be used; drop scheduler=")
    if memory.owns_momentum:
        raise ValueError(f"memory={m} applies SGD momentum to each step's gradient, which sync={y} does not "
                         "send; use memory=residual")


def _check_unused(who: str, instead: str, picked: Iterable[tuple[str, str, str]]) -> None:
    """Refuse group choices (group, picked, default) that `who` would not use."""
    unused = [f"{g}={v}" for g, v, default in picked if v != default]
    if unused:
        raise ValueError(f"{who}, so {' and '.join(unused)} would not be used; drop "
                         f"{unused[0].split('=')[0]}= (or use {instead})")


def check_comm(c: str, k: str, caps: Capabilities, comm: CommTraits) -> None:
    """Whether compressor `c` can travel over communicator `k` (also what `compbench plan` asks)."""
    if comm.needs_summable and not (caps.summable or caps.collective):
        raise ValueError(f"compressor={c} {caps.why_not_summable}; use comm=allgather or comm=ps")
    if comm.reencodes_sums and caps.collective:
        raise ValueError(f"compressor={c} runs its own allreduce protocol and cannot re-encode partial sums "
                         f"in comm={k}; use comm=allreduce")
    if comm.reencodes_sums and caps.combine != "mean":
        raise ValueError(f"compressor={c} combines ranks by {caps.combine}, so comm={k} cannot add partial "
                         "sums; use comm=allgather or comm=ps")


def _check_memory(c: str, m: str, k: str, caps: Capabilities, memory: MemoryTraits, comm: CommTraits) -> None:
    if m == "none":
        return
    if _runs_collective(caps, comm):
        raise ValueError(f"compressor={c} over comm={k} keeps its own error feedback, so memory={m} would "
                         "not be used; use memory=none (or comm=allgather with memory=residual)")
    for state, what in (("error_feedback", "its own error feedback"), ("momentum", "its own momentum")):
        if state in caps.owns:
            raise ValueError(f"compressor={c} keeps {what}; memory={m} would compensate what it already "
                             f"does; use memory=none")
    if caps.lossless:
        raise ValueError(f"compressor={c} is lossless: memory={m} would have nothing to keep; "
                         "use memory=none")
    if memory.needs_sparse and not caps.sparse:
        raise ValueError(f"memory={m} masks its momentum at the indices a sparsifier sent, and "
                         f"compressor={c} sends no indices; use memory=residual (or compressor=topk, dgc, "
                         "dragonn, graddrop)")


def _check_optimizer(c: str, m: str, caps: Capabilities, memory: MemoryTraits, optim_name: str,
                     optim: Mapping[str, Any]) -> None:
    owner = f"memory={m}" if memory.owns_momentum else f"compressor={c}" if "momentum" in caps.owns else None
    if owner is None:
        return
    if optim_name != RECIPE_OPTIMIZER:
        other = " (or memory=residual)" if memory.owns_momentum else ""
        raise ValueError(f"{owner} applies SGD momentum itself, which optim={optim_name} would not leave to "
                         f"it; use optim=sgd{other}")
    if "momentum" in caps.owns and float(optim.get("momentum", 0.0)) != 0.0:
        raise ValueError(f"{owner} applies momentum itself, so optim.momentum={optim['momentum']} would "
                         "apply it twice; pass optim.momentum=0")


def _check_scheduler(c: str, m: str, k: str, s: str, caps: Capabilities, memory: MemoryTraits,
                     comm: CommTraits, scheduler: SchedulerTraits) -> None:
    if scheduler.packs and not packs(comm, caps):
        if comm.packs:
            raise ValueError(f"scheduler={s} sends a bucket's tensors in one exchange, and compressor={c} "
                             f"runs its own allreduce protocol per tensor over comm={k}; use "
                             "scheduler=layerwise (or comm=allgather)")
        raise ValueError(f"scheduler={s} sends a bucket's tensors in one exchange, which comm={k} cannot "
                         "(it sends tensor by tensor); use scheduler=layerwise (or comm=allgather, ps or "
                         "allreduce)")
    if scheduler.comms is not None and k not in scheduler.comms:
        raise ValueError(f"scheduler={s} plans for {_either('comm', scheduler.comms)}, not comm={k}; "
                         f"add comm={scheduler.comms[0]}")
    if caps.min_dims >= 2 and (scheduler.fuses or scheduler.partitions):
        cut = "fuses gradients into flat buffers" if scheduler.fuses else "cuts them into flat partitions"
        raise ValueError(f"compressor={c} compresses matrices and scheduler={s} {cut}, which it would "
                         "send dense; use scheduler=layerwise")
    if memory.owns_momentum and not scheduler.momentum_memory:
        raise ValueError(f"scheduler={s} does not split the optimizer's momentum by its plan, which "
                         f"memory={m} needs; use memory=residual")


def _either(group: str, values: Iterable[str]) -> str:
    return " or ".join(f"{group}={v}" for v in values)
