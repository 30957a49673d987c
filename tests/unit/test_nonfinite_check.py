"""The trainer's non-finite check (`Trainer.gradients_finite`): one reduction per tensor stacked into
ONE flag, the only host read of a finite step (a wait on a GPU); the tensors are named one by one
only when that flag says a sum is not finite, and an overflowing sum of finite values is no NaN."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from compbench.records.stats import StepStats
from compbench.train.loop import Trainer


def _trainer(grads: list[torch.Tensor], on_nonfinite: str = "raise") -> SimpleNamespace:
    model = nn.ParameterList([nn.Parameter(torch.zeros_like(g)) for g in grads])
    for p, g in zip(model, grads, strict=True):
        p.grad = g
    return SimpleNamespace(model=model, stats=StepStats(), step=7, engine=SimpleNamespace(rank=0),
                           settings=SimpleNamespace(on_nonfinite=on_nonfinite), device=torch.device("cpu"))


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every host read of a tensor's value (tolist, item, bool, float, int) by name."""
    reads: list[str] = []
    for name in ("tolist", "item", "__bool__", "__float__", "__int__"):
        real = getattr(torch.Tensor, name)

        def counted(t: torch.Tensor, *a, _real=real, _name=name):
            reads.append(_name)
            return _real(t, *a)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_a_finite_step_reads_one_flag(monkeypatch):
    trainer = _trainer([torch.randn(5, 3), torch.randn(4), torch.randn(2, 2, 2)])
    reads = _count_reads(monkeypatch)
    assert Trainer.gradients_finite(trainer)
    assert reads == ["__bool__"]


def test_a_nan_is_named_and_an_overflowing_sum_is_not(monkeypatch):
    big = torch.full((4,), 3e38)  # finite values whose sum overflows
    nan = torch.tensor([1.0, float("nan")])
    trainer = _trainer([torch.randn(3), big, nan])
    with pytest.raises(FloatingPointError, match="non-finite gradient at step 7.*: 2"):
        Trainer.gradients_finite(trainer)
    assert Trainer.gradients_finite(_trainer([torch.randn(3), big]))
