"""The one-pass Adam keeps each parameter's step count on the host (`optim.optimizers._OnePassAdam`):
the state's float32 step tensor is read once after a build or a load, never per step (a host wait on
a GPU), and the counts follow torch's own steps (dense .grads); the state_dict is torch's, so a
checkpoint saved before the host count existed loads and continues bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch

from compbench.codec.base import make_ctx
from compbench.compressors.sparse import sparse_decode_all
from compbench.kernels import cpu
from compbench.optim.optimizers import build_optimizer, param_groups
from tests.unit.test_fused_optimizer import _model, _payloads

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())
OPTIM = {"name": "adamw", "lr": 1e-2, "betas": [0.9, 0.999], "weight_decay": 0.05, "fused": True}


def _grads(model: torch.nn.Module, step: int) -> None:
    """Sparse .grads (the averaged payload) on even steps, dense ones (torch's step) on odd steps."""
    for p in model.parameters():
        payloads = _payloads(tuple(p.shape), 10 * step + p.dim())
        grad = sparse_decode_all(payloads, make_ctx(p, "p"))
        p.grad = grad.to_sparse().coalesce() if step % 2 == 0 else grad


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        _grads(model, step)
        opt.step()


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return build_optimizer(param_groups(model, False, lambda p: True, OPTIM), **OPTIM)


def _trained(steps: range) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = _model()
    opt = _optimizer(model)
    _train(model, opt, steps)
    return model, opt


def _flat(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [opt.state[p][key] for p in model.parameters() for key in sorted(opt.state[p])]
    return [p.detach().clone() for p in model.parameters()] + state


@needs_kernels
def test_a_loaded_checkpoint_continues_bit_for_bit(monkeypatch):
    monkeypatch.setenv("COMPBENCH_KERNELS", "1")
    straight, opt = _trained(range(6))
    first, opt1 = _trained(range(3))
    saved = copy.deepcopy(opt1.state_dict())  # torch's format: the float32 step tensor, as before
    assert all(s["step"].dtype == torch.float32 and s["step"].dim() == 0 for s in saved["state"].values())
    resumed = _model()
    with torch.no_grad():
        for a, b in zip(resumed.parameters(), first.parameters(), strict=True):
            a.copy_(b)
    opt2 = _optimizer(resumed)
    opt2.load_state_dict(saved)
    _train(resumed, opt2, range(3, 6))
    for a, b in zip(_flat(resumed, opt2), _flat(straight, opt), strict=True):
        assert torch.equal(a, b)


@needs_kernels
def test_the_step_tensor_is_read_once_not_every_step(monkeypatch):
    monkeypatch.setenv("COMPBENCH_KERNELS", "1")
    model, opt = _trained(range(3))
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    reads = []
    real = torch.Tensor.__float__

    def counted(t: torch.Tensor) -> float:
        reads.append(t.shape)
        return real(t)

    monkeypatch.setattr(torch.Tensor, "__float__", counted)
    _train(model, opt, range(3, 9))
    params = len(list(model.parameters()))
    assert len(reads) == params  # one read per parameter after the load, none per step
    steps = [opt.state[p]["step"] for p in model.parameters()]
    assert [real(s) for s in steps] == [9.0] * params  # torch's steps and the one-pass steps both counted
    assert [opt._host_steps[p] for p in model.parameters()] == [9.0] * params  # and the host's count
