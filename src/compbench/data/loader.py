"""Per-rank batches: every rank sees a disjoint shard, all ranks take the same number of steps."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import cast

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset


def shard_indices(n: int, rank: int, size: int, seed: int, epoch: int, shuffle: bool,
                  drop_last: bool) -> Tensor:
    """Rank r gets positions r, r+size, ... of one permutation shared by all ranks.

    With drop_last every rank gets exactly n // size samples (equal step counts: a rank with one
    more step would wait forever in a collective). So 2 ranks x batch b see, step for step, the
    same samples as 1 rank x batch 2b.
    """
    order = (torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000003 + epoch)) if shuffle
             else torch.arange(n))
    if drop_last:
        order = order[: n - n % size]
    return order[rank::size]


class ShardedLoader:
    """Batches of a dataset's shard. Tensor datasets are indexed directly (no worker processes)."""

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, size: int, seed: int = 0,
                 train: bool = True, num_workers: int = 0) -> None:
        self.dataset, self.batch_size, self.rank, self.size = dataset, batch_size, rank, size
        self.seed, self.train, self.num_workers = seed, train, num_workers
        self.epoch = 0

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
        if isinstance(self.dataset, TensorDataset):
            x, y = self.dataset.tensors
            for s in range(first, steps):
                b = idx[s * self.batch_size : (s + 1) * self.batch_size]
                yield x[b], y[b]
            return
        batches = [idx[s * self.batch_size : (s + 1) * self.batch_size].tolist() for s in range(first, steps)]
        yield from DataLoader(self.dataset, batch_sampler=batches, num_workers=self.num_workers)
