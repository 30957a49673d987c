"""comm=allreduce on 2 ranks in threads: compressor=none averages the gradient in place (the dense
path, no payload copy and no copy back); a cast compressor averages its payloads and decodes once."""

import torch

from compbench.comm.allreduce import AllreduceComm
from compbench.compressors import build_compressor
from compbench.memory.none import NoMemory
from compbench.records.stats import StepStats
from tests.threaded_engine import ThreadWorld

GRADS = [torch.randn(64, 33, generator=torch.Generator().manual_seed(r)) for r in range(2)]


def _reduce(compressor: str):
    def rank(engine):
        stats = StepStats()
        grad = GRADS[engine.rank].clone()
        comm = AllreduceComm(engine, build_compressor(compressor), stats)
        result = comm.reduce(grad, "w", NoMemory()).wait()
        return grad, result, stats.bytes_sent

    return ThreadWorld(2).run(rank)


def test_none_averages_the_gradient_in_place():
    mean = (GRADS[0] + GRADS[1]) / 2
    for grad, result, sent in _reduce("none"):
        assert result.data_ptr() == grad.data_ptr()  # the .grad itself: nothing to write back
        torch.testing.assert_close(result.view_as(mean), mean, rtol=0, atol=1e-6)
        assert sent == GRADS[0].numel() * 4


def test_fp16_averages_the_payloads_and_leaves_the_gradient():
    mean = (GRADS[0].half().float() + GRADS[1].half().float()) / 2
    for (grad, result, sent), original in zip(_reduce("fp16"), GRADS, strict=True):
        assert torch.equal(grad, original)
        torch.testing.assert_close(result.view_as(mean), mean, rtol=1e-3, atol=1e-3)
        assert sent == GRADS[0].numel() * 2
