"""Replica diagnostics, for synchronization modes whose workers' parameters differ between exchanges
(`SyncTraits.replicas_diverge`: DiLoCo's rounds, NoLoCo's groups, SPARTA's partial averaging).

At each evaluation: the distance between the replicas, the mean over workers of
||θ_r − θ̄|| / ||θ̄|| (θ̄ the workers' average of the trainable parameters, all tensors as one
vector), and the validation metrics of θ̄ itself next to the local ones (each worker evaluates its
own shard with its own parameters for `eval/loss`). θ̄ is put into the model for that evaluation
only and the local parameters restored exactly (copies, not arithmetic), so training and a resume
are unchanged. The cost: one allreduce of the parameters and one more evaluation, at evaluations only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from compbench.engines.base import Engine, flat_average

DISTANCE = "replica/distance"
AVERAGED = "_averaged"  # eval/loss -> eval/loss_averaged
AVERAGED_TAGS = ("eval/loss", "eval/acc1", "eval/ppl")  # the averaged model's metrics that are recorded


@torch.no_grad()
def diagnose(model: nn.Module, engine: Engine, evaluate: Callable[[], dict[str, float]],
             shard: Engine | None = None) -> dict[str, float]:
    """`replica/distance` and the averaged parameters' metrics (`evaluate()` run on them).

    A sharded run (compbench.sync.sharded) passes its shard view as `model`, the replica group's
    engine as `engine` (the workers that hold the same shard) and the shard group's as `shard`: a
    replica's squared distance and norm are the sums over its shards."""
    params = [p for p in model.parameters() if p.requires_grad]
    local = [p.detach().clone() for p in params]
    mean = flat_average(engine, "replicas", local).wait()
    spread_sq = torch.stack([(p - m).float().pow(2).sum() for p, m in zip(local, mean, strict=True)]).sum()
    squares = torch.stack([spread_sq, torch.stack([m.float().pow(2).sum() for m in mean]).sum()])
    if shard is not None:
        squares = shard.allreduce(squares, "replicas.shards", average=False)
    spread, norm = squares.sqrt()
    ratio: Tensor = spread / norm if norm > 0 else spread
    distance = float(engine.allreduce(ratio.reshape(1), "replicas.distance")[0])
    try:
        for p, m in zip(params, mean, strict=True):
            p.copy_(m)
        metrics = evaluate()
    finally:
        for p, saved in zip(params, local, strict=True):
            p.copy_(saved)
    out = {f"{tag}{AVERAGED}": metrics[tag] for tag in AVERAGED_TAGS if tag in metrics}
    return {**out, DISTANCE: distance}
