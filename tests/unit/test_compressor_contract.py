"""Contract tests, parametrized over the registry: a new compressor is tested without new test code."""

from __future__ import annotations

import math

import pytest
import torch

from compbench.catalog import registry
from compbench.compressors import build_compressor, payload_nbytes
from compbench.memory.residual import ResidualMemory
from tests.helpers import encode_statistics

NAMES = registry.options("compressor")
# Odd sizes on purpose: n=1, n=7 and one past a power-of-two boundary (DRAGONN's 131072 rule).
SHAPES = [(1,), (7,), (3, 5), (64, 33), (131073,), (16, 8, 3, 3)]


def _make(name: str):
    return build_compressor(name)


def _data(shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_keeps_shape_dtype_device(name, shape):
    comp = _make(name)
    comp.begin_step(0, 0.0)
    x = _data(shape)
    payload, ctx = comp.compress(x.clone(), "t")
    out = comp.decompress(payload, ctx)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert torch.isfinite(out).all()
    for t in payload:
        assert t.dim() >= 1, "scalars travel as 1-element tensors (0-dim tensors break Horovod allgather)"
        assert t.is_contiguous()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_exact_wire_bytes(name, shape):
    comp = _make(name)
    comp.begin_step(0, 0.0)
    n = math.prod(shape)
    payload, _ = comp.compress(_data(shape, 1), "t")
    sent = payload_nbytes(payload)
    exact = comp.wire_bytes(n)
    if exact is not None:
        assert sent == exact, f"{name} sent {sent} bytes for n={n}, the formula says {exact}"
    assert sent <= comp.max_wire_bytes(n)


@pytest.mark.parametrize("name", NAMES)
def test_error_feedback_invariant(name):
    comp = _make(name)
    comp.begin_step(0, 0.0)
    mem = ResidualMemory()
    g = _data((64, 33), 2)
    x = mem.compensate(g, "w")
    compressed = x.clone()  # x is the memory's own buffer, which update turns into the residual
    payload, ctx = comp.compress(x, "w")
    torch.testing.assert_close(x, compressed, rtol=0, atol=0)  # compressors leave their input alone
    mem.update(x, "w", comp, payload, ctx)
    torch.testing.assert_close(mem.residuals["w"], compressed - comp.decompress(payload, ctx))
    # Second step adds the residual back.
    residual = mem.residuals["w"].clone()
    x2 = mem.compensate(g, "w")
    torch.testing.assert_close(x2, g + residual)


@pytest.mark.parametrize("name", NAMES)
def test_decompress_all_averages(name):
    comp = _make(name)
    comp.begin_step(0, 0.0)
    a, b = _data((40, 25), 3), _data((40, 25), 4)
    pa, ctx = comp.compress(a, "t")
    pb, _ = comp.compress(b, "t")
    expected = comp.aggregate([comp.decompress(pa, ctx), comp.decompress(pb, ctx)])
    torch.testing.assert_close(comp.decompress_all([pa, pb], ctx), expected)
    if comp.caps.decodes_into:  # declared: the same average lands in the caller's buffer
        out = torch.full((a.numel(),), float("nan"))
        got = comp.decompress_all([pa, pb], ctx, out=out)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got.view(expected.shape), expected)


@pytest.mark.parametrize("name", [n for n in NAMES if _make(n).caps.unbiased])
def test_unbiased_mean_within_4_standard_errors(name):
    comp = _make(name)
    x = _data((20, 30), 5)
    mean, se = encode_statistics(comp, x, trials=2000)
    # Elements whose estimate is deterministic have se == 0 and must be exact.
    bound = 4 * se + 1e-5
    bad = ((mean - x.double()).abs() > bound).float().mean().item()
    # 4 SE two-sided: ~6e-5 of elements may fail by chance; allow a little slack.
    assert bad < 2e-3, f"{name}: {bad:.4%} of elements outside 4 standard errors"


