"""The sharded collectives' quantizers (compbench.codec.blockquant) on the GPU against the CPU: the
same codes and scales, byte for byte, for the deterministic formats (marker gpu: skipped without
CUDA); LoCo's compensation keeps the same error on both."""

from __future__ import annotations

import pytest
import torch

from compbench.codec.blockquant import BlockFormat, ErrorCompensated, decode, encode

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
FORMATS = [BlockFormat("int8"), BlockFormat("int4"), BlockFormat("fp8_e4m3"),
           BlockFormat("fp8_e4m3", block=0), BlockFormat("int8", scale_dtype=torch.bfloat16),
           BlockFormat("int4", block=64)]


def _x(n: int = 10_000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(3)) * 5


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_the_device_encodes_the_cpus_bytes(fmt):
    x = _x()
    on_cpu, on_gpu = encode(x, fmt), encode(x.to(DEV), fmt)
    assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.uint8
    assert torch.equal(on_gpu.cpu(), on_cpu)
    assert torch.equal(decode(on_gpu, x.numel(), fmt).cpu(), decode(on_cpu, x.numel(), fmt))


def test_locos_error_is_the_same_on_the_device():
    cpu, gpu = ErrorCompensated(BlockFormat("int4")), ErrorCompensated(BlockFormat("int4"))
    for step in range(4):
        g = _x() + step
        assert torch.equal(gpu.encode(g.to(DEV)).cpu(), cpu.encode(g))
