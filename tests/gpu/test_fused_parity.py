"""The fused CUDA kernels (memory.cu, optim.cu) on the GPU against the CPU kernels they mirror
(extensions/cpu/memory.cpp, optim.cpp: bit for bit the unfused torch paths, tests/unit/
test_fused_memory.py and test_fused_optimizer.py). Marker gpu: skipped without CUDA, CuPy or the
built CPU kernels. The host shim runs the same comparisons on the CPU (tests/unit/
test_fused_cuda_host.py); these check the real compiler (no contraction across __fmul_rn/__fadd_rn,
fmaf rounded once), atomics and launches, at a size where many blocks run."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from compbench.kernels import cpu, ops  # noqa: E402

DEV = torch.device("cuda")
needs_cpu_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


@needs_cpu_kernels
@pytest.mark.parametrize("n", [1, 1000, 3_000_001])
@pytest.mark.parametrize("kind,c0,c1,scale", [(cpu.RESIDUAL, 0.9, 0.7, 1.0), (cpu.DGC, 0.9, 0.0, 0.37),
                                              (cpu.DGC_NESTEROV, 0.9, 0.0, 1.0)])
def test_compensate_select_matches_the_cpu_kernel(n, kind, c0, c1, scale):
    gen = torch.Generator().manual_seed(n)
    g, a, b = (torch.randn(n, generator=gen) for _ in range(3))
    b_cpu = torch.empty(0) if kind == cpu.RESIDUAL else b.clone()
    a_cpu = a.clone()
    a_gpu, b_gpu, g_gpu = a.to(DEV), b.to(DEV), g.to(DEV)
    idx = torch.arange(0, n, 7)
    at = ops.compensate_at(a_gpu, b_gpu, g_gpu, idx.to(DEV), kind, c0, c1, scale)
    assert torch.equal(at.cpu(), cpu.compensate_at(a_cpu, b_cpu, g, idx, kind, c0, c1, scale))
    slots, seed = max(4, n // 250), 0x9747B28C
    table = ops.compensate_select(a_gpu, b_gpu, g_gpu, kind, c0, c1, scale, 1.5, slots, seed)
    want = cpu.compensate_select(a_cpu, b_cpu, g, kind, c0, c1, scale, 1.5, slots, seed)
    assert [i for i in table.cpu().tolist() if i >= 0] == want.tolist()  # the CPU sends the filled slots
    assert torch.equal(a_gpu.cpu(), a_cpu)
    if kind != cpu.RESIDUAL:
        assert torch.equal(b_gpu.cpu(), b_cpu)


@needs_cpu_kernels
@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("wd,m,nesterov,dgc", [(5e-4, 0.9, False, True), (5e-4, 0.9, True, True),
                                               (5e-4, 0.9, True, False), (0.0, 0.0, False, False)])
def test_sgd_step_matches_the_cpu_kernel(sparse, wd, m, nesterov, dgc):
    n = 3_000_001
    gen = torch.Generator().manual_seed(3)
    p, buf, grad = (torch.randn(n, generator=gen) for _ in range(3))
    idx = torch.randperm(n, generator=gen)[:3000].sort().values
    vals = torch.randn(3000, generator=gen)
    with_buf = bool(m) and (bool(wd) or not dgc)
    empty = torch.empty(0)
    # (dense gradient, indices, values): one of the two forms, the other empty
    update = (empty, idx, vals) if sparse else (grad, empty.long(), empty)
    p_gpu, buf_gpu = p.to(DEV), buf.to(DEV)
    for first in (True, False):
        ops.sgd_step(p_gpu, buf_gpu, *(t.to(DEV) for t in update), 0.1, wd, m, nesterov, first, dgc, 5)
        cpu.sgd_step(p, buf if with_buf else empty, *update, 0.1, wd, m, nesterov, first, dgc, 5)
    assert torch.equal(p_gpu.cpu(), p)
    if with_buf:
        assert torch.equal(buf_gpu.cpu(), buf)


@needs_cpu_kernels
@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("decoupled,wd,beta1", [(False, 0.0, 0.9), (False, 1e-2, 0.9), (True, 0.05, 0.9),
                                                (True, 0.05, 0.3)])
def test_adam_step_matches_the_cpu_kernel(sparse, decoupled, wd, beta1):
    n = 3_000_005
    gen = torch.Generator().manual_seed(4)
    p, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    m, v = torch.zeros(n), torch.zeros(n)
    idx = torch.randperm(n, generator=gen)[:3000].sort().values
    vals = torch.randn(3000, generator=gen)
    empty = torch.empty(0)
    update = (empty, idx, vals) if sparse else (grad, empty.long(), empty)
    p_gpu, m_gpu, v_gpu = p.to(DEV), m.to(DEV), v.to(DEV)
    for step in (1.0, 2.0, 3.0):
        ops.adam_step(p_gpu, m_gpu, v_gpu, *(t.to(DEV) for t in update), 1e-3, beta1, 0.999, 1e-8, wd, step,
                      decoupled, cpu.fused_sgd_tail(n))
        cpu.adam_step(p, m, v, *update, 1e-3, beta1, 0.999, 1e-8, wd, step, decoupled, cpu.fused_sgd_tail(n))
    for a, b in ((p_gpu, p), (m_gpu, m), (v_gpu, v)):
        assert torch.equal(a.cpu(), b)


@needs_cpu_kernels
@pytest.mark.parametrize("poison", [None, float("nan"), float("-inf")])
def test_compensate_select_sets_the_nonfinite_flag_of_the_raw_gradient(poison):
    n = 3_000_001
    gen = torch.Generator().manual_seed(4)
    g, a, b = (torch.randn(n, generator=gen) for _ in range(3))
    if poison is not None:
        g[n // 3] = poison
    flag, want_flag = torch.zeros(1, dtype=torch.int32, device=DEV), torch.zeros(1, dtype=torch.int32)
    ops.compensate_select(a.to(DEV), b.to(DEV), g.to(DEV), cpu.DGC, 0.9, 0.0, 1.0, 1.5, 97, 5, nonfinite=flag)
    cpu.compensate_select(a, b, g, cpu.DGC, 0.9, 0.0, 1.0, 1.5, 97, 5, nonfinite=want_flag)
    assert flag.item() == want_flag.item() == int(poison is not None)
