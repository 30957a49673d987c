"""Run as every rank of a 2-rank job: comm=ps against aggregates computed by hand; exits non-zero
on failure. Summable compressors (none, fp16, randk) are averaged exactly by the servers (no second
compression); a biased one (topk) goes through the server's decode, error feedback and re-encode."""

import sys

import torch

from compbench.catalog import registry
from compbench.comm.ps import PSComm, shard_bounds
from compbench.compressors import build_compressor
from compbench.memory.none import NoMemory
from compbench.records.stats import StepStats


def rank_tensor(r: int, n: int = 1001) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(r))


def expected_summable(name: str, world: int, step: int) -> torch.Tensor:
    """Shard by shard: the mean of every rank's decode of its own compressed shard."""
    numel = rank_tensor(0).numel()
    out = []
    for j, (a, b) in enumerate(shard_bounds(numel, world)):
        decoded = []
        for r in range(world):
            comp = build_compressor(name)
            comp.begin_step(step, 0.0)
            payload, ctx = comp.compress(rank_tensor(r)[a:b], f"w#ps{j}")
            decoded.append(comp.decompress(payload, ctx).float())
        out.append(torch.stack(decoded).mean(0))
    return torch.cat(out)


def reduce_now(comm, x: torch.Tensor, name: str, memory) -> tuple[torch.Tensor, int]:
    """A communicator's averaged result for `x` and the bytes this rank sent for it."""
    before = comm.stats.bytes_sent
    return comm.reduce(x, name, memory).wait(), comm.stats.bytes_sent - before


def main(engine_name: str) -> None:
    engine = registry.build(registry.option_config("engine", engine_name), drop=("np",))
    r, n = engine.rank, engine.size
    for name, tol in (("none", 1e-6), ("randk", 1e-6), ("fp16", 2e-3)):
        comp = build_compressor(name)
        comp.begin_step(3, 0.0)
        ps = PSComm(engine, comp, StepStats())
        assert ps.sums_payloads, name
        got, sent = reduce_now(ps, rank_tensor(r), "w", NoMemory())
        want = expected_summable(name, n, 3)
        err = (got.float() - want).abs().max().item()
        assert err <= tol * max(1.0, want.abs().max().item()), (name, err)
        assert sent > 0
    # a matrix is cut by rows: exact for none, and ATOMO still sees matrices (it sends 1-D dense)
    m = rank_tensor(r).narrow(0, 0, 64 * 12).view(64, 12)
    got, _ = reduce_now(PSComm(engine, build_compressor("none"), StepStats()), m, "m", NoMemory())
    want = torch.stack([rank_tensor(q).narrow(0, 0, 64 * 12).view(64, 12) for q in range(n)]).mean(0)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    atomo = PSComm(engine, build_compressor("atomo"), StepStats())
    _, sent = reduce_now(atomo, m, "m", NoMemory())
    assert sent < 4 * m.numel(), sent
    # unbiased (rescaled) compressors get no server error feedback: it is not contractive for them
    assert not atomo.server_feedback and not atomo.server_memory.state_dict().get("residuals")
    # signum: the server sends the vote's sign; where the ranks agree that is their common sign
    comp = build_compressor("signum")
    comp.begin_step(1, 0.0)
    got, _ = reduce_now(PSComm(engine, comp, StepStats()), rank_tensor(r), "s", NoMemory())
    signs = torch.stack([rank_tensor(q).sign() for q in range(n)])
    agree = (signs == signs[0]).all(0)
    assert set(got.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(got[agree], signs[0][agree]) and 0 < int((~agree).sum()) < got.numel()
    comp = build_compressor("topk", ratio=0.1)
    comp.begin_step(3, 0.0)
    ps = PSComm(engine, comp, StepStats())
    assert not ps.sums_payloads
    got, _ = reduce_now(ps, rank_tensor(r), "w", NoMemory())
    # each server keeps 10% of the averaged shard: at most 10% of the elements are non-zero
    assert got.shape == rank_tensor(r).shape and 0 < int((got != 0).sum()) <= 0.1 * got.numel() + n
    engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
