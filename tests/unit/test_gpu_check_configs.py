"""The GPU check's device-only logic on this CPU (issue 48): every configuration scripts/gpu_check.py
runs composes and passes the config check under a faked CUDA with Horovod unimportable (the lent GPU
machine has no Horovod), and the Horovod CUDA check asks for the capability that matters (NCCL)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from compbench.compose import config
from compbench.engines import device

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch sees one CUDA GPU with bf16 (nothing is placed on it: the config check only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def _fake_horovod(monkeypatch, cuda: bool, nccl: bool) -> None:
    package, module = types.ModuleType("horovod"), types.ModuleType("horovod.torch")
    module.cuda_built = lambda: cuda  # type: ignore[attr-defined]
    module.nccl_built = lambda: nccl  # type: ignore[attr-defined]
    package.torch = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.torch", module)


@pytest.mark.parametrize("cuda,nccl,refused", [(True, False, True), (True, True, False), (False, True, False)])
def test_the_horovod_cuda_check_asks_for_nccl(monkeypatch, cuda, nccl, refused):
    """CUDA tensors reach Horovod's NCCL path: a CUDA build without NCCL is refused, an NCCL build
    taken, whatever `cuda_built` says."""
    _fake_horovod(monkeypatch, cuda, nccl)
    placement = device.Placement("cuda", 1, 1, "test")
    if refused:
        with pytest.raises(ValueError, match="^engine=horovod was built without NCCL"):
            device._check_horovod_cuda(placement)
    else:
        device._check_horovod_cuda(placement)
