"""The fused CUDA kernels (extensions/cuda/memory.cu, optim.cu), compiled for the host with the
shim of test_kernel_logic_host.py and run as a small grid of sequential "threads", against the CPU
kernels they mirror (extensions/cpu/memory.cpp, optim.cpp; themselves bit for bit the unfused torch
paths): the same state bytes, tables and parameters. Skipped without g++ or the CPU kernels."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from ctypes import c_float, c_int, c_longlong, c_uint, c_void_p

import pytest
import torch

from compbench.kernels import cpu, loader, twins
from tests.unit.test_kernel_logic_host import BLOCK, GRID, SHIM

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())

SIGNATURES = {
    "compensate_select": [c_void_p, c_void_p, c_void_p, c_longlong, c_int, c_float, c_float, c_float, c_int,
                          c_int, c_float, c_uint, c_void_p, c_uint, c_void_p, c_int],
    "compensate_at": [c_void_p, c_void_p, c_void_p, c_void_p, c_longlong, c_int, c_float, c_float, c_float,
                      c_int, c_int, c_void_p],
    "sgd_step": [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_longlong, c_longlong, c_int, c_float,
                 c_float, c_float, c_int, c_int, c_int, c_int, c_longlong],
    "sgd_sparse": [c_void_p, c_void_p, c_void_p, c_longlong, c_float],
    "adam_step": [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_longlong, c_longlong, c_int,
                  *[c_float] * 8, c_int, c_int, c_int, c_longlong],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    tmp = tmp_path_factory.mktemp("fused_kernels")
    (tmp / "shim.h").write_text(SHIM)
    unit = tmp / "fused.cpp"
    sources = (loader.source_dir() / name for name in ("memory.cu", "optim.cu"))
    unit.write_text("".join(f'#include "{path}"\n' for path in sources))
    lib_path = tmp / "fused.so"
    cmd = ["g++", "-std=c++14", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-include",
           str(tmp / "shim.h"), f"-I{loader.source_dir()}", str(unit), "-o", str(lib_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lib = ctypes.CDLL(str(lib_path))
    lib.cb_set_launch.argtypes = [c_uint] * 4

    def call(name: str, *args) -> None:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = SIGNATURES[name], None
        conv = [a.numpy().ctypes.data_as(c_void_p) if isinstance(a, torch.Tensor) else a for a in args]
        for b in range(GRID):
            for t in range(BLOCK):
                lib.cb_set_launch(GRID, BLOCK, b, t)
                fn(*conv)

    return call


def _data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    g, a, b = (torch.randn(n, generator=gen) for _ in range(3))
    g[0], g[-1] = -0.0, float("nan") if n > 10 else g[-1]
    return g, a, b


KINDS = [(cpu.RESIDUAL, 0.9, 0.7, 1.0), (cpu.RESIDUAL, 1.0, 1.0, 1.0), (cpu.DGC, 0.9, 0.0, 1.0),
         (cpu.DGC, 0.9, 0.0, 0.37), (cpu.DGC_NESTEROV, 0.9, 0.0, 0.37)]


@needs_kernels
@pytest.mark.parametrize("n", [1, 77, 1000])
@pytest.mark.parametrize("kind,c0,c1,scale", KINDS)
def test_compensate_select_matches_the_cpu_kernel(run, n, kind, c0, c1, scale):
    g, a, b = _data(n, n + kind)
    b_cpu = torch.empty(0) if kind == cpu.RESIDUAL else b.clone()
    a_cpu = a.clone()
    slots, seed, thr = 37, 0x9747B28C, 0.8
    idx = torch.arange(0, n, 3)
    at = torch.empty(idx.numel())
    consts = (c_int(kind), c_float(c0), c_float(c1), c_float(scale), c_int(scale != 1.0),
              c_int(kind == cpu.RESIDUAL and c0 != 1.0))
    run("compensate_at", a, b, g, idx, idx.numel(), *consts, at)
    want_at = cpu.compensate_at(a_cpu, b_cpu, g, idx, kind, c0, c1, scale)
    assert torch.equal(at.view(torch.int32), want_at.view(torch.int32))
    table = torch.full((slots,), -1, dtype=torch.int32)
    flag, want_flag = torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    run("compensate_select", a, b, g, n, *consts, c_float(thr), c_uint(seed), table, c_uint(slots), flag,
        c_int(1))
    want = cpu.compensate_select(a_cpu, b_cpu, g, kind, c0, c1, scale, thr, slots, seed, nonfinite=want_flag)
    assert [i for i in table.tolist() if i >= 0] == want.tolist()  # the CPU kernel sends the filled slots
    assert torch.equal(flag, want_flag) and torch.equal(flag, twins.nonfinite(g))  # of the raw gradient
    assert torch.equal(a.view(torch.int32), a_cpu.view(torch.int32))
    if kind != cpu.RESIDUAL:
        assert torch.equal(b.view(torch.int32), b_cpu.view(torch.int32))


STEPS = [  # (weight decay, momentum, nesterov, dgc, fma_tail)
    (5e-4, 0.9, False, True, 0), (5e-4, 0.9, True, True, 0), (0.0, 0.9, False, True, 0),
    (5e-4, 0.9, False, False, 5), (1e-3, 0.9, True, False, 0), (5e-4, 0.0, False, False, 0),
    (0.0, 0.0, False, False, 0)]


@needs_kernels
@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("wd,m,nesterov,dgc,tail", STEPS)
def test_sgd_step_matches_the_cpu_kernel(run, sparse, first, wd, m, nesterov, dgc, tail):
    n = 1001
    gen = torch.Generator().manual_seed(5)
    p, buf, grad = (torch.randn(n, generator=gen) for _ in range(3))
    p[:2] = torch.tensor([0.0, -0.0])
    idx = torch.randperm(n, generator=gen)[:40].sort().values
    idx[0] = 0
    vals = torch.randn(40, generator=gen)
    p_cpu, buf_cpu = p.clone(), buf.clone()
    with_buf = bool(m) and (bool(wd) or not dgc)
    empty = torch.empty(0)
    cpu.sgd_step(p_cpu, buf_cpu if with_buf else empty, empty if sparse else grad,
                 idx if sparse else empty.long(), vals if sparse else empty, 0.1, wd, m, nesterov, first, dgc,
                 tail)
    if sparse and not wd and not with_buf:
        run("sgd_sparse", p, idx, vals, 40, c_float(-0.1))
    else:
        run("sgd_step", p, buf, grad, idx, vals, 40, n, c_int(not sparse), c_float(-0.1), c_float(wd),
            c_float(m), c_int(nesterov), c_int(first), c_int(dgc), c_int(with_buf), n - tail)
    assert torch.equal(p.view(torch.int32), p_cpu.view(torch.int32))
    if with_buf:
        assert torch.equal(buf.view(torch.int32), buf_cpu.view(torch.int32))


@needs_kernels
@pytest.mark.parametrize("tail", [0, 5])
@pytest.mark.parametrize("beta1", [0.9, 0.3])
@pytest.mark.parametrize("decoupled,wd", [(False, 0.0), (False, 1e-2), (True, 0.05)])
@pytest.mark.parametrize("sparse", [True, False])
def test_adam_step_matches_the_cpu_kernel(run, sparse, decoupled, wd, beta1, tail):
    """The launcher's constants (kernels.ops.adam_step) computed as the CPU kernel computes them."""
    import math

    import numpy as np

    n, lr, beta2, eps, step = 1001, 1e-2, 0.999, 1e-8, 3.0
    gen = torch.Generator().manual_seed(6)
    p, grad = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    m, v = torch.randn(n, generator=gen) * 0.1, torch.rand(n, generator=gen) * 1e-2
    p[:2] = torch.tensor([0.0, -0.0])
    idx = torch.randperm(n, generator=gen)[:40].sort().values
    vals = torch.randn(40, generator=gen)
    p_cpu, m_cpu, v_cpu = p.clone(), m.clone(), v.clone()
    empty = torch.empty(0)
    cpu.adam_step(p_cpu, m_cpu, v_cpu, empty if sparse else grad, idx if sparse else empty.long(),
                  vals if sparse else empty, lr, beta1, beta2, eps, wd, step, decoupled, tail)
    small = abs(1 - beta1) < 0.5
    c1 = np.float32(1 - beta1) if small else np.float32(np.float32(1 - beta1) - np.float32(1))
    consts = [-(lr / (1 - math.pow(beta1, step))), wd, 1 - lr * wd, c1, beta2, 1 - beta2,
              math.sqrt(1 - math.pow(beta2, step)), eps]
    run("adam_step", p, m, v, grad, idx, vals, 40, n, c_int(not sparse), *[c_float(float(c)) for c in consts],
        c_int(wd != 0), c_int(decoupled), c_int(small), n - tail)
    for a, b in ((p, p_cpu), (m, m_cpu), (v, v_cpu)):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
