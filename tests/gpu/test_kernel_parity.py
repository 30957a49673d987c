"""Every CUDA kernel against its pure-torch twin, on the GPU (marker gpu: skipped without CUDA, and
without CuPy). The same comparisons run on the CPU through the host shim in
tests/unit/test_kernel_logic_host.py; these check the real compiler, atomics and launches."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

from compbench.codec import packing  # noqa: E402
from compbench.compressors import build_compressor  # noqa: E402
from compbench.compressors.dragonn import _select as dragonn_select_twin  # noqa: E402
from compbench.compressors.sparse import Workspace  # noqa: E402
from compbench.kernels import cuda_kernels_enabled, loader, ops, twins  # noqa: E402

DEV = torch.device("cuda")


def _x(n: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    special = torch.tensor([0.0, -0.0, 1.5, -1.5])[:n]
    x[: special.numel()] = special
    return x.to(DEV)


def test_kernels_are_enabled_and_zero_copy():
    t = torch.arange(10, dtype=torch.float32, device=DEV)
    assert cuda_kernels_enabled(t) and not cuda_kernels_enabled(t.cpu())
    assert loader.as_cupy(t).data.ptr == t.data_ptr()


@pytest.mark.parametrize("n", [1, 1000, 3_000_001])
def test_dragonn_select(n, monkeypatch):
    x = _x(n, seed=n)
    slots, seed = max(4, n // 250), 0x9747B28C
    table = ops.dragonn_select(x, 1.5, slots, seed)
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")
    # the threshold on x's device: a shape-(1,) CPU tensor does not mix with CUDA tensors (only a
    # 0-dim one does), so a CPU threshold failed the twin, not the kernel
    expected = dragonn_select_twin(x, torch.tensor([1.5], device=DEV), slots, seed, Workspace())
    assert torch.equal(table[table >= 0].long(), expected)


@pytest.mark.parametrize("capacity", [None, 3])
def test_compact_abs_ge(capacity):
    x = _x(2_000_003, seed=1)
    got = ops.compact_abs_ge(x, 2.5, capacity).sort().values
    assert torch.equal(got, torch.nonzero(x.abs() >= 2.5).view(-1))


@pytest.mark.parametrize("n", [1, 13, 1_000_003])
def test_bit_and_two_bit_codes(n, monkeypatch):
    x = _x(n, seed=2)
    assert torch.equal(ops.pack_signs(x), packing._pack_bits_torch(x < 0))
    assert torch.equal(ops.pack_bits(x > 0.3), packing._pack_bits_torch(x > 0.3))
    packed = ops.pack_signs(x)
    one, zero = torch.tensor([2.5], device=DEV), torch.tensor([-0.75], device=DEV)
    got = ops.decode_bits(packed, n, one, zero)
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")
    assert torch.equal(got, packing.decode_bits(packed, n, one, zero))
    codes = torch.randint(0, 4, (n,), dtype=torch.uint8, device=DEV)
    monkeypatch.setenv("COMPBENCH_KERNELS", "1")
    packed2 = ops.pack_2bit(codes)
    values = torch.tensor([0.0, 1.25, -3.0, 7.5], device=DEV)
    got2 = ops.decode_2bit(packed2, n, values)
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")
    assert torch.equal(packed2, packing.pack_2bit(codes))
    assert torch.equal(got2, packing.decode_2bit(packed2, n, values))


@pytest.mark.parametrize("levels,bucket", [(127, 512), (1, 10)])
def test_qsgd_codes(levels, bucket):
    x = _x(1_000_003, seed=3)
    scale = twins.bucket_scale(x, levels, bucket)
    expected = twins.qsgd_codes(x, scale, levels, bucket, 99)
    assert torch.equal(ops.qsgd_codes(x, scale, levels, bucket, 99), expected)


def test_terngrad_codes():
    x = _x(1_000_003, seed=4)
    s = x.abs().max().reshape(1)
    assert torch.equal(ops.terngrad_codes(x, s, 5), twins.terngrad_codes(x, s, 5))


def test_tbq_step_with_residual():
    g = _x(1_000_003, seed=5)
    r1 = _x(1_000_003, seed=6) * 0.3
    r2 = r1.clone()
    for _ in range(3):
        assert torch.equal(ops.tbq_step(r1, g, 0.5), twins.tbq_step(r2, g, 0.5))
        assert torch.equal(r1, r2)


def test_scatter_add():
    n, m = 100_000, 300_000
    idx = torch.randint(0, n, (m,), dtype=torch.int32, device=DEV)
    vals = torch.randn(m, device=DEV)
    got = ops.scatter_add(torch.zeros(n, device=DEV), idx, vals)
    torch.testing.assert_close(got, torch.zeros(n, device=DEV).index_add_(0, idx, vals))


@pytest.mark.parametrize("name", ["dragonn", "dgc", "graddrop", "topk", "signsgd", "onebit", "signum"])
def test_compressors_send_the_same_payload_with_and_without_kernels(name, monkeypatch):
    kwargs = {"ratio": 1e-3} if name in ("dragonn", "dgc", "graddrop", "topk") else {}
    x = _x(2_000_000, seed=7).view(1000, 2000)

    def run():
        comp = build_compressor(name, **kwargs)
        comp.begin_step(3, 0.0)
        payload, ctx = comp.compress(x, "w")
        return payload, comp.decompress(payload, ctx)

    p1, d1 = run()
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")
    p2, d2 = run()
    if name in ("dgc", "graddrop", "topk"):  # same set, the kernel's compaction order differs
        order1, order2 = p1[1].argsort(), p2[1].argsort()
        assert torch.equal(p1[1][order1], p2[1][order2]) and torch.equal(p1[0][order1], p2[0][order2])
    else:
        for a, b in zip(p1, p2, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=0)  # signsgd's scale: a GPU sum
    torch.testing.assert_close(d1, d2, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["qsgd", "terngrad", "tbq"])
def test_quantizers_dispatch_to_their_kernels(name):
    """On CUDA the quantizers run the kernels: payload == the twins' codes from the same seed."""
    x = _x(300_001, seed=11)
    comp = build_compressor(name)
    comp.begin_step(2, 0.0)
    payload, ctx = comp.compress(x, "w")
    seed = packing.noise_seed(0, 2, "w")
    if name == "qsgd":
        norms = twins.bucket_norms(x, comp.bucket_size)
        codes = twins.qsgd_codes(x, twins.qsgd_scale(norms, comp.levels), comp.levels, comp.bucket_size, seed)
        assert torch.equal(payload[0], packing.pack_uint(codes, comp.bits))
        torch.testing.assert_close(payload[1], norms)
    elif name == "terngrad":
        assert torch.equal(payload[0], twins.terngrad_codes(x, payload[1], seed))
    else:
        residual = torch.zeros_like(x)
        assert torch.equal(payload[0], twins.tbq_step(residual, x, comp.tau))
        assert torch.equal(comp.residuals["w"], residual)
    assert comp.decompress(payload, ctx).shape == x.shape


@pytest.mark.parametrize("poison", [None, float("nan"), float("inf")])
@pytest.mark.parametrize("n", [1, 3_000_001])
def test_dragonn_select_sets_the_nonfinite_flag_as_the_twin(n, poison):
    x = _x(n, seed=n)
    if poison is not None:
        x[n // 2] = poison
    flag = torch.zeros(1, dtype=torch.int32, device=DEV)
    table = ops.dragonn_select(x, 1.5, max(4, n // 250), 7, nonfinite=flag)
    assert torch.equal(table, ops.dragonn_select(x, 1.5, max(4, n // 250), 7))  # the check changes nothing
    assert torch.equal(flag, twins.nonfinite(x))
