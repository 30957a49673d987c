"""CompLL's selections (lang.Select: a sampled threshold, then filter/compaction): every selection
spec's generated C++ operators and CUDA filter (compiled for the host with the shim of
test_kernel_logic_host.py) against its generated torch oracle, at 1 and 2 threads; the oracle's
glue against a numpy transcription of the algorithm; the compressors that use them."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from ctypes import c_float, c_longlong, c_void_p
from functools import partial

import numpy as np
import pytest
import torch

from compbench.compll import gen_cuda, gen_torch, lang, runtime
from compbench.compressors import build_compressor
from compbench.kernels import cpu
from tests.helpers import compbench
from tests.unit.test_kernel_logic_host import BLOCK, GRID, SHIM

SELECTS = sorted(runtime.selects())
SIZES = [1, 7, 8, 9, 1001, 131072 + 5, 3 * 131072 + 13]
needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def _x(n: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if n > 100:
        x[5], x[6], x[7], x[n - 1] = 0.0, -0.0, float("nan"), 3.0  # zeros, a NaN, a hit in the tail
        x[50:60] = 2.0  # ties at a threshold
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # NaN: the j-th largest of a NaN sample


def test_the_selections_are_graddrop_and_dgc():
    assert SELECTS == ["dgc", "graddrop"]
    assert all(isinstance(runtime.spec(name), lang.Select) for name in SELECTS)  # `compbench gen` finds them


@needs_kernels
@pytest.mark.parametrize("name", SELECTS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_generated_cpu_kernels_match_the_torch_oracle(name, n, threads):
    s = runtime.select(name)
    oracle, kernels = gen_torch.module(s), runtime.CpuSelect(s)
    x = _x(n, n)
    sample = torch.randint(n, (max(1, n // 3),), generator=torch.Generator().manual_seed(1))
    stride = max(1, n // 50)
    start = min(stride - 1, 3)
    count = len(range(start, n, stride))
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for j in {1, max(1, sample.numel() // 7), sample.numel()}:
            got = kernels.threshold(x, sample, 0, 1, 0, j, {})
            _same(got, oracle.threshold(x, sample, 0, 1, 0, j, {}))
        for j in {1, count}:
            got = kernels.threshold(x, None, start, stride, count, j, {})
            _same(got, oracle.threshold(x, None, start, stride, count, j, {}))
        for t in (0.0, 1.0, 2.0, 3.5, float("inf"), float("nan")):
            thr = torch.tensor([t])
            got = kernels.filter(x, thr, {})
            assert got.dtype == torch.int64
            assert torch.equal(got, oracle.filter(x, thr, {})), t
    finally:
        torch.set_num_threads(old)


def _numpy_select(x: np.ndarray, ratio: float, sample: np.ndarray, limit: int,
                  adapt: tuple[float, int] | None) -> set[int]:
    """The selection from its definition: the ceil(m r)-th largest sampled |x| (np.partition, NaN
    largest), every |x| >= it, adapted while fewer than factor * limit pass, the limit largest."""
    keys = np.abs(x[sample])
    j = min(max(math.ceil(keys.size * ratio), 1), keys.size)
    thr = np.float32(np.partition(keys, keys.size - j)[keys.size - j])
    idx = np.flatnonzero(np.abs(x) >= thr)
    for _ in range(adapt[1] if adapt else 0):
        if idx.size >= adapt[0] * limit:
            break
        thr = np.float32(thr * np.float32(adapt[0]))
        idx = np.flatnonzero(np.abs(x) >= thr)
    if idx.size > limit:
        idx = idx[np.argsort(-np.abs(x[idx]), kind="stable")[:limit]]
    return set(idx.tolist())


@pytest.mark.parametrize("name", SELECTS)
@pytest.mark.parametrize("n, ratio, m", [(1000, 0.01, 200), (50_000, 0.001, 2000), (50_000, 0.05, 500),
                                         (300, 0.1, 1000)])
def test_the_oracle_selects_as_the_algorithm_says(name, n, ratio, m):
    s = runtime.select(name)
    oracle = gen_torch.module(s)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n + m))
    limit = math.ceil(n * ratio) * (2 if name == "graddrop" else 1)
    got = oracle.select(x, ratio, m, limit, torch.Generator().manual_seed(5), {}, oracle)
    sample, start, stride, count = oracle.draw(n, m, torch.Generator().manual_seed(5), x.device)
    where = sample.numpy() if sample is not None else np.arange(start, n, stride)[:count]
    assert set(got.tolist()) == _numpy_select(x.numpy(), ratio, where, limit, s.adapt)
    if name == "dgc" and stride > 1:
        assert where.size >= m and np.all(np.diff(where) == n // m)  # strided from a random start


def test_dgc_adapts_until_enough_pass():
    # A sample that sees only the largest magnitudes: its threshold passes too few, lowered by 0.8.
    x = torch.cat([torch.full((10,), 10.0), torch.linspace(0.1, 1.0, 9990)])
    oracle = gen_torch.module(runtime.select("dgc"))
    idx = oracle.select(x, 0.001, 10, 1000, torch.Generator().manual_seed(0), {}, oracle)
    assert 800 <= idx.numel() <= 1000 and set(range(10)) <= set(idx.tolist())


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    tmp = tmp_path_factory.mktemp("compll_select")
    (tmp / "shim.h").write_text(SHIM)
    unit = tmp / "generated.cpp"
    unit.write_text("".join(f'#include "{p}"\n' for p in runtime.cuda_sources()
                            if p.stem.removeprefix("compll_") in SELECTS))
    lib = tmp / "generated.so"
    from compbench.kernels import loader

    cmd = ["g++", "-std=c++14", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-include",
           str(tmp / "shim.h"), f"-I{loader.source_dir()}", str(unit), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return ctypes.CDLL(str(lib))


@pytest.mark.parametrize("name", SELECTS)
@pytest.mark.parametrize("n", [1, 9, 1001])
def test_generated_cuda_filter_matches_the_torch_oracle_on_the_host(host_lib, name, n):
    s = runtime.select(name)
    x = _x(n, 3)
    xs = x.numpy().copy()
    fn = getattr(host_lib, s.filter_name)
    assert [a for _, a in gen_cuda.filter_args(s)] == ["x", "n", "h", "out", "count", "cap"]
    fn.argtypes = [c_void_p, c_longlong, c_void_p, c_void_p, c_void_p, c_longlong]
    fn.restype = None
    for t, cap in ((1.0, n), (0.5, 2), (float("nan"), n)):
        h = np.array([t], np.float32)
        out = np.full(max(cap, 1), -1, np.int64)
        count = np.zeros(1, np.uint64)
        host_lib.cb_set_launch.argtypes = [ctypes.c_uint] * 4
        for b in range(GRID):
            for th in range(BLOCK):
                host_lib.cb_set_launch(GRID, BLOCK, b, th)
                fn(xs.ctypes.data_as(c_void_p), n, h.ctypes.data_as(c_void_p), out.ctypes.data_as(c_void_p),
                   count.ctypes.data_as(c_void_p), cap)
        want = gen_torch.module(s).filter(x, torch.tensor([t]), {})
        assert int(count[0]) == want.numel()  # the count goes on past cap: the launcher relaunches
        written = min(cap, want.numel())
        seen = set(out[:written].tolist())
        assert seen <= set(want.tolist()) and len(seen) == written
        if written == want.numel():
            assert torch.equal(torch.from_numpy(np.sort(out[:written])), want)
    assert c_float  # the filter takes no float params: the threshold comes as h[0]


@needs_kernels
# dgc's filter is the block maxima's query instead (one pass gathers its sample and the maxima).
@pytest.mark.parametrize("name, kwargs, generated", [("graddrop", {"ratio": 0.01}, ["threshold", "filter"]),
                                                     ("dgc", {"ratio": 0.001}, ["threshold"])])
def test_the_compressors_run_the_generated_kernels_on_cpu(monkeypatch, name, kwargs, generated):
    calls = []
    for method in ("threshold", "filter"):
        original = getattr(runtime.CpuSelect, method)
        monkeypatch.setattr(runtime.CpuSelect, method,
                            lambda self, *a, _o=original, _m=method: calls.append(_m) or _o(self, *a))
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(4)).view(400, 500)
    comp = build_compressor(name, **kwargs)
    comp.begin_step(3, 0.0)
    payload, _ = comp.compress(x, "w")
    assert calls == generated
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")  # the generated torch code: the same payload
    twin, _ = comp.compress(x, "w")
    assert all(torch.equal(a, b) for a, b in zip(payload, twin, strict=True))


@pytest.mark.parametrize("bad, message", [
    (lambda: lang.Select(name="b", doc="d", key=lang.abs_(lang.x), keep=lang.x >= lang.threshold(),
                         sample="grid"), "sample='grid'; use one of random, strided"),
    (lambda: lang.Select(name="b", doc="d", key=lang.x < 1.0, keep=lang.x >= lang.threshold()),
     "key must be an fp32 expression"),
    (lambda: lang.Select(name="b", doc="d", key=lang.abs_(lang.x), keep=lang.abs_(lang.x)),
     "keep must be a condition"),
    (lambda: lang.Select(name="b", doc="d", key=lang.abs_(lang.x), keep=lang.x >= lang.Input(1)),
     "the filter has one input, threshold()"),
    (lambda: lang.Select(name="b", doc="d", key=lang.abs_(lang.x) + lang.threshold(), keep=lang.x >= 0.0),
     "Input cannot appear in its key"),
    (lambda: lang.Select(name="b", doc="d", key=lang.abs_(lang.x), keep=lang.x >= lang.uniform()),
     "Uniform cannot appear in its keep"),
    (lambda: lang.Select(name="b", doc="d", key=lang.abs_(lang.x), keep=lang.x >= 0.0, adapt=(1.5, 3)),
     "adapt=\\(factor, times\\) needs 0 < factor < 1"),
])
def test_the_language_refuses_selections_it_cannot_generate(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_gen_prints_a_selection_and_refuses_its_conf():
    gen = partial(compbench, "gen", timeout=120)  # `compbench gen ARGS` in a subprocess

    assert "void dgc_filter(" in gen("dgc", "--target", "cuda").stdout
    cpp = gen("graddrop", "--target", "cpu").stdout
    assert "graddrop_threshold" in cpp and "TORCH_LIBRARY_FRAGMENT" in cpp
    assert "def draw(n, m, gen, device)" in gen("graddrop").stdout
    res = gen("dgc", "--target", "conf")
    assert res.returncode == 2 and "is a kernel of a hand-written compressor" in res.stderr


@pytest.mark.parametrize("name", SELECTS)
@pytest.mark.parametrize("t", [1.5, 0.0])  # 0.0: all 5000 pass, past the first launch's room: a relaunch
def test_the_cuda_launcher_runs_the_filter_end_to_end_on_the_host(host_lib, monkeypatch, name, t):
    from compbench.kernels import loader, ops

    s = runtime.select(name)
    ctypes_of = {"long long": c_longlong, "float": c_float}
    numpy_of = {"long long": np.int64, "float": np.float32}
    launches = []

    def fake_launch(module, function, work, device, args):
        assert module == f"compll_{name}" and function == s.filter_name and work > 0
        converted = []
        for arg, (ctype, _) in zip(args, gen_cuda.filter_args(s), strict=True):
            if isinstance(arg, np.ndarray):
                assert "*" in ctype, f"array for {ctype}"
                converted.append(arg.ctypes.data_as(c_void_p))
            else:
                assert type(arg) is numpy_of[ctype], f"{type(arg).__name__} for {ctype}"
                converted.append(ctypes_of[ctype](arg.item()))
        fn = getattr(host_lib, function)
        fn.restype = None
        host_lib.cb_set_launch.argtypes = [ctypes.c_uint] * 4
        for b in range(GRID):
            for th in range(BLOCK):
                host_lib.cb_set_launch(GRID, BLOCK, b, th)
                fn(*converted)
        launches.append(function)

    # CudaSelect converts its inputs with loader.as_cupy and launches through ops.compaction
    for module in (loader, ops):
        monkeypatch.setattr(module, "as_cupy", lambda t: t.detach().numpy())
        monkeypatch.setattr(module, "launch", fake_launch)
    x = _x(5000, 6)
    got = runtime.CudaSelect(s).filter(x, torch.tensor([t]), {})
    assert torch.equal(got, gen_torch.module(s).filter(x, torch.tensor([t]), {}))
    assert len(launches) == (2 if t == 0.0 else 1)


@needs_kernels
@pytest.mark.parametrize("name", SELECTS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_generated_cpu_decode_matches_the_oracle_and_index_add(name, threads, index_dtype):
    s = runtime.select(name)
    n = 3 * 65536 + 7
    gen = torch.Generator().manual_seed(2)
    idx = torch.randint(n, (5000,), generator=gen).to(index_dtype)
    idx[:3] = torch.tensor([n - 1, 0, n - 1])  # the ends, and a duplicate: the adds in payload order
    values = torch.randn(5000, generator=gen)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.full((n,), 7.0)  # stale content is overwritten
        getattr(torch.ops.compbench_cpu, s.decode_name)(values, idx, out)
    finally:
        torch.set_num_threads(old)
    want = gen_torch.module(s).decode(values, idx, torch.full((n,), 3.0))
    assert torch.equal(out, want)
    assert torch.equal(out, torch.zeros(n).index_add_(0, idx, values))
    with pytest.raises(RuntimeError, match="outside the output"):
        getattr(torch.ops.compbench_cpu, s.decode_name)(values[:1], torch.tensor([n]), out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_graddrop_decodes_as_the_shared_sparse_decode(dtype):
    from compbench.compressors.sparse import sparse_decode, sparse_decode_all

    comp = build_compressor("graddrop", ratio=0.01)
    xs = [torch.randn(300, 70, generator=torch.Generator().manual_seed(s)).to(dtype) for s in range(3)]
    payloads, ctx = [comp.compress(x, "w")[0] for x in xs], comp.compress(xs[0], "w")[1]
    assert torch.equal(comp.decompress(payloads[0], ctx), sparse_decode(payloads[0], ctx))
    buf = torch.full((ctx.numel,), 5.0)  # fp32 for both: half gradients accumulate in fp32
    got = comp.decompress_all(payloads, ctx, out=buf)
    assert got.dtype == dtype and torch.equal(got, sparse_decode_all(payloads, ctx))


@pytest.mark.parametrize("name", SELECTS)
def test_generated_cuda_decode_matches_the_oracle_on_the_host(host_lib, name):
    s = runtime.select(name)
    n, k = 1000, 300
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(n, (k,), generator=gen, dtype=torch.int32)
    values = torch.randint(-8, 8, (k,), generator=gen).float() / 4  # exact sums: any order of the adds
    out = np.zeros(n, np.float32)
    fn = getattr(host_lib, s.decode_name)
    fn.argtypes = [c_void_p, c_void_p, c_longlong, c_void_p]
    fn.restype = None
    host_lib.cb_set_launch.argtypes = [ctypes.c_uint] * 4
    v, i = values.numpy().copy(), idx.numpy().copy()
    for b in range(GRID):
        for th in range(BLOCK):
            host_lib.cb_set_launch(GRID, BLOCK, b, th)
            fn(v.ctypes.data_as(c_void_p), i.ctypes.data_as(c_void_p), k, out.ctypes.data_as(c_void_p))
    assert torch.equal(torch.from_numpy(out), gen_torch.module(s).decode(values, idx, torch.empty(n)))
