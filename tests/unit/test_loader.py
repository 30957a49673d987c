"""Per-rank shards are disjoint, equal in length, and step for step match one rank's double batch."""

import torch
from torch.utils.data import TensorDataset

from compbench.data.loader import ShardedLoader, shard_indices


def test_shards_are_disjoint_and_equal():
    parts = [shard_indices(103, r, 4, seed=1, epoch=2, shuffle=True, drop_last=True) for r in range(4)]
    assert all(len(p) == 25 for p in parts)
    assert len(set(torch.cat(parts).tolist())) == 100


def test_two_ranks_batch_b_see_one_rank_batch_2b():
    ds = TensorDataset(torch.arange(64).float().unsqueeze(1), torch.arange(64))
    one = list(ShardedLoader(ds, 8, 0, 1, seed=3))
    r0, r1 = list(ShardedLoader(ds, 4, 0, 2, seed=3)), list(ShardedLoader(ds, 4, 1, 2, seed=3))
    assert len(one) == len(r0) == len(r1) == 8
    for (_, y), (_, a), (_, b) in zip(one, r0, r1, strict=True):
        assert sorted(y.tolist()) == sorted(a.tolist() + b.tolist())


def test_eval_loader_covers_every_sample_once():
    ds = TensorDataset(torch.zeros(10, 1), torch.arange(10))
    seen = [y for r in range(3) for _, y in ShardedLoader(ds, 2, r, 3, train=False)]
    assert sorted(torch.cat(seen).tolist()) == list(range(10))
