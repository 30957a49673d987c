"""memory=dgc: compressed tensors get DGC's SGD (momentum on the weight-decay term only), dense tensors
torch's SGD. The expected trajectories are written out by hand, in plain float arithmetic."""

import pytest
import torch
from torch import nn

from compbench.optim.optimizers import build_optimizer, param_groups

LR, M, WD = 0.1, 0.9, 5e-4
GRADS = [0.5, -0.25, 0.125]  # the averaged ("sent") gradient of steps 1, 2, 3


def _model() -> nn.Linear:
    model = nn.Linear(1, 1).double()
    with torch.no_grad():
        model.weight.fill_(1.5)  # 2-D: compressed
        model.bias.fill_(-2.0)  # 1-D: dense
    return model


def _run(nesterov: bool, fused: bool) -> tuple[list[float], list[float]]:
    model = _model()
    optim = {"name": "sgd", "lr": LR, "momentum": M, "weight_decay": WD, "nesterov": nesterov, "fused": fused}
    opt = build_optimizer(param_groups(model, True, lambda p: p.dim() >= 2, optim), **optim)
    weights, biases = [], []
    for g in GRADS:
        model.weight.grad = torch.full_like(model.weight, g)
        model.bias.grad = torch.full_like(model.bias, g)
        opt.step()
        weights.append(model.weight.item())
        biases.append(model.bias.item())
    return weights, biases


@pytest.mark.parametrize("fused", [True, False])
def test_compressed_tensor_follows_dgc_sgd(fused):
    # DGC's SGD: m_wd = M*m_wd + WD*p (m_wd = WD*p at the first step); p -= LR*(g + m_wd).
    p0 = 1.5
    m1 = WD * p0
    p1 = p0 - LR * (0.5 + m1)
    m2 = M * m1 + WD * p1
    p2 = p1 - LR * (-0.25 + m2)
    m3 = M * m2 + WD * p2
    p3 = p2 - LR * (0.125 + m3)
    weights, _ = _run(nesterov=False, fused=fused)
    assert weights == pytest.approx([p1, p2, p3], rel=1e-14, abs=1e-15)
    # the decay really has its momentum: without it, the third step's decay would be WD*p2 alone
    assert abs(m3 - WD * p2) > 1e-4


def test_compressed_tensor_nesterov():
    # nesterov: p -= LR*(g + WD*p + M*m_wd)
    p0 = 1.5
    m1 = WD * p0
    p1 = p0 - LR * (0.5 + WD * p0 + M * m1)
    m2 = M * m1 + WD * p1
    p2 = p1 - LR * (-0.25 + WD * p1 + M * m2)
    m3 = M * m2 + WD * p2
    p3 = p2 - LR * (0.125 + WD * p2 + M * m3)
    weights, _ = _run(nesterov=True, fused=False)
    assert weights == pytest.approx([p1, p2, p3], rel=1e-14, abs=1e-15)


def test_dense_tensor_keeps_ordinary_sgd():
    # torch's SGD: b = M*b + (g + WD*p) (b = g + WD*p at the first step); p -= LR*b
    p0 = -2.0
    b1 = 0.5 + WD * p0
    p1 = p0 - LR * b1
    b2 = M * b1 + (-0.25 + WD * p1)
    p2 = p1 - LR * b2
    b3 = M * b2 + (0.125 + WD * p2)
    p3 = p2 - LR * b3
    _, biases = _run(nesterov=False, fused=True)
    assert biases == pytest.approx([p1, p2, p3], rel=1e-14, abs=1e-15)


def test_decay_momentum_survives_state_dict():
    model = _model()
    optim = {"name": "sgd", "lr": LR, "momentum": M, "weight_decay": WD, "nesterov": False}
    opt = build_optimizer(param_groups(model, True, lambda p: p.dim() >= 2, optim), **optim)
    model.weight.grad = torch.ones_like(model.weight)
    model.bias.grad = torch.ones_like(model.bias)
    opt.step()
    state = opt.state_dict()
    assert torch.equal(state["state"][1]["decay_buffer"], torch.full((1, 1), WD * 1.5, dtype=torch.float64))
    again = build_optimizer(param_groups(model, True, lambda p: p.dim() >= 2, optim), **optim)
    again.load_state_dict(state)
    assert torch.equal(again.state[model.weight]["decay_buffer"], opt.state[model.weight]["decay_buffer"])


def test_other_optimizers_are_refused_with_dgc_memory():
    with pytest.raises(ValueError, match="use optim=sgd"):
        param_groups(_model(), True, lambda p: True, {"name": "adam", "lr": 1e-3})
