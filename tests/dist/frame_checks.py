"""Run as every rank of a 2-rank job: `allgather_payload_async` moves each exchange in one collective
and reports the bytes really sent; exits non-zero on failure."""

import sys

import torch

from compbench.catalog import registry
from compbench.engines import wire


def payload_of(rank: int, m: int) -> list[torch.Tensor]:
    """Uneven parts of several dtypes, one at an odd byte offset, and a 1-element float64 scalar."""
    return [torch.full((2 * rank + 3,), 7 + rank, dtype=torch.uint8),
            torch.arange(m, dtype=torch.float32) + 100 * rank,
            torch.arange(m, dtype=torch.int32) * (rank + 1),
            torch.tensor([float(rank)], dtype=torch.float64)]


def count_header_reads() -> list[int]:
    """Counts the torch engine's host reads of frame headers (`wire.read_headers` calls)."""
    calls = [0]
    read = wire.read_headers

    def counted(frames: torch.Tensor, like: list[torch.Tensor]) -> list[list[int]]:
        calls[0] += 1
        return read(frames, like)

    wire.read_headers = counted
    return calls


def main(engine_name: str) -> None:
    engine = registry.build(registry.option_config("engine", engine_name), drop=("np",))
    reads = count_header_reads()
    r, n = engine.rank, engine.size
    bound = 80000
    # the torch engine's capacity: the bound first, then the longest frame + max(1/8, 4 KiB) and
    # shrinking by 1/16 a call (4224, 4800, 4500) until 4200 outgrows it (a second
    # all_gather); then that frame + 1/8
    for step, base in enumerate([5, 40, 3, 4200, 4200]):
        mine = payload_of(r, base * (r + 1))
        before = reads[0]
        got, sent = engine.allgather_payload_async(mine, "x", bound).wait()
        if engine_name == "torch":  # every rank's header in one host read, the long frames' too
            assert reads[0] - before == 1, (step, reads[0] - before)
        for peer in range(n):
            for a, b in zip(got[peer], payload_of(peer, base * (peer + 1)), strict=True):
                assert a.dtype == b.dtype and torch.equal(a, b), (step, peer, a, b)
        nbytes = sum(t.numel() * t.element_size() for t in mine)
        frames = [sum(t.numel() * t.element_size() for t in payload_of(p, base * (p + 1))) + 16
                  for p in range(n)]
        if engine_name == "horovod":
            assert sent == nbytes + 16, (step, sent, nbytes)  # the frame: payload + one int32 per tensor
        else:
            assert max(frames) <= sent <= 16 + bound, (step, sent, frames)  # padded to a shared capacity
        if engine_name == "torch" and step == 3:
            assert sent == max(frames), (sent, frames)  # the capacity, then the rest of the longest
        if engine_name == "torch" and step == 4:
            assert sent == -(-(max(frames) + max(frames) // 8) // 64) * 64, (sent, frames)
    # the same layout on every rank: no header, several tensors or one (a matrix)
    a, b = torch.full((6,), float(r)), torch.full((3,), r, dtype=torch.uint8)
    before = reads[0]
    got, sent = engine.allgather_payload_async([b, a], "y", None).wait()
    assert reads[0] == before  # no header: nothing read on the host
    assert sent == 27 and all(torch.equal(got[p][1], torch.full((6,), float(p))) for p in range(n))
    assert all(torch.equal(got[p][0], torch.full((3,), p, dtype=torch.uint8)) for p in range(n))
    got, sent = engine.allgather_payload_async([a.view(2, 3)], "z", None).wait()
    assert sent == 24 and all(torch.equal(got[p][0], torch.full((2, 3), float(p))) for p in range(n))
    engine.barrier()
    engine.shutdown()
    print(f"rank {r}: frames on {engine_name} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