# Quality bounds: mean over DRAWS draws of x ~ scale * N(0, 1) of shape QUALITY_SHAPE, each with a
# fresh compressor past every warm-up (step 1000), of
#   error = ||x - D(C(x))||^2 / ||x||^2   and   alignment = <x, D(C(x))> / ||x||^2.
# Every entry is (max error, min alignment, data scale), from the compressor's definition at its
# default settings; slack covers the finite sample. Every min alignment is > 0, so a compressor that
# decodes to zeros (error 1, alignment 0) fails, whatever its error bound.
# Gaussian facts used: top fraction r by magnitude holds r + 2 t phi(t) of the energy, t = Phi^-1(1 - r/2)
# (r = 0.01: 0.0845; r = 0.005: 0.0489); E|x| = sqrt(2/pi) E[x^2]^(1/2); phi(1) = 0.2420, P(|x| > 1) = 0.3173.
QUALITY_SHAPE, DRAWS = (64, 2048), 8
QUALITY: dict[str, tuple[float, float, float]] = {
    "none": (0.0, 1.0, 1.0),  # lossless
    "fp16": (2.0**-22, 1 - 2.0**-11, 1.0),  # fp16 rounds each entry to a relative 2^-11
    "topk": (1 - 0.0845 + 0.01, 0.0845 - 0.01, 1.0),  # keeps exactly the top 1%: their energy 0.0845
    # Sampled thresholds keep ~1% (dgc at most k): bound by keeping at least the top 0.5% (0.0489).
    "dgc": (1 - 0.0489 + 0.01, 0.0489 - 0.01, 1.0),
    "dragonn": (1 - 0.0489 + 0.01, 0.0489 - 0.01, 1.0),
    "graddrop": (1 - 0.0489 + 0.01, 0.0489 - 0.01, 1.0),
    "randk": (1 - 0.01 + 0.003, 0.01 - 0.003, 1.0),  # a random 1%, unscaled: keeps energy r
    # Top 1/64 of each 64 x 64 chunk (t = 2.418: energy 0.1193), 2-bit codes: every kept value lands in
    # its sign's bin (|v| > scale / 2), decoded to the sign's mean |v| = phi(t) / Q(t) = 2.746 against
    # E[v^2 | tail] = 1 + t phi(t) / Q(t) = 7.64: alignment 0.1193 * 2.746^2 / 7.64 = 0.1178 = 1 - error.
    "sparseloco": (1 - 0.1178 + 0.01, 0.1178 - 0.01, 1.0),
    # An orthonormal DCT keeps N(0, 1) entries N(0, 1): the top 32 of each 64 x 64 chunk's 4096
    # coefficients, r = 1/128 (t = 2.660: energy r + 2 t phi(t) = 0.0695), decoded exactly.
    "chunk_dct": (1 - 0.0695 + 0.01, 0.0695 - 0.01, 1.0),
    # sign(x) * mean|x|: error 1 - 2/pi, alignment 2/pi (onebit: the mean |x| of each sign's half).
    "signsgd": (1 - 2 / math.pi + 0.01, 2 / math.pi - 0.01, 1.0),
    "efsignsgd": (1 - 2 / math.pi + 0.01, 2 / math.pi - 0.01, 1.0),
    "onebit": (1 - 2 / math.pi + 0.01, 2 / math.pi - 0.01, 1.0),
    # sign(x) * RMS(x), RMS = 1: 1 - 2 E|x| + 1 = 2 - 2 sqrt(2/pi), alignment E|x| = sqrt(2/pi).
    "rms_sign": (2 - 2 * math.sqrt(2 / math.pi) + 0.01, math.sqrt(2 / math.pi) - 0.01, 1.0),
    # Signs of +-1 (a direction; first step: momentum is a multiple of x): 2 - 2 sqrt(2/pi), sqrt(2/pi).
    "signum": (2 - 2 * math.sqrt(2 / math.pi) + 0.01, math.sqrt(2 / math.pi) - 0.01, 1.0),
    # +-tau where |x| > tau, tau = 0.01 = the data's std: 1 - 4 phi(1) + P(|x|>1) = 0.349, 2 phi(1) = 0.484.
    "tbq": (1 - 4 * 0.2420 + 0.3173 + 0.01, 2 * 0.2420 - 0.01, 0.01),
    # QSGD's variance bound per bucket of d = 512 at s = 127: min(d / s^2, sqrt(d) / s) = 0.0317; unbiased.
    "qsgd": (min(512 / 127**2, math.sqrt(512) / 127), 1 - 0.01, 1.0),
    # Natural compression: x rounded to a neighbouring power of two, unbiased, variance at most x^2 / 8
    # (|x| = 4/3 2^e); the mean over N(0, 1) is lower.
    "natural": (1 / 8, 1 - 0.01, 1.0),
    # Ternary +-s with s = 2.5 sigma (clipped): variance s E|x| - E x^2 = 2.5 sqrt(2/pi) - 1 = 0.995;
    # unbiased but for the clipped tail (~1% of the energy).
    "terngrad": (2.5 * math.sqrt(2 / math.pi) - 1 + 0.03, 1 - 0.03, 1.0),
    # Rank 1, one power step from a random start: at least the mean energy of a row-space direction,
    # 1/rows = 1/64 (Gaussian M is near-isotropic there, so it is also about what it gets).
    "powersgd": (1 - 1 / 64 + 0.003, 1 / 64 - 0.003, 1.0),
    # Unbiased atom sampling with p_i ~ sigma_i, s = 3: variance (sum sigma)^2 / s - sum sigma^2
    # <= (rank / s - 1) ||x||^2 = 64/3 - 1 (+10%); alignment 1 with sd ~0.56 per draw (0.2 over 8).
    "atomo": ((64 / 3 - 1) * 1.1, 1 - 4 * 0.2, 1.0),
}


def _quality(name: str, scale: float) -> tuple[float, float]:
    errors, alignments = [], []
    for t in range(DRAWS):
        x = _data(QUALITY_SHAPE, 100 + t) * scale
        comp = _make(name)
        comp.begin_step(1000 + t, 100.0)
        payload, ctx = comp.compress(x.clone(), "w")
        out = comp.decompress(payload, ctx).double()
        energy = x.double().square().sum()
        errors.append(((x - out).square().sum() / energy).item())
        alignments.append(((x * out).sum() / energy).item())
    return sum(errors) / DRAWS, sum(alignments) / DRAWS


def _within(bound: tuple[float, float, float], error: float, alignment: float) -> bool:
    max_error, min_alignment, _ = bound
    return error <= max_error + 1e-9 and alignment >= min_alignment - 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_reconstruction_quality_within_its_bound(name):
    assert name in QUALITY, f"compressor={name}: add its (max error, min alignment, scale) to QUALITY"
    bound = QUALITY[name]
    error, alignment = _quality(name, bound[2])
    assert _within(bound, error, alignment), (
        f"{name}: error {error:.4f} (max {bound[0]:.4f}), alignment {alignment:.4f} (min {bound[1]:.4f})")


def test_quality_bounds_refuse_a_decoder_of_zeros():
    assert all(not _within(b, 1.0, 0.0) for b in QUALITY.values())
