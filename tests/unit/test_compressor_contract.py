"""Contract tests, parametrized over the registry: a new compressor is tested without new test code."""

from __future__ import annotations

import math

import pytest
import torch

from compbench import registry
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
    payload, ctx = comp.compress(x, "w")
    mem.update(x, "w", comp, payload, ctx)
    torch.testing.assert_close(mem.residuals["w"], x - comp.decompress(payload, ctx))
    # Second step adds the residual back.
    x2 = mem.compensate(g, "w")
    torch.testing.assert_close(x2, g + mem.residuals["w"])


@pytest.mark.parametrize("name", NAMES)
def test_decompress_all_averages(name):
    comp = _make(name)
    comp.begin_step(0, 0.0)
    a, b = _data((40, 25), 3), _data((40, 25), 4)
    pa, ctx = comp.compress(a, "t")
    pb, _ = comp.compress(b, "t")
    expected = comp.aggregate([comp.decompress(pa, ctx), comp.decompress(pb, ctx)])
    torch.testing.assert_close(comp.decompress_all([pa, pb], ctx), expected)


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
