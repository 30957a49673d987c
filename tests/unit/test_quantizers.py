"""Quantizers and their wire codes: bit packing, QSGD, TernGrad, 1-bit, signSGD, Signum, TBQ."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from compbench.codec import packing
from compbench.codec.packing import (
    decode_2bit,
    decode_bits,
    pack_2bit,
    pack_bits,
    pack_uint,
    unpack_2bit,
    unpack_bits,
    unpack_uint,
)
from compbench.compressors.efsignsgd import EFSignSGD
from compbench.compressors.onebit import OneBit
from compbench.compressors.qsgd import QSGD
from compbench.compressors.signsgd import SignSGD
from compbench.compressors.signum import Signum
from compbench.compressors.tbq import TBQ
from compbench.compressors.terngrad import TernGrad
from tests.helpers import encode_statistics

SIZES = [1, 7, 8, 9, 1000, 131073]


@pytest.fixture(params=["numpy", "torch"])
def path(request, monkeypatch):
    """Run a packing test through the CPU (numpy) path and through the device-agnostic torch path."""
    if request.param == "torch":
        monkeypatch.setattr(packing, "_on_cpu", lambda t: False)
    return request.param


def _reference_stream(codes: np.ndarray, bits: int) -> np.ndarray:
    """The documented layout, written the slow obvious way: bit j of code i is stream bit i*bits + j."""
    stream = ((codes[:, None].astype(np.int64) >> np.arange(bits)) & 1).reshape(-1).astype(np.uint8)
    return np.packbits(stream, bitorder="little")


@pytest.mark.parametrize("n", SIZES)
def test_pack_bits_round_trip_and_layout(n, path):
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) < 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.shape == (math.ceil(n / 8),)
    np.testing.assert_array_equal(packed.numpy(), _reference_stream(mask.numpy().astype(np.uint8), 1))
    assert torch.equal(unpack_bits(packed, n), mask)


def test_pack_bits_bit_order():
    mask = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 0, 1], dtype=torch.bool)
    assert pack_bits(mask).tolist() == [0b10000001, 0b10]


@pytest.mark.parametrize("n", SIZES)
def test_pack_2bit_round_trip_and_layout(n, path):
    codes = torch.randint(0, 4, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    packed = pack_2bit(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (math.ceil(n / 4),)
    np.testing.assert_array_equal(packed.numpy(), _reference_stream(codes.numpy(), 2))
    assert torch.equal(unpack_2bit(packed, n), codes)


def test_pack_2bit_hand_made():
    codes = torch.tensor([1, 2, 3, 0, 3], dtype=torch.uint8)
    assert pack_2bit(codes).tolist() == [1 | 2 << 2 | 3 << 4, 3]


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 9, 1000])
def test_pack_uint_round_trip_every_width(bits, n, path):
    codes = torch.randint(
        0, 1 << bits, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(bits)
    )
    packed = pack_uint(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n * bits / 8)
    np.testing.assert_array_equal(packed.numpy(), _reference_stream(codes.numpy(), bits))
    assert torch.equal(unpack_uint(packed, bits, n), codes)


def test_table_decoders_with_and_without_out():
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    one, zero = torch.tensor([-2.5]), torch.tensor([4.0])
    expected = torch.where(mask, -2.5, 4.0)
    assert torch.equal(decode_bits(pack_bits(mask), 9, one, zero), expected)
    out = torch.full((16,), float("nan"))
    assert torch.equal(decode_bits(pack_bits(mask), 9, one, zero, out=out), expected)
    codes = torch.tensor([0, 1, 2, 3, 3, 1], dtype=torch.uint8)
    values = torch.tensor([0.0, 1.5, 7.0, -1.5])
    assert torch.equal(decode_2bit(pack_2bit(codes), 6, values), values[codes.long()])


def test_bad_packing_arguments():
    with pytest.raises(ValueError, match="bits=9"):
        pack_uint(torch.zeros(3, dtype=torch.uint8), 9)
    with pytest.raises(ValueError, match="cannot hold"):
        unpack_bits(torch.zeros(1, dtype=torch.uint8), 9)
    with pytest.raises(TypeError):
        pack_bits(torch.zeros(3))


# --- QSGD ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("levels,bits", [(1, 2), (2, 3), (3, 3), (7, 4), (12, 5), (127, 8)])
@pytest.mark.parametrize("n", [1, 7, 1000, 1031])
def test_qsgd_wire_bytes_and_grid(levels, bits, n):
    comp = QSGD(levels=levels, bucket_size=100)
    assert comp.bits == bits
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    payload, ctx = comp.compress(x, "w")
    buckets = math.ceil(n / 100)
    assert [t.dtype for t in payload] == [torch.uint8, torch.float32]
    assert payload[0].numel() == math.ceil(n * bits / 8) and payload[1].numel() == buckets
    assert comp.wire_bytes(n) == math.ceil(n * bits / 8) + 4 * buckets
    # Every decoded value is sign(x) * level * norm / s with an integer level in 0..s.
    out = comp.decompress(payload, ctx)
    norms = torch.cat([x[i : i + 100].norm().reshape(1) for i in range(0, n, 100)])
    torch.testing.assert_close(payload[1], norms)
    level = out * levels / norms.repeat_interleave(100)[:n]
    torch.testing.assert_close(level, level.round(), atol=1e-4, rtol=0)
    assert level.abs().max() <= levels + 1e-4
    assert ((out * x) >= 0).all(), "a decoded value never has the opposite sign"


def test_qsgd_unbiased_coarse_levels():
    """s = 2 and short buckets: large rounding noise, so a bias would show."""
    comp = QSGD(levels=2, bucket_size=16, seed=3)
    x = torch.randn(300, generator=torch.Generator().manual_seed(7))
    _assert_unbiased(comp, x, trials=3000)


def test_qsgd_noise_depends_on_step_name_and_rank(monkeypatch):
    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    monkeypatch.delenv("PMI_RANK", raising=False)
    monkeypatch.setenv("RANK", "0")
    comp = QSGD(levels=3)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    first = comp.compress(x, "w")[0][0]
    assert torch.equal(comp.compress(x, "w")[0][0], first), "same (seed, rank, step, name): same codes"
    assert not torch.equal(comp.compress(x, "b")[0][0], first)
    comp.begin_step(1, 0.0)
    assert not torch.equal(comp.compress(x, "w")[0][0], first)
    comp.begin_step(0, 0.0)
    monkeypatch.setenv("RANK", "1")
    assert not torch.equal(comp.compress(x, "w")[0][0], first), "ranks must not share rounding noise"


def test_qsgd_zero_tensor_and_exact_levels():
    comp = QSGD(levels=4, bucket_size=8)
    zero = torch.zeros(10)
    payload, ctx = comp.compress(zero, "z")
    assert torch.equal(comp.decompress(payload, ctx), zero)
    # |x| / norm on the grid: no rounding at all.
    x = torch.tensor([3.0, -4.0, 0.0, 0.0])  # norm 5, s*|x|/norm = 2.4, 3.2: not on the grid
    y = torch.tensor([0.0, -5.0, 0.0, 0.0])  # s*|y|/norm = 4 exactly
    payload, ctx = comp.compress(y, "y")
    assert torch.equal(comp.decompress(payload, ctx), y)
    out = comp.decompress(*comp.compress(x, "x"))
    assert out[0].item() in (2 * 5 / 4, 3 * 5 / 4) and out[1].item() in (-3 * 5 / 4, -4 * 5 / 4)


# --- TernGrad ------------------------------------------------------------------------------------


def test_terngrad_unbiased_without_clipping():
    comp = TernGrad(clip=False, seed=1)
    assert comp.caps.unbiased and not TernGrad().caps.unbiased
    x = torch.randn(20, 30, generator=torch.Generator().manual_seed(11))
    _assert_unbiased(comp, x, trials=3000)


def test_terngrad_scale_and_clipping():
    x = torch.randn(4000, generator=torch.Generator().manual_seed(2))
    x[0] = 50.0  # an outlier far beyond 2.5 sigma
    sigma = x.std(correction=0)
    for clip, expected in [(False, torch.tensor(50.0)), (True, 2.5 * sigma)]:
        comp = TernGrad(clip=clip)
        payload, ctx = comp.compress(x, "w")
        assert payload[0].numel() == 1000 and payload[1].shape == (1,)
        torch.testing.assert_close(payload[1][0], expected)
        out = comp.decompress(payload, ctx)
        assert set(out.unique().tolist()) <= {-expected.item(), 0.0, expected.item()}
        assert out[0] == expected, "elements beyond the clip bound are always sent"
        assert ((out * x) >= 0).all()


# --- 1-bit, signSGD, EF-signSGD ------------------------------------------------------------------


def test_onebit_decodes_to_the_two_means():
    comp = OneBit()
    x = torch.tensor([[-3.0, 2.0, 0.0], [4.0, -1.0, 6.0]])
    payload, ctx = comp.compress(x, "w")
    assert payload[0].tolist() == [0b10001] and payload[1].tolist() == [-2.0, 3.0]
    torch.testing.assert_close(
        comp.decompress(payload, ctx), torch.tensor([[-2.0, 3.0, 3.0], [3.0, -2.0, 3.0]])
    )
    # One side empty: its mean is 0 and nothing decodes to it.
    payload, ctx = comp.compress(torch.tensor([1.0, 2.0]), "p")
    assert payload[1].tolist() == [0.0, 1.5]
    assert comp.decompress(payload, ctx).tolist() == [1.5, 1.5]


@pytest.mark.parametrize("cls", [SignSGD, EFSignSGD])
def test_signsgd_scale_and_signs(cls):
    comp = cls()
    x = torch.tensor([-2.0, 0.0, 3.0, -1.0, 0.5])
    payload, ctx = comp.compress(x, "w")
    assert payload[0].tolist() == [0b1001] and payload[1].tolist() == [pytest.approx(1.3)]
    torch.testing.assert_close(comp.decompress(payload, ctx), torch.tensor([-1.3, 1.3, 1.3, -1.3, 1.3]))
    assert comp.wire_bytes(5) == 1 + 4


# --- Signum --------------------------------------------------------------------------------------


def test_signum_majority_vote_of_three_ranks():
    grads = torch.tensor(
        [
            [1.0, 2.0, -1.0, -3.0, 0.5, 1.0],
            [1.0, -2.0, -1.0, 3.0, 0.5, -1.0],
            [-1.0, -2.0, -1.0, 3.0, 0.5, -1.0],
        ]
    )
    payloads = []
    for g in grads:  # each rank its own compressor (momentum state)
        payload, ctx = Signum().compress(g, "w")
        assert payload[0].numel() == 1 and payload[0].dtype == torch.uint8
        payloads.append(payload)
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    comp = Signum()
    assert torch.equal(comp.decompress_all(payloads, ctx), expected)
    assert torch.equal(comp.aggregate([comp.decompress(p, ctx) for p in payloads]), expected)
    # Two ranks that disagree tie: vote 0.
    tie = comp.decompress_all(payloads[:2], ctx)
    assert torch.equal(tie, torch.tensor([1.0, 0.0, -1.0, 0.0, 1.0, 0.0]))


def test_signum_momentum_and_state_dict():
    comp = Signum(beta=0.9)
    comp.compress(torch.tensor([1.0, -1.0]), "w")  # m = [0.1, -0.1]
    payload, ctx = comp.compress(torch.tensor([-0.5, -0.5]), "w")  # m = [0.04, -0.14]
    torch.testing.assert_close(comp.momentum["w"], torch.tensor([0.04, -0.14]))
    assert comp.decompress(payload, ctx).tolist() == [1.0, -1.0], "the sign of the momentum, not of g"
    other = Signum()
    other.load_state_dict(comp.state_dict())
    assert torch.equal(other.momentum["w"], comp.momentum["w"])
    assert other.compress(torch.tensor([-1.0, 2.0]), "w")[0][0].tolist() == [0b01]  # m = [-0.064, 0.074]


# --- TBQ -----------------------------------------------------------------------------------------


def test_tbq_residual_arithmetic():
    comp = TBQ(tau=1.0)
    payload, ctx = comp.compress(torch.tensor([0.5, 1.0, -1.0, 2.5, -0.25, -3.0]), "w")
    assert payload[0].numel() == 2 and comp.wire_bytes(6) == 2 and len(payload) == 1
    assert comp.decompress(payload, ctx).tolist() == [0.0, 1.0, -1.0, 1.0, 0.0, -1.0]
    assert comp.residuals["w"].tolist() == [0.5, 0.0, 0.0, 1.5, -0.25, -2.0]
    payload, ctx = comp.compress(torch.tensor([0.75, 0.0, 0.0, 0.0, -1.0, 0.0]), "w")
    assert comp.decompress(payload, ctx).tolist() == [1.0, 0.0, 0.0, 1.0, -1.0, -1.0]
    assert comp.residuals["w"].tolist() == [0.25, 0.0, 0.0, 0.5, -0.25, -1.0]
    other = TBQ(tau=1.0)
    other.load_state_dict(comp.state_dict())
    assert torch.equal(other.residuals["w"], comp.residuals["w"])


def test_tbq_conserves_the_sum_of_gradients():
    """Everything not sent stays in the residual: sum of sent + residual = sum of gradients."""
    comp = TBQ(tau=0.05)
    gen = torch.Generator().manual_seed(4)
    total_g, total_sent = torch.zeros(999), torch.zeros(999)
    for _ in range(20):
        g = 0.03 * torch.randn(999, generator=gen)
        payload, ctx = comp.compress(g, "w")
        total_g += g
        total_sent += comp.decompress(payload, ctx)
    torch.testing.assert_close(total_sent + comp.residuals["w"], total_g, atol=1e-5, rtol=0)
    assert total_sent.abs().sum() > 0, "something was sent"


# --- every compressor ----------------------------------------------------------------------------

ALL = [QSGD, TernGrad, OneBit, SignSGD, EFSignSGD, Signum, TBQ]


@pytest.mark.parametrize("cls", [OneBit, SignSGD, Signum, TBQ])
def test_device_agnostic_torch_path_gives_the_same_payload(cls, monkeypatch):
    """The CUDA code path (forced here on CPU) must produce the very bytes of the numpy path."""
    x = torch.randn(37, 29, generator=torch.Generator().manual_seed(5)) * 0.02
    expected_payload, ctx = cls().compress(x, "w")
    expected = cls().decompress(expected_payload, ctx)
    monkeypatch.setattr(packing, "_on_cpu", lambda t: False)
    payload, ctx = cls().compress(x, "w")
    for got, want in zip(payload, expected_payload, strict=True):
        assert torch.equal(got, want)
    assert torch.equal(cls().decompress(payload, ctx), expected)
    monkeypatch.undo()
    expected_all = cls().decompress_all([expected_payload, expected_payload], ctx)
    monkeypatch.setattr(packing, "_on_cpu", lambda t: False)
    assert torch.equal(cls().decompress_all([payload, payload], ctx), expected_all)


@pytest.mark.parametrize("cls", [QSGD, TernGrad])
def test_torch_noise_path_round_trip(cls, monkeypatch):
    monkeypatch.setattr(packing, "_on_cpu", lambda t: False)
    comp = cls()
    x = torch.randn(1000, generator=torch.Generator().manual_seed(6))
    payload, ctx = comp.compress(x, "w")
    out = comp.decompress(payload, ctx)
    assert sum(t.numel() * t.element_size() for t in payload) == comp.wire_bytes(1000)
    assert ((out * x) >= 0).all() and (out != 0).any()


@pytest.mark.parametrize("cls", ALL)
def test_empty_tensor(cls):
    comp = cls()
    payload, ctx = comp.compress(torch.zeros(0, 3), "e")
    assert sum(t.numel() * t.element_size() for t in payload) == comp.wire_bytes(0)
    assert comp.decompress(payload, ctx).shape == (0, 3)
    assert comp.decompress_all([payload, payload], ctx).shape == (0, 3)


def test_signum_vote_counts_beyond_255_ranks():
    ctx = Signum().compress(torch.zeros(3), "w")[1]
    plus = Signum().compress(torch.tensor([1.0, 1.0, -1.0]), "w")[0]
    minus = Signum().compress(torch.tensor([-1.0, 1.0, 1.0]), "w")[0]
    vote = Signum().decompress_all([plus] * 200 + [minus] * 101, ctx)
    assert vote.tolist() == [1.0, 1.0, -1.0]


# --- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build,param",
    [
        (lambda: QSGD(levels=0), "levels=0"),
        (lambda: QSGD(levels=128), "levels=128"),
        (lambda: QSGD(levels=2.5), "levels=2.5"),
        (lambda: QSGD(bucket_size=0), "bucket_size=0"),
        (lambda: TernGrad(clip_sigma=0), "clip_sigma=0"),
        (lambda: TernGrad(clip="yes"), "clip=yes"),
        (lambda: Signum(beta=1.0), "beta=1.0"),
        (lambda: Signum(beta=-0.1), "beta=-0.1"),
        (lambda: TBQ(tau=0), "tau=0"),
        (lambda: TBQ(tau=-0.5), "tau=-0.5"),
    ],
)
def test_bad_parameters_name_the_parameter(build, param):
    with pytest.raises(ValueError, match=f"compressor=[a-z]+: {param} "):
        build()


def _assert_unbiased(comp, x: torch.Tensor, trials: int) -> None:
    mean, se = encode_statistics(comp, x, trials)
    z = (mean - x.double()).abs() / (se + 1e-12)
    # 4.5 SE two-sided: ~7e-6 per element by chance; a biased rounding puts many elements far out.
    assert (z > 4.5).float().mean() < 2e-3, f"{(z > 4.5).float().mean():.4%} of elements beyond 4.5 SE"
    # The average error across elements is also centred: a bias shared by all elements shows here.
    assert abs(((mean - x.double()) / (se + 1e-12)).mean().item()) < 4.5 / math.sqrt(x.numel()) * 1.5
