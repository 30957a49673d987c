"""Memory and encode in one pass (extensions/cpu/memory.cpp): `comm.base.encode` with a compressor
that fuses the memory (dgc, topk, dragonn) against its unfused twin, `compensate` then `compress`
then `update` (today's path), over several steps: the same payload bytes and the same memory state,
bit for bit, at 1 and 2 threads."""

from __future__ import annotations

import pytest
import torch

from compbench.comm.base import encode
from compbench.compressors.dgc import DGC
from compbench.compressors.dragonn import DRAGONN
from compbench.compressors.topk import TopK
from compbench.kernels import cpu
from compbench.memory.dgc import DGCMemory
from compbench.memory.residual import ResidualMemory
from compbench.records.stats import StepStats

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def _unfused(compressor, memory, g, name):
    y = memory.compensate(g, name)
    payload, ctx = compressor.compress(y, name)
    memory.update(y, name, compressor, payload, ctx)
    return payload


def _grad(shape, step):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(100 + step))
    g.view(-1)[5] = -0.0  # a negative zero: 0 + (-0) and fma keep their signs as torch's ops do
    return g


COMPRESSORS = {
    "dgc": lambda: DGC(ratio=1e-3),
    "topk": lambda: TopK(ratio=1e-3),
    "dragonn": lambda: DRAGONN(ratio=1e-3),
    "dgc_dense_sample": lambda: DGC(ratio=0.05, sample_ratio=1.0),
    "topk_small": lambda: TopK(ratio=0.01),
}
MEMORIES = {
    "dgc": lambda: DGCMemory(momentum=0.9),
    "dgc_nesterov_clipped": lambda: DGCMemory(momentum=0.9, nesterov=True, gradient_clipping=1.0,
                                              world_size=2),
    "residual": lambda: ResidualMemory(),
    "residual_decay": lambda: ResidualMemory(beta=0.9, gamma=0.7),
}


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("comp", sorted(COMPRESSORS))
@pytest.mark.parametrize("mem", sorted(MEMORIES))
@pytest.mark.parametrize("shape", [(300, 701), (1000,)])
def test_fused_encode_gives_the_unfused_bytes_and_state(comp, mem, shape, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused_c, fused_m = COMPRESSORS[comp](), MEMORIES[mem]()
        twin_c, twin_m = COMPRESSORS[comp](), MEMORIES[mem]()
        assert fused_c.caps.fuses_memory
        stats = StepStats()
        for step in range(4):
            for c in (fused_c, twin_c):
                c.begin_step(step, 0.0)
            g = _grad(shape, step)
            deferred = fused_m.defer(g, "w")
            assert (deferred is None) == (step == 0)  # the first step creates the state, unfused
            got, _ = encode(fused_c, fused_m, g.clone(), "w", stats)
            want = _unfused(twin_c, twin_m, g.clone(), "w")
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert a.dtype == b.dtype
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (step, comp)
            for key, d in fused_m.state_dict().items():
                for name, t in d.items():
                    w = twin_m.state_dict()[key][name]
                    assert torch.equal(t.view(torch.int32), w.view(torch.int32)), (step, key)
    finally:
        torch.set_num_threads(old)


@needs_kernels
def test_kernels_disabled_keep_the_unfused_path(monkeypatch):
    memory = DGCMemory()
    g = _grad((100, 100), 0)
    memory.compensate(g, "w")
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")
    assert memory.defer(g, "w") is None


@needs_kernels
@pytest.mark.parametrize("kind", [cpu.RESIDUAL, cpu.DGC, cpu.DGC_NESTEROV])
@pytest.mark.parametrize("n", [1, 63, 64, 1000, 70001])
def test_compensate_select_summary_and_table_match_the_kernels_on_the_result(kind, n):
    gen = torch.Generator().manual_seed(n)
    g, a, b = (torch.randn(n, generator=gen) for _ in range(3))
    if n > 100:
        g[7] = float("nan")  # NaN never passes and never wins a block maximum
    c0, c1, scale = (0.9, 0.7, 1.0) if kind == cpu.RESIDUAL else (0.9, 0.0, 0.37)
    b_in = torch.empty(0) if kind == cpu.RESIDUAL else b
    at = torch.arange(0, n, 3)
    peek = cpu.compensate_at(a, b_in, g, at, kind, c0, c1, scale)
    a2, b2 = a.clone(), b_in.clone()
    start, stride = n // 3, max(1, n // 17)
    samples = torch.empty(len(range(start, n, stride)))
    summary = cpu.compensate_select(a, b_in, g, kind, c0, c1, scale, samples=samples, sample_start=start,
                                    sample_stride=stride)
    result = a if kind == cpu.RESIDUAL else b_in
    assert torch.equal(peek.view(torch.int32), result[at].view(torch.int32))  # NaN bits too
    assert torch.equal(summary, cpu.block_absmax(result))
    assert torch.equal(samples.view(torch.int32), result[start::stride].view(torch.int32))
    table = cpu.compensate_select(a2, b2, g, kind, c0, c1, scale, 1.0, 97, 4242)
    assert torch.equal(table, cpu.dragonn_select(result, 1.0, 97, 4242))
