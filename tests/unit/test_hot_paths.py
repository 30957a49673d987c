"""The CPU hot paths behind the sparsifiers and sign codes give exactly what the plain torch
expressions give (the speed is measured by `compbench bench`, not here), and decoding into a
caller's buffer is safe."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compbench.codec.base import make_ctx
from compbench.codec.buffers import OutputBuffers
from compbench.codec.packing import _pack_bits_torch, pack_signs
from compbench.compressors import build_compressor
from compbench.compressors.dgc import _select as dgc_select
from compbench.compressors.dragonn import DRAGONN, murmur3_32, murmur3_32_np
from compbench.compressors.sparse import AbsIndex, Workspace, exact_topk_indices, kth_largest


def _randn(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _reference(x: torch.Tensor, t: float) -> list[int]:
    return torch.nonzero(x.abs() >= t).view(-1).tolist()


@pytest.mark.parametrize("n", [1, 1000, 64 * 16, 64 * 1000 + 37, 300_001])
@pytest.mark.parametrize("density", [0.0, 0.001, 0.05])
def test_abs_index_equals_the_plain_comparison(n, density):
    x = _randn(n, seed=n)
    if n > 10:
        x[3], x[5], x[n - 1] = 4.0, -4.0, -3.5  # ties at the threshold and a hit in the tail
    index = AbsIndex(x, Workspace(), density=density)
    for t in (3.5, 4.0, 2.0, 0.0, 100.0, torch.tensor([3.0])):  # several queries on one summary
        got = index.indices_ge(t)
        assert got.dtype == torch.int64
        assert got.tolist() == _reference(x, float(t)), (n, density, t)


def test_abs_index_nan_inf_and_signed_zero():
    x = torch.zeros(64 * 40)
    x[70] = float("nan")  # a NaN never passes but must not hide its block's other elements
    x[71] = -5.0
    x[200] = float("-inf")
    x[201] = -0.0
    x[64 * 40 - 1] = float("nan")
    index = AbsIndex(x, Workspace(), density=0.001)
    assert index._blocks  # the summary path
    assert index.indices_ge(1.0).tolist() == [71, 200]
    assert index.indices_ge(0.0).numel() == x.numel() - 2


def test_abs_index_other_dtypes_and_non_contiguous_input():
    x = _randn(5000, seed=1)
    ws = Workspace()
    assert AbsIndex(x.half(), ws).indices_ge(2.0).tolist() == _reference(x.half().float(), 2.0)
    strided = _randn(10_000, seed=2)[::2]
    assert AbsIndex(strided, ws, density=0.001).indices_ge(2.5).tolist() == _reference(strided, 2.5)


def test_kth_largest_and_exact_topk():
    s = _randn(250_000, seed=3).abs()
    for j in (1, 250, 249_999, 250_000):
        assert float(kth_largest(s, j)) == float(torch.topk(s, j).values.min())
    x = _randn(300_000, seed=4)
    for k in (1, 300, 3000):
        got = exact_topk_indices(x, k, Workspace())
        assert set(got.tolist()) == set(torch.topk(x.abs(), k).indices.tolist())


def test_dgc_selects_by_magnitude_from_values_or_magnitudes():
    x = _randn(400_000, seed=5)
    k, r = 400, 1e-3
    a = dgc_select(x, k, r, 0.01, torch.Generator().manual_seed(7), Workspace())
    b = dgc_select(x.abs(), k, r, 0.01, torch.Generator().manual_seed(7), Workspace())
    assert a.sort().values.tolist() == b.sort().values.tolist()
    assert 0.8 * k <= a.numel() <= k
    sent = x.abs()[a]
    unsent = torch.ones(x.numel(), dtype=torch.bool)
    unsent[a] = False
    assert sent.min() >= x.abs()[unsent].max()


def test_murmur3_numpy_equals_torch():
    keys = torch.randint(0, 2**31 - 1, (5000,), generator=torch.Generator().manual_seed(6))
    for seed in (0, 1, 0xFFFFFFFF, 0x9747B28C):
        assert murmur3_32_np(keys.numpy(), seed).astype(np.int64).tolist() == murmur3_32(keys, seed).tolist()


def test_dragonn_table_equals_a_sequential_pass():
    # The reference semantics: elements in increasing index order write slot murmur3(i) % 4k;
    # the last writer of a slot wins; filled slots in slot order.
    n, r = 200_000, 1e-3
    x = _randn(n, seed=8)
    comp = DRAGONN(ratio=r, sample_ratio=1.0)  # exact threshold: the k-th largest magnitude
    comp.begin_step(2, 0.0)
    payload, _ = comp.compress(x, "w")
    k = math.ceil(n * r)
    t = float(torch.topk(x.abs(), k).values.min())
    from compbench.compressors.sparse import stable_seed

    seed = stable_seed(0, 2, "w", "murmur") & 0xFFFFFFFF
    table = [-1] * (4 * k)
    for i in torch.nonzero(x.abs() >= t).view(-1).tolist():
        table[int(murmur3_32(torch.tensor([i]), seed)) % (4 * k)] = i
    assert payload[1].tolist() == [i for i in table if i >= 0]
    torch.testing.assert_close(payload[0], x[payload[1].long()])


@pytest.mark.parametrize("n", [0, 1, 9, 2**17, 2**17 + 13, 300_001])
def test_pack_signs_equals_packbits_and_abs_sum(n):
    x = _randn(n, seed=9)
    if n > 4:
        x[:3] = torch.tensor([0.0, -0.0, float("nan")])  # none of these is negative
    packed, total = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == (n + 7) // 8
    assert packed.tolist() == _pack_bits_torch(x < 0).tolist()
    expected = torch.nansum(x.double().abs())
    if n > 4:
        assert math.isnan(float(total))  # a NaN gradient gives a NaN scale, as before
    else:
        assert float(total) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("name", ["dgc", "dragonn", "topk", "graddrop", "fp16", "signsgd", "efsignsgd"])
@pytest.mark.parametrize("n", [6000, 6003])
def test_decode_into_a_reused_buffer_equals_a_fresh_decode(name, n):
    sparse = name in ("dgc", "dragonn", "topk", "graddrop")
    comp = build_compressor(name, **({"ratio": 0.01} if sparse else {}))
    xs = [_randn(n, seed=s).view(3, n // 3) for s in range(3)]
    payloads = [comp.compress(x, "w")[0] for x in xs]
    ctx = comp.compress(xs[0], "w")[1]
    buffers = OutputBuffers()
    buf = buffers.get(ctx)
    buf.fill_(123.0)  # stale content must not leak into the result
    got = comp.decompress_all(payloads, ctx, out=buf)
    torch.testing.assert_close(got, comp.decompress_all(payloads, ctx))
    assert got.shape == ctx.shape and got.data_ptr() == buf.data_ptr()  # the result IS the buffer
    single = comp.decompress(payloads[1], ctx, out=buffers.get(ctx))
    torch.testing.assert_close(single, comp.decompress(payloads[1], ctx))
    assert buffers.get(ctx) is buf  # one buffer per name
    with pytest.raises(ValueError, match="decode buffer for w must be a contiguous torch.float32 tensor"):
        comp.decompress(payloads[0], ctx, out=torch.empty(10))


def test_output_buffers_follow_name_size_and_dtype():
    buffers = OutputBuffers()
    a = buffers.get(make_ctx(torch.zeros(3, 4), "a"))
    assert a.shape == (12,) and a.dtype == torch.float32
    assert buffers.get(make_ctx(torch.zeros(3, 4), "a")) is a
    assert buffers.get(make_ctx(torch.zeros(5), "a")).numel() == 5  # resized
    half = buffers.get(make_ctx(torch.zeros(4, dtype=torch.float16), "h"))
    assert half.dtype == torch.float32  # half gradients accumulate in fp32


def test_abs_index_falls_back_when_far_denser_than_announced():
    x = torch.ones(64 * 100 + 5)
    x[::7] = 0.5
    index = AbsIndex(x, Workspace(), density=0.0001)
    assert index._blocks
    assert index.indices_ge(1.0).tolist() == _reference(x, 1.0)
    assert index.indices_ge(0.75).tolist() == _reference(x, 0.75)
