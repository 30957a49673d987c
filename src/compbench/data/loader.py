"""Per-rank batches: every rank sees a disjoint shard, all ranks take the same number of steps; on
the rank's device (compbench.engines.device): a tensor dataset of at most `RESIDENT_BYTES` is copied there
once and indexed there; a larger one, and a file-backed one through a DataLoader, is batched in
pinned host memory and copied without blocking the host."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import cast

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

# A tensor dataset up to this size lives on the GPU for the whole run (Fashion-MNIST: 188 MB, the
# text windows of Shakespeare: 80 MB): no copy per batch.
RESIDENT_BYTES = 2 << 30
_CPU = torch.device("cpu")


def shard_indices(n: int, rank: int, size: int, seed: int, epoch: int, shuffle: bool,
                  drop_last: bool) -> Tensor:
    """Rank r gets positions r, r+size, ... of one permutation shared by all ranks.

    With drop_last every rank gets exactly n // size samples (equal step counts: a rank with one
    more step would wait forever in a collective). So 2 ranks x batch b see, step for step, the
    same samples as 1 rank x batch 2b.
    """
    # Drawn on the host (the same order on every rank and device); the loader indexes where the data is.
    order = (torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000003 + epoch), device="cpu")
             if shuffle else torch.arange(n, device="cpu"))
    if drop_last:
        order = order[: n - n % size]
    return order[rank::size]


class ShardedLoader:
    """Batches of a dataset's shard. Tensor datasets are indexed directly (no worker processes)."""

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, size: int, seed: int = 0,
                 train: bool = True, num_workers: int = 0, device: torch.device = _CPU) -> None:
        self.dataset, self.batch_size, self.rank, self.size = dataset, batch_size, rank, size
        self.seed, self.train, self.num_workers, self.device = seed, train, num_workers, device
        self.epoch = 0
        self.tensors: tuple[Tensor, ...] | None = None  # a tensor dataset's, where they are indexed
        if isinstance(dataset, TensorDataset):
            tensors = dataset.tensors
            if device.type != "cpu" and sum(t.numel() * t.element_size() for t in tensors) <= RESIDENT_BYTES:
                tensors = tuple(t.to(device) for t in tensors)
            self.tensors = tensors

    def _indices(self) -> Tensor:
        n = len(cast(Sized, self.dataset))  # map-style: indexed, with a length
        return shard_indices(n, self.rank, self.size, self.seed, self.epoch,
                             shuffle=self.train, drop_last=self.train)

    def __len__(self) -> int:
        n = len(self._indices())
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.batches(0)

    def batches(self, first: int) -> Iterator[tuple[Tensor, Tensor]]:
        """The epoch's batches from index `first` on (resuming inside an epoch)."""
        idx = self._indices()
        steps = len(self)
        if self.tensors is not None:
            x, y = self.tensors
            idx = idx.to(x.device)  # the order is drawn on the host (the same on every rank and device)
            for s in range(first, steps):
                b = idx[s * self.batch_size : (s + 1) * self.batch_size]
                yield self._to_device(x[b]), self._to_device(y[b])
            return
        batches = [idx[s * self.batch_size : (s + 1) * self.batch_size].tolist() for s in range(first, steps)]
        pin = self.device.type == "cuda"
        loader = DataLoader(self.dataset, batch_sampler=batches, num_workers=self.num_workers, pin_memory=pin)
        for x, y in loader:
            yield self._to_device(x), self._to_device(y)

    def _to_device(self, t: Tensor) -> Tensor:
        """A batch on the rank's device: as it is where it was indexed there; from host memory
        pinned, without blocking (the copy overlaps the host's next launches)."""
        if t.device == self.device:
            return t
        return (t.pin_memory() if not t.is_pinned() else t).to(self.device, non_blocking=True)
