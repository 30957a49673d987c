"""The compiled CPU kernels (`extensions/cpu/*.cpp`) against their twins, which
COMPBENCH_KERNELS=0 selects: the same tables, bits and payloads, at any number of threads."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from compbench.codec.packing import _pack_signs_numpy, decode_2bit, decode_bits
from compbench.compressors.dragonn import DRAGONN, _select, sample_indices, sampled_threshold
from compbench.compressors.onebit import _onebit
from compbench.compressors.qsgd import _dequantize
from compbench.compressors.signum import _momentum_sign
from compbench.compressors.sparse import AbsIndex, Workspace
from compbench.compressors.terngrad import _scale
from compbench.kernels import cpu, twins

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def test_built_by_setup_where_there_is_a_compiler():
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler: the twins run")
    assert cpu.status().startswith("compiled"), f"{cpu.status()}: make setup builds them"


def _twin(monkeypatch, fn, *args):
    with monkeypatch.context() as m:
        m.setenv("COMPBENCH_KERNELS", "0")
        return fn(*args)


def _gradient(n: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    if n > 100:
        x[3], x[70], x[-1] = float("nan"), -0.0, 0.0
    return x


@needs_kernels
@pytest.mark.parametrize("n", [1, 63, 64, 1000, 65537, 1 << 20])
@pytest.mark.parametrize("threads", [1, 2])
def test_dragonn_select_matches_twin(monkeypatch, n, threads):
    x = _gradient(n, n)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for threshold, slots in [(2.0, 64), (0.0, max(1, n // 8)), (float("inf"), 16), (1.0, 4 * n + 3)]:
            thr = torch.tensor([threshold])
            got = _select(x, thr, slots, 12345, Workspace())
            want = _twin(monkeypatch, _select, x, thr, slots, 12345, Workspace())
            assert torch.equal(got, want), (n, threshold, slots)
    finally:
        torch.set_num_threads(old)


@needs_kernels
@pytest.mark.parametrize(("n", "m", "j"), [(1, 1, 1), (1000, 100, 1), (300_000, 3000, 30), (5000, 4999, 4999),
                                          (1 << 20, 200_000, 2000)])
@pytest.mark.parametrize("threads", [1, 2])
def test_sampled_threshold_matches_twin(monkeypatch, n, m, j, threads):
    x = _gradient(n, 3)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = sampled_threshold(x, m, j, 2**32 + 77)  # seeds are taken mod 2^32
        want = _twin(monkeypatch, sampled_threshold, x, m, j, 77)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got, want) or (got.isnan().all() and want.isnan().all())


def test_sample_stream_is_uniform():
    n, m = 1000, 400_000
    counts = np.bincount(sample_indices(n, m, 5), minlength=n)
    assert counts.min() > 0 and counts.max() < 2 * m / n  # expected 400 +- 20 each
    assert abs(counts.std() - (m / n) ** 0.5) < 5  # as binomial draws
    assert not np.array_equal(sample_indices(n, 100, 5), sample_indices(n, 100, 6))


@needs_kernels
def test_dragonn_payload_is_the_twins():
    x = _gradient(300_000, 1).reshape(600, 500)
    a, b = DRAGONN(ratio=0.01), DRAGONN(ratio=0.01)
    got, _ = a.compress(x, "w")
    with pytest.MonkeyPatch.context() as m:
        m.setenv("COMPBENCH_KERNELS", "0")
        want, _ = b.compress(x, "w")
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def _indices_ge(x: torch.Tensor, t: float) -> torch.Tensor:
    return AbsIndex(x, Workspace(), density=1e-3).indices_ge(t)


@needs_kernels
@pytest.mark.parametrize("n", [1024, 1024 + 17, 1 << 20])
def test_block_absmax_selects_the_twins_indices(monkeypatch, n):
    x = _gradient(n, 2)
    got = cpu.block_absmax(x)
    rows = x[: n // 64 * 64].view(-1, 64).abs().nan_to_num(nan=0.0)
    assert torch.equal(got, rows.amax(dim=1))  # NaN elements are ignored
    for t in (0.5, 2.5, 4.0, float("inf")):
        want = _twin(monkeypatch, _indices_ge, x, t)
        assert torch.equal(_indices_ge(x, t), want)


@needs_kernels
@pytest.mark.parametrize("n", [64, 1024 + 17, 1 << 20])
@pytest.mark.parametrize("threads", [1, 2])
def test_block_absmax_gathers_the_strided_sample_in_its_pass(n, threads):
    x = _gradient(n, 3)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for start, stride in ((0, 1), (5, 7), (n - 1, 3)):
            count = len(range(start, n, stride))
            samples = torch.full((count,), float("nan"))
            maxima = cpu.block_absmax(x, samples, start, stride)
            assert torch.equal(maxima, cpu.block_absmax(x))
            torch.testing.assert_close(samples, x[start::stride], rtol=0, atol=0, equal_nan=True)
    finally:
        torch.set_num_threads(old)
    with pytest.raises(RuntimeError, match="strided sample leaves the tensor"):
        cpu.block_absmax(x, torch.empty(2), n - 1, 1)


@needs_kernels
@pytest.mark.parametrize("n", [1, 7, 8, 9, 131072, 2 * 131072 + 5])
@pytest.mark.parametrize("threads", [1, 2])
def test_pack_signs_matches_twin(n, threads):
    finite = torch.randn(n, generator=torch.Generator().manual_seed(n))
    special = finite.clone()
    special[:8] = torch.tensor([-1.0, 0.0, -0.0, float("nan"), 2.0, -3.0, float("-inf"), 1e-30])[:n]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        (bits, total), (special_bits, _) = cpu.pack_signs(finite), cpu.pack_signs(special)
    finally:
        torch.set_num_threads(old)
    want_bits, want_total = _pack_signs_numpy(finite.numpy())
    assert torch.equal(bits, want_bits)
    np.testing.assert_allclose(total.numpy(), want_total.numpy(), rtol=1e-6)
    assert torch.equal(special_bits, _pack_signs_numpy(special.numpy())[0])  # zero, -0, NaN: bit 0


@needs_kernels
def test_refuses_what_it_cannot_read():
    with pytest.raises(RuntimeError, match="contiguous CPU fp32"):
        cpu.pack_signs(torch.zeros(8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="contiguous CPU fp32"):
        cpu.block_absmax(torch.zeros(128, 2).t())


@needs_kernels
@pytest.mark.parametrize("n", [1, 3, 4, 1001, 1 << 18])
@pytest.mark.parametrize("threads", [1, 2])
def test_terngrad_codes_match_the_cuda_kernels_twin(n, threads):
    x = _gradient(n, 4)
    scale = x.nan_to_num(nan=0.0).abs().max().reshape(1)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu.terngrad_codes(x, scale, 2**40 + 9)  # seeds are taken mod 2^32, as on the GPU
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got, twins.terngrad_codes(x, scale, 9))


@needs_kernels
@pytest.mark.parametrize("n", [1, 5, 1 << 18])
def test_tbq_step_matches_twin(n):
    g = _gradient(n, 5)
    r_kernel = torch.randn(n) * 0.5
    r_twin = r_kernel.clone()
    for _ in range(3):  # the residual carries over
        got = cpu.tbq_step(r_kernel, g, 0.7)
        want = twins.tbq_step(r_twin, g, 0.7)
        assert torch.equal(got, want)
        assert torch.allclose(r_kernel, r_twin, rtol=0, atol=0, equal_nan=True)


@needs_kernels
@pytest.mark.parametrize("n", [1, 7, 8, 9, 131072, 2 * 131072 + 5])
@pytest.mark.parametrize("threads", [1, 2])
def test_onebit_pack_matches_twin(n, threads):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) + 0.3  # the two sides differ
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        bits, means = cpu.onebit_pack(x)
        with_nan = x.clone()
        with_nan[n // 2] = float("nan")
        nan_bits, nan_means = cpu.onebit_pack(with_nan)
    finally:
        torch.set_num_threads(old)
    want_bits, want_means = _onebit(x, torch.empty_like(x))
    assert torch.equal(bits, want_bits)
    torch.testing.assert_close(means, want_means, rtol=2e-6, atol=1e-7)
    twin_bits, twin_means = _onebit(with_nan, torch.empty_like(x))
    assert torch.equal(nan_bits, twin_bits)  # NaN: bit 0, and both means NaN, as the twin's sums
    assert nan_means.isnan().all() and twin_means.isnan().all()


@needs_kernels
def test_onebit_pack_of_one_sign():
    for x in (torch.full((20,), -2.0), torch.full((20,), 3.0), torch.zeros(20)):
        bits, means = cpu.onebit_pack(x)
        want_bits, want_means = _onebit(x, torch.empty_like(x))
        assert torch.equal(bits, want_bits) and torch.equal(means, want_means)  # an empty side: mean 0


@needs_kernels
@pytest.mark.parametrize("n", [1, 9, 1 << 18])
@pytest.mark.parametrize("threads", [1, 2])
def test_signum_step_matches_twin(monkeypatch, n, threads):
    g = _gradient(n, 6)
    m_kernel = torch.randn(n, generator=torch.Generator().manual_seed(7))
    m_twin = m_kernel.clone()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(3):  # the momentum carries over
            got = cpu.signum_step(m_kernel, g, 0.9)
            want = _twin(monkeypatch, _momentum_sign, m_twin, g, 0.9)
            assert torch.equal(got, want)
            assert torch.allclose(m_kernel, m_twin, rtol=0, atol=0, equal_nan=True)  # bit for bit
    finally:
        torch.set_num_threads(old)


@needs_kernels
@pytest.mark.parametrize(("n", "bucket"), [(1, 512), (7, 3), (1000, 512), (1 << 18, 512), (100_003, 100)])
@pytest.mark.parametrize("threads", [1, 2])
def test_qsgd_quantize_matches_the_cuda_kernels_twin(n, bucket, threads):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[: min(n, bucket)] = 0.0  # an all-zero bucket: scale 0, every code s
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        codes, norms = cpu.qsgd_quantize(x, 127, bucket, 2**40 + 11)  # seeds are taken mod 2^32
    finally:
        torch.set_num_threads(old)
    torch.testing.assert_close(norms, twins.bucket_norms(x, bucket), rtol=1e-6, atol=0)
    assert torch.equal(codes, twins.qsgd_codes(x, twins.qsgd_scale(norms, 127), 127, bucket, 11))


@needs_kernels
@pytest.mark.parametrize("n", [1, 9, 16384, 100_003])
@pytest.mark.parametrize("threads", [1, 2])
def test_terngrad_scale_matches_twin(monkeypatch, n, threads):
    cases = [torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3 + 0.5, torch.full((n,), -1.25)]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for x in cases:  # a constant tensor: std 0, no clipping (sum(x^2)/n - mean^2 would not be 0)
            for clip in (None, 2.5, 0.1):
                want = _twin(monkeypatch, _scale, x, clip)
                torch.testing.assert_close(_scale(x, clip), want, rtol=1e-6, atol=0)
        x = cases[0].clone()
        x[n // 2] = float("nan")
        assert _scale(x, 2.5).isnan() and _twin(monkeypatch, _scale, x, 2.5).isnan()
    finally:
        torch.set_num_threads(old)


@needs_kernels
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1001, 1 << 18])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_codes_match_twins(monkeypatch, n, threads):
    gen = torch.Generator().manual_seed(n)
    packed1 = torch.randint(0, 256, ((n + 7) // 8,), dtype=torch.uint8, generator=gen)
    packed2 = torch.randint(0, 256, ((n + 3) // 4,), dtype=torch.uint8, generator=gen)
    one, zero = torch.tensor([0.75]), torch.tensor([-1.5])
    values = torch.tensor([0.0, 2.0, float("nan"), -2.0])
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got1, got2 = decode_bits(packed1, n, one, zero), decode_2bit(packed2, n, values)
        out = torch.full((n + 9,), 5.0)  # a larger `out`: the decode fills its first n elements
        into = decode_2bit(packed2, n, values, out)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(got1, _twin(monkeypatch, decode_bits, packed1, n, one, zero))
    want2 = _twin(monkeypatch, decode_2bit, packed2, n, values)
    assert torch.allclose(got2, want2, equal_nan=True) and got2.shape == (n,)
    assert into.data_ptr() == out.data_ptr() and torch.allclose(into, want2, equal_nan=True)
    assert (out[n:] == 5.0).all()


@needs_kernels
@pytest.mark.parametrize(("n", "bucket"), [(1, 512), (7, 3), (100_003, 512)])
def test_qsgd_dequantize_matches_twin(monkeypatch, n, bucket):
    gen = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen)
    norms = torch.rand((n + bucket - 1) // bucket, generator=gen) * 10
    norms[0] = 0.0
    want = _twin(monkeypatch, _dequantize, codes, norms, 127, bucket, None)
    assert torch.equal(_dequantize(codes, norms, 127, bucket, None), want)
    out = torch.empty(n + 5)
    got = _dequantize(codes, norms, 127, bucket, out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, want)
