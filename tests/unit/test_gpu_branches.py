"""The fused passes' CUDA branches run on the CPU: `cuda_kernels_enabled` forced true and the CUDA
launchers (`kernels.ops`) replaced by twins built on the CPU kernels they mirror (which the host shim
and tests/gpu check bit for bit against the CUDA sources). What this checks is the wiring that only a
GPU would otherwise run: the memory's deferred compensation fused with DRAGONN's selection and
DGC's strided sample (`codec.deferred.Deferred`), and the one-pass optimizer steps
(`optim.optimizers.one_pass_kernels`): the same payload bytes, memory state and parameters as the
CPU's branch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from compbench.codec import deferred
from compbench.comm.base import encode
from compbench.kernels import cpu, ops
from compbench.kernels.hashing import murmur3_32
from compbench.memory import base as memory_base
from compbench.optim import optimizers
from compbench.records.stats import StepStats
from tests.unit.test_fused_memory import COMPRESSORS, MEMORIES, _grad
from tests.unit.test_fused_optimizer import OPTIMS, _run

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def _compensate_select_twin(a, b, g, kind, c0, c1, scale, threshold=0.0, slots=0, seed=0, nonfinite=None):
    """`ops.compensate_select` on the CPU kernel: the state updated in place and DRAGONN's int32 table
    (slot murmur3_32(i, seed) % slots holds the largest i that hashed there, -1 empty); the flag."""
    picked = cpu.compensate_select(a, b, g, kind, c0, c1, scale, threshold, slots, seed, nonfinite=nonfinite)
    table = torch.full((max(slots, 1),), -1, dtype=torch.int32)
    if slots:
        table[murmur3_32(picked, seed) % slots] = picked.to(torch.int32)
    return table if slots else table[:0]


def _take_cuda_branches(monkeypatch) -> dict[str, int]:
    """From now on the CUDA branches are taken on CPU tensors; returns the calls each twin sees."""
    calls = {"compensate_select": 0, "compensate_at": 0, "sgd_step": 0, "adam_step": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    for module in (deferred, memory_base, optimizers):
        monkeypatch.setattr(module, "cuda_kernels_enabled", lambda t: t.device.type == "cpu")
    monkeypatch.setattr(memory_base, "cpu", SimpleNamespace(enabled=lambda t: False))
    monkeypatch.setattr(optimizers, "cpu", SimpleNamespace(enabled=lambda t: False,
                                                           fused_sgd_tail=cpu.fused_sgd_tail))
    monkeypatch.setattr(ops, "compensate_select", counted("compensate_select", _compensate_select_twin))
    monkeypatch.setattr(ops, "compensate_at", counted("compensate_at", cpu.compensate_at))
    monkeypatch.setattr(ops, "sgd_step", counted("sgd_step", cpu.sgd_step))
    monkeypatch.setattr(ops, "adam_step", counted("adam_step", cpu.adam_step))
    return calls


def _encode_steps(comp: str, mem: str) -> list:
    compressor, memory = COMPRESSORS[comp](), MEMORIES[mem]()
    stats, out = StepStats(), []
    for step in range(4):
        compressor.begin_step(step, 0.0)
        payload, _ = encode(compressor, memory, _grad((300, 701), step), "w", stats)
        out += [t.clone() for t in payload]
        out += [t.clone() for d in memory.state_dict().values() for t in d.values()]
    return out


@needs_kernels
@pytest.mark.parametrize("comp, mem", [("dragonn", "residual"), ("dragonn", "residual_decay"),
                                       ("topk", "residual"), ("dgc", "dgc"), ("dgc", "dgc_nesterov_clipped")])
def test_the_fused_memory_takes_its_cuda_branch_with_the_cpu_bytes(monkeypatch, comp, mem):
    want = _encode_steps(comp, mem)
    calls = _take_cuda_branches(monkeypatch)
    got = _encode_steps(comp, mem)
    assert calls["compensate_select"] == 3  # steps 1-3: the first step creates the state, unfused
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (comp, mem)


@needs_kernels
@pytest.mark.parametrize("which", ["dgc_sgd", "dgc_sgd_nesterov", "sgd_momentum", "sgd_plain"])
def test_the_one_pass_optimizer_takes_its_cuda_branch_with_the_twin_bytes(monkeypatch, which):
    settings, dgc = OPTIMS[which]
    optim = {"name": "sgd", "lr": 0.1, "nesterov": False, "fused": False, **settings}
    want = _run(monkeypatch, optim, dgc, sparse=True, kernels=False)
    calls = _take_cuda_branches(monkeypatch)
    got = _run(monkeypatch, optim, dgc, sparse=True, kernels=True)
    assert calls["sgd_step"] > 0
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), which
