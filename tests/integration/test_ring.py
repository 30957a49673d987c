"""comm=ring (CaSync-Ring) on real ranks of the torch engine: equal to allgather for none and fp16,
equal to a local replay of the ring's decode-add-re-encode chain for the sparsifiers, and error
feedback that loses nothing (N x result + every rank's residuals = the sum of the gradients).

Run as a script, this file is one rank of such a job (started by compbench's launcher)."""

import sys

import pytest
import torch

from compbench.comm.ring import RingComm
from compbench.launch.processes import run_processes

NUMEL = 1001  # not a multiple of the world size: uneven chunks
SHAPE = (7, 143)


@pytest.mark.dist
@pytest.mark.parametrize("engine,world", [("torch", 2), ("horovod", 2),
                                          pytest.param("torch", 3, marks=pytest.mark.slow)])  # 3: middle hop
def test_ring_ranks(engine, world):
    code, message = run_processes([sys.executable, __file__, engine], engine, world, threads=1)
    assert code == 0, message


def test_ring_refuses_compressors_that_cannot_re_encode():
    from compbench.compose import config

    for name, fix in (("signum", "comm=allgather"), ("powersgd", "comm=allreduce")):
        with pytest.raises(ValueError, match=fix):
            config.check(config.compose([f"compressor={name}", "comm=ring", "memory=none"]))


# ---- one rank -------------------------------------------------------------------------------------

def _inputs(world: int, step: int = 0) -> list[torch.Tensor]:
    """Every rank's gradient, known to every rank (seeded), so each can replay the ring locally."""
    return [torch.randn(NUMEL, generator=torch.Generator().manual_seed(100 * step + i)) * (i + 1)
            for i in range(world)]


def _replay(compressor, xs: list[torch.Tensor], name: str) -> torch.Tensor:
    """The ring's arithmetic in one process: chunk c starts at rank c and picks up every other rank's
    share, decoded and re-encoded at each hop; the result is the decoded final sum / N."""
    from compbench.comm.ps import shard_bounds

    n, out = len(xs), torch.empty(NUMEL)
    for c, (a, b) in enumerate(shard_bounds(NUMEL, n)):
        cname = f"{name}#ring{c}"
        payload, ctx = compressor.compress(xs[c][a:b].clone(), cname)
        for j in range(1, n):
            y = compressor.decompress(payload, ctx) + xs[(c + j) % n][a:b]
            payload, ctx = compressor.compress(y, cname)
        out[a:b] = compressor.decompress(payload, ctx)
    return out / n


def reduce_now(comm, x: torch.Tensor, name: str, memory) -> tuple[torch.Tensor, int]:
    """A communicator's averaged result for `x` and the bytes this rank sent for it."""
    before = comm.stats.bytes_sent
    return comm.reduce(x, name, memory).wait(), comm.stats.bytes_sent - before


def _rank_main() -> None:
    from compbench.catalog import registry
    from compbench.comm.allgather import AllgatherComm
    from compbench.comm.ps import shard_bounds
    from compbench.compressors import build_compressor
    from compbench.memory.none import NoMemory
    from compbench.memory.residual import ResidualMemory
    from compbench.records.stats import StepStats

    engine = registry.build(registry.option_config("engine", sys.argv[1]), drop=("np",))
    r, n = engine.rank, engine.size
    stats = StepStats()
    xs = _inputs(n)
    x, exact = xs[r], sum(xs) / n
    bounds = shard_bounds(NUMEL, n)

    def ring_of(compressor, memory=None, tensor=None, name="t"):
        ring = RingComm(engine, compressor, stats)
        return reduce_now(ring, (x if tensor is None else tensor).view(SHAPE), name, memory or NoMemory())

    def allgather_of(compressor):
        return AllgatherComm(engine, compressor, stats).reduce(x.clone(), "t", NoMemory()).wait()

    # none: the same average as allgather; the shape is kept; 2(N-1) chunks of 4 bytes per float sent.
    none = build_compressor("none")
    out, sent = ring_of(none)
    assert out.shape == SHAPE
    torch.testing.assert_close(out.view(-1), allgather_of(none), atol=1e-5, rtol=0)
    sent_chunks = [(r - s) % n for s in range(n - 1)] + [(r + 1 - s) % n for s in range(n - 1)]
    assert sent == sum(4 * (bounds[c][1] - bounds[c][0]) for c in sent_chunks), sent

    # fp16: allgather's average to fp16 precision (partial sums are rounded at each hop), and the
    # local replay of the ring exactly; half the bytes of none.
    fp16 = build_compressor("fp16")
    out16, sent16 = ring_of(fp16)
    scale = sum(t.abs().max() for t in xs).item()
    torch.testing.assert_close(out16.view(-1), allgather_of(fp16), atol=n * 2**-10 * scale, rtol=0)
    torch.testing.assert_close(out16.view(-1), _replay(fp16, xs, "t"), atol=1e-6, rtol=0)
    assert sent16 * 2 == sent

    # Sparsifiers: exactly the replayed re-encoding chain; never more than k per chunk in the result;
    # the re-encoding error is bounded by what top-k may drop; ratio 1 is exact.
    topk = build_compressor("topk", ratio=0.1)
    outk, _ = ring_of(topk)
    replayed = _replay(build_compressor("topk", ratio=0.1), xs, "t")
    torch.testing.assert_close(outk.view(-1), replayed, atol=1e-6, rtol=0)
    for a, b in bounds:
        assert int((outk.view(-1)[a:b] != 0).sum()) <= topk.k_for(b - a)
    err = (outk.view(-1) - exact).norm()
    assert 0 < err < exact.norm(), (err, exact.norm())
    out_all, _ = ring_of(build_compressor("topk", ratio=1.0))
    torch.testing.assert_close(out_all.view(-1), exact, atol=1e-5, rtol=0)
    randk = build_compressor("randk", ratio=0.2)
    outr, _ = ring_of(randk)
    replayed = _replay(build_compressor("randk", ratio=0.2), xs, "t")
    torch.testing.assert_close(outr.view(-1), replayed, atol=1e-6, rtol=0)

    # Error feedback loses nothing, for every compressor the ring accepts: after two steps,
    # N x (result 1 + result 2) + every rank's chunk residuals = the sum of all gradients.
    for name in registry.options("compressor"):
        if name in ("signum", "powersgd"):  # refused (tested without ranks)
            continue
        compressor, memory = build_compressor(name), ResidualMemory()
        if name == "tbq":  # keeps its own residual inside: memory=none is its pairing
            continue
        total, results = torch.zeros(NUMEL), torch.zeros(NUMEL)
        for step in range(2):
            compressor.begin_step(step, 0.0)
            xs_step = _inputs(n, step)
            out, _ = ring_of(compressor, memory, xs_step[r], name=name)
            results += out.view(-1)
            total += sum(xs_step)
        mine = torch.cat([memory.residuals[f"{name}#ring{c}"].reshape(-1) for c in range(n)])
        residuals = engine.allreduce(mine, f"res.{name}", average=False)
        torch.testing.assert_close(n * results + residuals, total, atol=1e-4, rtol=1e-5,
                                   msg=f"compressor={name}")

    engine.shutdown()
    print(f"rank {r}/{n}: ring ok", flush=True)


if __name__ == "__main__":
    _rank_main()
