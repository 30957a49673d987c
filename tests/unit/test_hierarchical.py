"""comm=hierarchical on 4 ranks in threads, as 2 nodes x 2 ranks or 1 node x 4: dense inside a node,
one compressed payload per node between nodes."""

import pytest
import torch

from compbench.comm.hierarchical import HierarchicalComm
from compbench.compressors import build_compressor
from compbench.memory.none import NoMemory
from compbench.records.stats import StepStats
from tests.threaded_engine import ThreadWorld

GRADS = [torch.randn(40, 10, generator=torch.Generator().manual_seed(r)) for r in range(4)]


def _reduce(local_size: int, compressor: str = "topk", intra_dtype: str = "fp32", **options):
    def rank(engine):
        stats = StepStats()
        comp = build_compressor(compressor, **options)
        comm = HierarchicalComm(engine, comp, stats, intra_dtype=intra_dtype)
        return comm.reduce(GRADS[engine.rank].clone(), "w", NoMemory()).wait(), stats.bytes_sent

    return ThreadWorld(4, local_size=local_size).run(rank)


def test_two_nodes_exchange_one_compressed_node_average_each():
    out = _reduce(local_size=2, ratio=0.1)
    comp = build_compressor("topk", ratio=0.1)
    node_means = [(GRADS[0] + GRADS[1]) / 2, (GRADS[2] + GRADS[3]) / 2]
    encoded = [comp.compress(m, "w") for m in node_means]
    expected = comp.decompress_all([p for p, _ in encoded], encoded[0][1]).view(10 * 4, 10)
    for result, _ in out:
        torch.testing.assert_close(result, expected.view_as(result), rtol=0, atol=1e-6)
    sent = [b for _, b in out]
    assert sent[0] == sent[2] > 0 and sent[1] == sent[3] == 0  # only leaders send between nodes
    assert sent[0] < GRADS[0].numel() * 4 / 2  # compressed: well under 4 dense bytes per element


def test_one_node_is_the_exact_local_average():
    with pytest.warns(UserWarning, match="comm=hierarchical on one node: compressor=signsgd is not used"):
        out = _reduce(local_size=4, compressor="signsgd")  # lossy, but nothing crosses between nodes
    exact = torch.stack(GRADS).mean(0)
    for result, sent in out:
        torch.testing.assert_close(result, exact, rtol=0, atol=1e-6)
        assert sent == 0


def test_fp16_inside_a_node_gives_every_rank_the_same_result():
    out = _reduce(local_size=2, compressor="none", intra_dtype="fp16")
    exact = torch.stack(GRADS).mean(0)
    assert all(torch.equal(out[0][0], r) for r, _ in out)
    torch.testing.assert_close(out[0][0], exact, rtol=0, atol=2e-3)


def test_ranks_of_a_node_must_be_consecutive():
    def rank(engine):
        engine.local_size = 3  # 4 ranks cannot be cut into nodes of 3
        engine.local_rank = engine.rank % 3
        HierarchicalComm(engine, build_compressor("none"), StepStats())

    with pytest.raises(ValueError, match="comm=hierarchical needs each node's ranks to be consecutive"):
        ThreadWorld(4).run(rank)


def test_intra_dtype_is_checked():
    with pytest.raises(ValueError, match="comm.intra_dtype=bf16 must be one of fp32, fp16"):
        HierarchicalComm.check_options(intra_dtype="bf16")
