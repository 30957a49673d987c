"""The CUDA kernels' logic, checked on the CPU: every `extensions/cuda/*.cu` is compiled for the host
with g++ and a thin shim (`__global__` -> nothing, blockIdx/threadIdx set by the caller, atomics as
plain read-modify-writes), each kernel is run as a small grid of sequential "threads", and the result
is compared with the kernel's pure-torch twin. Grid-stride loops, index arithmetic, bit layouts,
the counter-based random stream and the rounding order are the same text the GPU runs. The
launchers of `kernels/ops.py` run end to end too, with this host build standing in for CuPy (which
also checks every scalar's C type). Skipped when g++ is absent. The GPU itself is covered by
tests/gpu/test_kernel_parity.py."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from ctypes import c_float, c_int, c_longlong, c_uint, c_void_p

import numpy as np
import pytest
import torch

from compbench.codec import packing
from compbench.codec.packing import decode_2bit, decode_bits, pack_2bit, ternary_codes
from compbench.compressors.dragonn import _select as dragonn_select_twin
from compbench.compressors.sparse import Workspace
from compbench.kernels import loader, twins

SHIM = r"""
#include <cmath>
struct cb_dim3 { unsigned int x, y, z; };
static cb_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline int atomicMax(int* p, int v) { int old = *p; if (v > old) *p = v; return old; }
static inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    unsigned long long old = *p; *p = old + v; return old; }
static inline float atomicAdd(float* p, float v) { float old = *p; *p = old + v; return old; }
extern "C" void cb_set_launch(unsigned int grid, unsigned int block, unsigned int b, unsigned int t) {
    gridDim.x = grid; blockDim.x = block; blockIdx.x = b; threadIdx.x = t;
    gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;
    blockIdx.y = blockIdx.z = threadIdx.y = threadIdx.z = 0;
}
"""

GRID, BLOCK = 3, 5  # 15 sequential "threads": every grid-stride loop wraps several times

SIGNATURES = {
    "dragonn_select": [c_void_p, c_longlong, c_float, c_uint, c_void_p, c_uint, c_void_p, c_int],
    "compact_abs_ge": [c_void_p, c_longlong, c_float, c_void_p, c_void_p, c_longlong],
    "pack_signs": [c_void_p, c_longlong, c_void_p, c_longlong],
    "pack_bits": [c_void_p, c_longlong, c_void_p, c_longlong],
    "decode_bits": [c_void_p, c_longlong, c_void_p, c_void_p, c_void_p],
    "pack_2bit": [c_void_p, c_longlong, c_void_p, c_longlong],
    "decode_2bit": [c_void_p, c_longlong, c_void_p, c_void_p],
    "qsgd_codes": [c_void_p, c_longlong, c_void_p, c_longlong, c_float, c_uint, c_void_p],
    "terngrad_codes": [c_void_p, c_longlong, c_void_p, c_uint, c_void_p, c_longlong],
    "tbq_step": [c_void_p, c_void_p, c_longlong, c_float, c_void_p, c_longlong],
    "scatter_add": [c_void_p, c_void_p, c_void_p, c_longlong],
}


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    tmp = tmp_path_factory.mktemp("kernels")
    shim = tmp / "shim.h"
    shim.write_text(SHIM)
    unit = tmp / "all_kernels.cpp"  # one translation unit: one compiler run for every source
    unit.write_text("".join(f'#include "{p}"\n' for p in loader.sources()))
    lib = tmp / "kernels.so"
    cmd = ["g++", "-std=c++14", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-include", str(shim),
           f"-I{loader.source_dir()}", str(unit), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return ctypes.CDLL(str(lib))


class _Runner:
    def __init__(self, lib):
        self.lib = lib
        lib.cb_set_launch.argtypes = [c_uint] * 4

    def __call__(self, name: str, *args):
        fn = getattr(self.lib, name)
        fn.argtypes = SIGNATURES[name]
        fn.restype = None
        conv = [a.ctypes.data_as(c_void_p) if isinstance(a, np.ndarray) else a for a in args]
        for b in range(GRID):
            for t in range(BLOCK):
                self.lib.cb_set_launch(GRID, BLOCK, b, t)
                fn(*conv)


@pytest.fixture(scope="module")
def run(host_lib):
    return _Runner(host_lib)


def _x(n: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    special = torch.tensor([0.0, -0.0, 1.5, -1.5])[:n]  # zeros of both signs and an exact tie pair
    x[: special.numel()] = special
    return x


def test_every_source_compiles_and_exports_the_launched_kernels(host_lib):
    for name in SIGNATURES:
        assert hasattr(host_lib, name), f"{name} is not exported by any extensions/cuda/*.cu"


@pytest.mark.parametrize("poison", [None, float("nan"), float("-inf")])
@pytest.mark.parametrize("n", [1, 999, 5000])
def test_dragonn_select_matches_the_torch_twin(run, n, poison):
    x = _x(n, seed=n)
    if poison is not None:
        x[n // 2] = poison
    threshold = torch.tensor([1.5])  # the tie at +-1.5 passes (>=)
    slots, seed = 37, 0x9747B28C
    table = np.full(slots, -1, dtype=np.int32)
    flag = np.zeros(1, dtype=np.int32)  # the non-finite check (codec/finite.py), on
    run("dragonn_select", x.numpy(), n, c_float(1.5), c_uint(seed), table, c_uint(slots), flag, c_int(1))
    expected = dragonn_select_twin(x, threshold, slots, seed, Workspace())
    assert table[table >= 0].tolist() == expected.tolist()
    assert flag.tolist() == twins.nonfinite(x).tolist()
    unchecked, untouched = np.full(slots, -1, dtype=np.int32), np.full(1, 7, dtype=np.int32)
    run("dragonn_select", x.numpy(), n, c_float(1.5), c_uint(seed), unchecked, c_uint(slots), untouched,
        c_int(0))
    assert unchecked.tolist() == table.tolist() and untouched.tolist() == [7]  # check=0: not written


@pytest.mark.parametrize("cap", [10_000, 7])
def test_compact_abs_ge_matches_nonzero_and_counts_past_capacity(run, cap):
    n = 4000
    x = _x(n, seed=1)
    out = np.full(cap, -1, dtype=np.int64)
    count = np.zeros(1, dtype=np.uint64)
    run("compact_abs_ge", x.numpy(), n, c_float(1.5), out, count, cap)
    expected = torch.nonzero(x.abs() >= 1.5).view(-1)
    assert int(count[0]) == expected.numel()
    got = np.sort(out[: min(cap, expected.numel())])
    if cap >= expected.numel():
        assert got.tolist() == expected.tolist()
    else:
        assert set(got.tolist()) <= set(expected.tolist())


@pytest.mark.parametrize("n", [1, 8, 13, 1000])
def test_bit_packing_and_decoding_match_the_torch_paths(run, n, monkeypatch):
    x = _x(n, seed=2)
    nbytes = (n + 7) // 8
    signs = np.zeros(nbytes, dtype=np.uint8)
    run("pack_signs", x.numpy(), n, signs, nbytes)
    expected = packing._pack_bits_torch(x < 0)
    assert signs.tolist() == expected.tolist()
    bits = np.zeros(nbytes, dtype=np.uint8)
    mask = (x > 0.3).numpy().view(np.uint8)
    run("pack_bits", mask, n, bits, nbytes)
    assert bits.tolist() == packing._pack_bits_torch(x > 0.3).tolist()
    one, zero = np.array([2.5], np.float32), np.array([-0.75], np.float32)
    out = np.zeros(n, dtype=np.float32)
    run("decode_bits", signs, n, one, zero, out)
    want = decode_bits(torch.from_numpy(signs), n, torch.from_numpy(one), torch.from_numpy(zero))
    assert torch.equal(torch.from_numpy(out), want)


@pytest.mark.parametrize("n", [1, 4, 7, 1001])
def test_two_bit_packing_and_decoding_match_the_torch_paths(run, n, monkeypatch):
    codes = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    nbytes = (n + 3) // 4
    packed = np.zeros(nbytes, dtype=np.uint8)
    run("pack_2bit", codes.numpy(), n, packed, nbytes)
    monkeypatch.setattr(packing, "_on_cpu", lambda t: False)  # the device-agnostic torch path
    assert packed.tolist() == pack_2bit(codes).tolist()
    monkeypatch.undo()
    values = np.array([0.0, 1.25, -3.0, 7.5], dtype=np.float32)
    out = np.zeros(n, dtype=np.float32)
    run("decode_2bit", packed, n, values, out)
    expected = decode_2bit(torch.from_numpy(packed), n, torch.from_numpy(values))
    assert torch.equal(torch.from_numpy(out), expected)


@pytest.mark.parametrize("levels,bucket", [(127, 512), (7, 64), (1, 10)])
def test_qsgd_codes_match_the_twin_bit_for_bit(run, levels, bucket):
    n = 3001
    x = _x(n, seed=3)
    x[1000:1000 + bucket] = 0.0  # an all-zero bucket (scale 0)
    scale = twins.bucket_scale(x, levels, bucket)
    seed = 0xDEADBEEF
    codes = np.zeros(n, dtype=np.uint8)
    run("qsgd_codes", x.numpy(), n, scale.numpy(), bucket, c_float(levels), c_uint(seed), codes)
    expected = twins.qsgd_codes(x, scale, levels, bucket, seed)
    assert codes.tolist() == expected.tolist()
    assert int(codes.max()) <= 2 * levels


def test_terngrad_codes_match_the_twin_bit_for_bit(run):
    n = 2003
    x = _x(n, seed=4)
    s = x.abs().max().reshape(1)
    nbytes = (n + 3) // 4
    out = np.zeros(nbytes, dtype=np.uint8)
    run("terngrad_codes", x.numpy(), n, s.numpy(), c_uint(77), out, nbytes)
    assert out.tolist() == twins.terngrad_codes(x, s, 77).tolist()


def test_tbq_step_updates_the_residual_like_the_twin(run):
    n, tau = 1003, 0.5
    g = _x(n, seed=5)
    r_kernel = (_x(n, seed=6) * 0.3).numpy().copy()
    r_twin = torch.from_numpy(r_kernel.copy())
    nbytes = (n + 3) // 4
    for _ in range(3):  # residuals carry over from step to step
        out = np.zeros(nbytes, dtype=np.uint8)
        run("tbq_step", r_kernel, g.numpy(), n, c_float(tau), out, nbytes)
        expected = twins.tbq_step(r_twin, g, tau)
        assert out.tolist() == expected.tolist()
        assert np.array_equal(r_kernel, r_twin.numpy())


def test_tbq_twin_is_the_compressor_hot_step():
    from compbench.compressors.tbq import _threshold_quantize

    g, r0 = _x(500, seed=7), _x(500, seed=8) * 0.3
    r1, r2 = r0.clone(), r0.clone()
    assert torch.equal(twins.tbq_step(r1, g, 0.4), _threshold_quantize(r2, g, 0.4, torch.empty(500)))
    assert torch.equal(r1, r2)


def test_scatter_add_matches_index_add_with_duplicates(run):
    n, m = 100, 400
    idx = torch.randint(0, n, (m,), generator=torch.Generator().manual_seed(9), dtype=torch.int32)
    vals = torch.randn(m, generator=torch.Generator().manual_seed(10))
    out = np.zeros(n, dtype=np.float32)
    run("scatter_add", out, idx.numpy(), vals.numpy(), m)
    expected = torch.zeros(n).index_add_(0, idx, vals)
    torch.testing.assert_close(torch.from_numpy(out), expected)


def test_counter_uniform_is_uniform_and_seeded():
    u = twins.counter_uniform(123, 200_000)
    assert u.dtype == torch.float32 and 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    hist = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    assert (hist - 0.1).abs().max() < 0.005
    assert not torch.equal(u[:100], twins.counter_uniform(124, 100))
    assert torch.equal(u[:100], twins.counter_uniform(123, 100))


def test_qsgd_twin_is_unbiased():
    x = _x(64, seed=11)
    scale = twins.bucket_scale(x, 3, 16)
    total = torch.zeros(64, dtype=torch.float64)
    trials = 3000
    for seed in range(trials):
        codes = twins.qsgd_codes(x, scale, 3, 16, seed).double()
        total += (codes - 3) / scale.double().repeat_interleave(16)
    torch.testing.assert_close(total / trials, x.double(), atol=0.06, rtol=0)


def test_terngrad_twin_packs_ternary_codes():
    x = torch.tensor([5.0, -5.0, 0.0, 0.1])
    s = torch.tensor([5.0])
    codes = twins.terngrad_codes(x, s, 0)
    q = torch.tensor([1, -1, 0], dtype=torch.int8)
    # |x| = s always passes, 0 never does; the last one depends on its draw (code 0 or 1).
    assert codes.numel() == 1 and (int(codes[0]) & 0x3F) == int(pack_2bit(ternary_codes(q))[0])


def test_qsgd_twin_norms_are_the_compressor_norms():
    from compbench.compressors.qsgd import _quantize

    x = _x(1300, seed=12)
    norms = _quantize(x, 7, 512, torch.zeros(1300))[1]
    assert torch.equal(twins.bucket_norms(x, 512), norms)


# --- the launchers (kernels/ops.py) end to end, with the host build standing in for CuPy ----------

_CTYPE_OF = {np.int64: c_longlong, np.int32: c_int, np.float32: c_float, np.uint32: c_uint}


@pytest.fixture
def host_ops(run, monkeypatch):
    """`kernels.ops` on CPU tensors: `as_cupy` becomes a numpy view, `launch` runs the host build after
    checking every scalar's numpy type against the kernel's C signature (a Python int or float would
    reach CuPy as a 64-bit int or a double)."""
    from compbench.kernels import ops

    def fake_launch(name, function, work, device, args):
        assert work > 0 and device.type == "cpu"
        sig = SIGNATURES[function]
        assert len(args) == len(sig), f"{function}: {len(args)} arguments for {len(sig)} parameters"
        converted = []
        for arg, ctype in zip(args, sig, strict=True):
            if isinstance(arg, np.ndarray):
                assert ctype is c_void_p, f"{function}: array passed for a {ctype.__name__}"
                assert arg.flags.c_contiguous
                converted.append(arg)
            else:
                assert _CTYPE_OF[type(arg)] is ctype, f"{function}: {type(arg).__name__} for {ctype.__name__}"
                converted.append(ctype(arg.item()))
        run(function, *converted)

    monkeypatch.setattr(ops, "as_cupy", lambda t: t.detach().numpy())
    monkeypatch.setattr(ops, "launch", fake_launch)
    return ops


def test_launchers_match_the_twins(host_ops):
    ops = host_ops
    x = _x(3001, seed=13)
    table = ops.dragonn_select(x, 1.5, 41, 7)
    assert table.dtype == torch.int32
    flag = torch.zeros(1, dtype=torch.int32)
    poisoned = x.clone()
    poisoned[17] = float("inf")
    assert torch.equal(ops.dragonn_select(x, 1.5, 41, 7, nonfinite=flag), table) and flag.item() == 0
    ops.dragonn_select(poisoned, 1.5, 41, 7, nonfinite=flag)
    assert flag.item() == 1
    twin = dragonn_select_twin(x, torch.tensor([1.5]), 41, 7, Workspace())
    assert table[table >= 0].long().tolist() == twin.tolist()
    expected = torch.nonzero(x.abs() >= 1.0).view(-1)
    assert ops.compact_abs_ge(x, 1.0).sort().values.tolist() == expected.tolist()
    assert ops.compact_abs_ge(x, 1.0, capacity=5).sort().values.tolist() == expected.tolist()  # relaunch
    assert torch.equal(ops.pack_signs(x), packing._pack_bits_torch(x < 0))
    assert torch.equal(ops.pack_bits(x > 0.2), packing._pack_bits_torch(x > 0.2))
    one, zero = torch.tensor([2.0]), torch.tensor([-1.0])
    packed = ops.pack_signs(x)
    assert torch.equal(ops.decode_bits(packed, 3001, one, zero), decode_bits(packed, 3001, one, zero))
    codes = torch.randint(0, 4, (3001,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    packed2 = ops.pack_2bit(codes)
    values = torch.tensor([0.0, 1.0, -2.0, 3.0])
    assert torch.equal(ops.decode_2bit(packed2, 3001, values), decode_2bit(packed2, 3001, values))
    out = torch.full((3001,), 9.0)
    assert ops.decode_2bit(packed2, 3001, values, out=out).data_ptr() == out.data_ptr()
    scale = twins.bucket_scale(x, 7, 100)
    assert torch.equal(ops.qsgd_codes(x, scale, 7, 100, 5), twins.qsgd_codes(x, scale, 7, 100, 5))
    s = x.abs().max().reshape(1)
    assert torch.equal(ops.terngrad_codes(x, s, 5), twins.terngrad_codes(x, s, 5))
    r1, r2 = _x(3001, seed=14) * 0.2, _x(3001, seed=14) * 0.2
    assert torch.equal(ops.tbq_step(r1, x, 0.5), twins.tbq_step(r2, x, 0.5)) and torch.equal(r1, r2)
    idx = torch.randint(0, 3001, (500,), dtype=torch.int64, generator=torch.Generator().manual_seed(2))
    vals = torch.randn(500, generator=torch.Generator().manual_seed(3))
    expected = torch.zeros(3001).index_add_(0, idx, vals)
    torch.testing.assert_close(ops.scatter_add(torch.zeros(3001), idx, vals), expected)
