"""Goodput: the share of the workers' time that ends up as training in the model (results.json
`summary.goodput`), recorded for every synchronization mode.

Each worker sums, over the steps it trained, its compute seconds (the step's `compute` phase,
forward and backward, plus its `optimizer` phase: the work that trains the model) and its step
seconds (`time/step_ms`: the step's wall time); the sums are gathered at the end of training (one
collective). With W workers and the training loop's wall time T (rank 0's `train_time_s`,
evaluations and checkpoints included: a worker that waits at an evaluation for a slower one idles):

    goodput         = (Σ compute − discarded) / (W · T)
    discarded_share = discarded / (W · T)
    idle_share      = 1 − goodput − discarded_share    (waiting, communication, compression,
                                                        evaluation, checkpoints, the loop's own time)
    step_goodput    = (Σ compute − discarded) / Σ step  (the same, over the steps' time only)

`discarded`: the compute seconds of work that never entered the model, as the mode reports it in
its summary's `discarded_compute_s` (sync=quorum_diloco: late outer gradients beyond
max_staleness, and those still pending at the end). A lock-step mode discards nothing, so its
goodput is its compute over its compute and waiting. After Decoupled DiLoCo's goodput (Douillard et
al. 2026: the share of the chips' time that is useful training), measured here from the steps'
phase timings on each worker's clock.

Under engine.elastic the workers change and every recovery starts their processes again (TorchElastic)
or rebuilds their trainers (Horovod Elastic): a worker's own sums would hold only what it did since its
last start. There the figures come from rank 0's records, which survive every recovery truncated to
the commit the run went on from (so redone steps are not counted twice): the steps are lock-step
(every elastic mode exchanges at each round's end), so each step's compute is rank 0's times the
workers that trained it (`elastic/workers`), and W is the workers the run was given (`engine.np`): a
worker's time dead, rejoining, or redoing steps since the last commit is idle (`record_elastic`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from compbench.engines.base import Engine


class GoodputLedger:
    """One worker's sums of compute and step seconds over the steps it trained."""

    def __init__(self) -> None:
        self.compute_s = 0.0
        self.step_s = 0.0

    def add_step(self, ms: Mapping[str, float]) -> None:
        """A finished step's phase milliseconds (`StepStats.ms`, after `end_step`)."""
        self.compute_s += (ms["compute"] + ms["optimizer"]) / 1e3
        self.step_s += ms["step"] / 1e3

    def gather(self, engine: Engine) -> list[tuple[float, float]]:
        """Every worker's (compute seconds, step seconds), in rank order; a collective."""
        mine = torch.tensor([self.compute_s, self.step_s], dtype=torch.float64, device=engine.device)
        rows = engine.allgather([mine], "goodput")
        return [(float(r[0][0]), float(r[0][1])) for r in rows]


def record_elastic(history: Mapping[str, Sequence[float]], provisioned: int, wall_s: float) -> dict[str, Any]:
    """`summary.goodput` of an elastic run (see the module) from rank 0's records: per step,
    `time/compute_ms` + `time/optimizer_ms` and `time/step_ms`, each times `elastic/workers`, over
    `provisioned` workers; `per_worker` is None (no worker's own sums survive a recovery)."""
    workers = history.get("elastic/workers", [])
    phases = history.get("time/compute_ms", []), history.get("time/optimizer_ms", [])
    compute_ms = [c + o for c, o in zip(*phases, strict=True)]
    steps_ms = history.get("time/step_ms", [])
    if not len(workers) == len(compute_ms) == len(steps_ms):
        raise ValueError(f"elastic records out of step: {len(workers)} worker counts, "
                         f"{len(compute_ms)} compute and {len(steps_ms)} step times")
    compute = sum(w * c for w, c in zip(workers, compute_ms, strict=True)) / 1e3
    steps = sum(w * t for w, t in zip(workers, steps_ms, strict=True)) / 1e3
    return {**_shares(compute, steps, 0.0, provisioned, wall_s), "per_worker": None,
            "source": "rank 0's records x elastic/workers (engine.elastic)"}


def record(per_worker: Sequence[tuple[float, float]], wall_s: float,
           discarded_s: float = 0.0) -> dict[str, Any]:
    """results.json's `summary.goodput` (see the module); None figures where there is no time."""
    compute = sum(c for c, _ in per_worker)
    steps = sum(s for _, s in per_worker)
    return {**_shares(compute, steps, discarded_s, len(per_worker), wall_s),
            "per_worker": [{"compute_s": round(c, 3), "step_s": round(s, 3)} for c, s in per_worker]}


def _shares(compute: float, steps: float, discarded_s: float, workers: int, wall_s: float) -> dict[str, Any]:
    useful = compute - discarded_s
    total = workers * wall_s

    def share(x: float, of: float) -> float | None:
        return round(x / of, 4) if of > 0 else None

    goodput, discarded = share(useful, total), share(discarded_s, total)
    idle = None if goodput is None or discarded is None else round(1.0 - goodput - discarded, 4)
    return {"goodput": goodput, "idle_share": idle, "discarded_share": discarded,
            "step_goodput": share(useful, steps), "compute_s": round(compute, 3),
            "discarded_compute_s": round(discarded_s, 3), "wall_s": round(wall_s, 3), "workers": workers}
