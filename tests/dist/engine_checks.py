"""Run as every rank of a 2-rank job: checks each engine collective; exits non-zero on failure."""

import sys

import torch

from compbench.catalog import registry


def main(engine_name: str) -> None:
    engine = registry.build(registry.option_config("engine", engine_name), drop=("np",))
    r, n = engine.rank, engine.size
    assert n == 2, n
    # allreduce: sum and average, fp32 and fp16
    out = engine.allreduce(torch.full((5,), float(r + 1)), "ar", average=False)
    assert torch.equal(out, torch.full((5,), 3.0)), out
    out = engine.allreduce(torch.full((5,), float(r + 1)), "ar_avg")
    assert torch.equal(out, torch.full((5,), 1.5)), out
    out = engine.allreduce(torch.full((4,), float(r + 1), dtype=torch.float16), "ar16", average=False)
    assert out.dtype == torch.float16 and torch.equal(out.float(), torch.full((4,), 3.0)), out
    # uneven allgather of several tensors of several dtypes (rank r sends r*3+1 values, 2r+2 bytes)
    vals = torch.arange(3 * r + 1, dtype=torch.float32) + 100 * r
    idx = torch.arange(3 * r + 1, dtype=torch.int32) * (r + 1)
    code = torch.full((2 * r + 2,), 7 + r, dtype=torch.uint8)
    got = engine.allgather([vals, idx, code], "ag")
    for peer in range(n):
        v, i, c = got[peer]
        assert torch.equal(v, torch.arange(3 * peer + 1, dtype=torch.float32) + 100 * peer), (peer, v)
        assert torch.equal(i, torch.arange(3 * peer + 1, dtype=torch.int32) * (peer + 1)), (peer, i)
        assert torch.equal(c, torch.full((2 * peer + 2,), 7 + peer, dtype=torch.uint8)), (peer, c)
    # async handles in flight together
    h1 = engine.allreduce_async(torch.ones(3) * r, "a1", average=False)
    h2 = engine.allgather_async([torch.ones(r + 1)], "a2")
    assert torch.equal(h1.wait(), torch.ones(3)) and [len(p[0]) for p in h2.wait()] == [1, 2]
    # alltoall with uneven splits: rank r sends (1+r) elements to rank 0 and (2-r) to rank 1
    send = torch.arange(3, dtype=torch.float32) + 10 * r
    recv, splits = engine.alltoall(send, [1 + r, 2 - r], "a2a")
    if r == 0:
        expected = torch.tensor([0.0, 10.0, 11.0])
        assert splits == [1, 2], splits
    else:
        expected = torch.tensor([1.0, 2.0, 12.0])
        assert splits == [2, 1], splits
    assert torch.equal(recv, expected), (r, recv)
    # broadcast of a tensor and of an object
    t = torch.full((3,), float(r))
    engine.broadcast_(t, 1, "b")
    assert torch.equal(t, torch.ones(3)), t
    assert engine.broadcast_object({"dir": f"rank{r}"}, 0) == {"dir": "rank0"}
    engine.barrier()
    engine.shutdown()
    print(f"rank {r}: engine {engine_name} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
