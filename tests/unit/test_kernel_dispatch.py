"""The quantizers' CUDA branches, run on the CPU with the kernels replaced by their pure-torch twins
(the twins give the kernels' very bits: tests/unit/test_kernel_logic_host.py). This checks the
wiring (scales, seeds, residual update, payload layout) that tests/gpu checks on a real GPU."""

from __future__ import annotations

import pytest
import torch

from compbench.codec import packing
from compbench.compressors import build_compressor, qsgd, tbq, terngrad
from compbench.kernels import ops, twins


@pytest.fixture
def twin_kernels(monkeypatch):
    for module in (qsgd, terngrad, tbq):
        monkeypatch.setattr(module, "cuda_kernels_enabled", lambda t: True)
    monkeypatch.setattr(ops, "qsgd_codes", twins.qsgd_codes)
    monkeypatch.setattr(ops, "terngrad_codes", twins.terngrad_codes)
    monkeypatch.setattr(ops, "tbq_step", twins.tbq_step)


@pytest.mark.parametrize("name", ["qsgd", "terngrad", "tbq"])
def test_kernel_branch_round_trip_matches_the_cpu_path(name, twin_kernels):
    """Same wire bytes and layout as the CPU path, and a decode close to x (noise streams differ)."""
    x = torch.randn(10_007, generator=torch.Generator().manual_seed(0)) * 0.05
    comp = build_compressor(name)
    comp.begin_step(1, 0.0)
    payload, ctx = comp.compress(x, "w")
    assert sum(p.numel() * p.element_size() for p in payload) == comp.wire_bytes(x.numel())
    decoded = comp.decompress(payload, ctx)
    if name == "qsgd":  # unbiased, 8-bit codes: within a level of x
        step = payload[1].repeat_interleave(comp.bucket_size)[: x.numel()] / comp.levels
        assert bool(((decoded - x).abs() <= step * (1 + 1e-5)).all())
    elif name == "terngrad":
        assert set(decoded.unique().tolist()) <= {-payload[1].item(), 0.0, payload[1].item()}
    else:  # tbq: what was not sent stays in the residual
        torch.testing.assert_close(decoded + comp.residuals["w"], x)


def test_qsgd_kernel_branch_uses_the_counter_stream_of_the_noise_seed(twin_kernels):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(1))
    comp = build_compressor("qsgd", levels=7, bucket_size=128)
    comp.begin_step(4, 0.0)
    payload, _ = comp.compress(x, "layer")
    norms = twins.bucket_norms(x, 128)
    codes = twins.qsgd_codes(x, twins.qsgd_scale(norms, 7), 7, 128, packing.noise_seed(0, 4, "layer"))
    assert torch.equal(payload[0], packing.pack_uint(codes, comp.bits))
    torch.testing.assert_close(payload[1], norms)
