"""`scheduler=bucket`: the gradients in buckets of about `bucket_mb` megabytes, in back-propagation
order (DDP's buckets), each tensor compressed on its own (its shape, error-feedback memory and
selection rules kept: the arithmetic of `layerwise`), every bucket's payloads sent in one exchange:
one collective per stage of the communicator (comm=allgather: one allgather; ps: one all-to-all and
one all-gather; allreduce: one allreduce per payload dtype) instead of one or more per tensor. The
tensors the selection rules send dense go as one flat allreduce per bucket.

Fewer, larger messages: what a link's per-message cost asks for, and what matrix compressors (DeMo's
DCT top-k, PowerSGD over allgather) can have where `mergecomp`'s flat buffers would change their
arithmetic. A bucket is submitted from the backward hooks as soon as its last tensor is ready
(overlap as in `layerwise`). Until the first step has recorded the ready order, the buckets follow
the reverse registration order; then they are cut again along the recorded one (each tensor's state
is its own, so nothing moves).
"""

from __future__ import annotations

from torch import nn

from compbench.base.values import is_number
from compbench.schedulers import SchedulerTraits
from compbench.schedulers.layerwise import Layerwise
from compbench.seam.pipeline import GradientPipeline


class Bucket(Layerwise):
    name = "bucket"
    traits = SchedulerTraits(packs=True)
    packed = True

    def __init__(self, bucket_mb: float = 25.0, overlap: bool = True) -> None:
        if not is_number(bucket_mb) or not bucket_mb > 0:
            raise ValueError(f"scheduler.bucket_mb={bucket_mb} must be a number > 0 (megabytes of gradients "
                             "per bucket); pass e.g. scheduler.bucket_mb=25")
        super().__init__(overlap)
        self.bucket_bytes = float(bucket_mb) * 2**20

    def setup(self, model: nn.Module) -> None:
        super().setup(model)
        self.set_runs(self.buckets(self.order))

    def on_order_recorded(self, pipeline: GradientPipeline) -> None:
        self.set_runs(self.buckets(self.order))

    def buckets(self, order: list[int]) -> list[list[int]]:
        """`order` cut into runs of at most `bucket_mb` (a larger tensor is a bucket of its own)."""
        runs: list[list[int]] = [[]]
        size = 0.0
        for i in order:
            p = self.params[i][1]
            nbytes = p.numel() * p.element_size()
            if runs[-1] and size + nbytes > self.bucket_bytes:
                runs.append([])
                size = 0.0
            runs[-1].append(i)
            size += nbytes
        return runs

    def summary(self) -> dict:
        return {**super().summary(), "bucket_mb": self.bucket_bytes / 2**20,
                "bucket_tensors": [len(run) for run in self.runs]}
