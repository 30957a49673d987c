"""The trainer's non-finite check (`Trainer.gradients_finite`): one reduction per tensor stacked into
ONE flag, the only host read of a finite step (a wait on a GPU); the tensors are named one by one
only when that flag says a sum is not finite, and an overflowing sum of finite values is no NaN.
With on_nonfinite=raise the gradients a compressor's compiled pass checked (its ledger,
codec/finite.py) are not read again: their flag joins the one host read."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from compbench.codec.finite import FiniteLedger
from compbench.records.stats import StepStats
from compbench.train.loop import Trainer


def _trainer(grads: list[torch.Tensor], on_nonfinite: str = "raise",
             ledger: FiniteLedger | None = None) -> SimpleNamespace:
    model = nn.ParameterList([nn.Parameter(torch.zeros_like(g)) for g in grads])
    for p, g in zip(model, grads, strict=True):
        p.grad = g
    return SimpleNamespace(model=model, stats=StepStats(), step=7, engine=SimpleNamespace(rank=0),
                           settings=SimpleNamespace(on_nonfinite=on_nonfinite), device=torch.device("cpu"),
                           ledger=ledger, local=lambda t: t)


def _ledger(checked: dict[str, int], flag: int) -> FiniteLedger:
    """A ledger as a compressor leaves it: `checked` read by its pass, which set the flag to `flag`."""
    ledger = FiniteLedger()
    ledger.begin_step()
    for name, numel in checked.items():
        check = ledger.check(name, numel)
        assert check is not None
        check.take(torch.device("cpu")).fill_(flag)
    return ledger


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


def _summed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The numel of every tensor summed."""
    summed: list[int] = []
    real = torch.Tensor.sum

    def counted(t: torch.Tensor, *a, **k):
        summed.append(t.numel())
        return real(t, *a, **k)

    monkeypatch.setattr(torch.Tensor, "sum", counted)
    return summed


def test_what_the_ledger_checked_is_not_read_again(monkeypatch):
    # "0" (15 elements) was checked by a compiled pass (flag clear); "1" and "2" were not
    grads = [torch.randn(5, 3), torch.randn(4), torch.randn(2, 2, 2)]
    trainer = _trainer(grads, ledger=_ledger({"0": 15}, flag=0))
    summed = _summed(monkeypatch)
    reads = _count_reads(monkeypatch)
    assert Trainer.gradients_finite(trainer)
    assert reads == ["__bool__"] and sorted(summed) == [4, 8]  # one host read: the flag with the sums
    assert trainer.ledger.close() == ({}, [])  # the check closed it


def test_a_flagged_pass_names_its_tensor_and_a_size_mismatch_is_read(monkeypatch):
    nan = torch.tensor([[1.0, float("nan")], [0.0, 2.0]])
    trainer = _trainer([torch.randn(3), nan], ledger=_ledger({"1": 4}, flag=1))
    with pytest.raises(FloatingPointError, match="non-finite gradient at step 7.*: 1\\)"):
        Trainer.gradients_finite(trainer)
    # a flag raised by a pass whose tensor is finite after all (a compensation that overflowed)
    assert Trainer.gradients_finite(_trainer([torch.randn(3), torch.randn(4)], ledger=_ledger({"1": 4}, 1)))
    # a name checked at another size (not this gradient) excuses nothing: its NaN is found
    with pytest.raises(FloatingPointError, match=": 1\\)"):
        Trainer.gradients_finite(_trainer([torch.randn(3), nan], ledger=_ledger({"1": 3}, flag=0)))


def test_on_nonfinite_skip_reads_every_gradient(monkeypatch):
    # under skip the pipeline compresses a zeroed copy of a non-finite group: its pass saw no NaN
    nan = torch.tensor([1.0, float("nan")])
    trainer = _trainer([torch.randn(3), nan], on_nonfinite="skip", ledger=_ledger({"1": 2}, flag=0))
    summed = _summed(monkeypatch)
    trainer.engine = SimpleNamespace(rank=0, allreduce=lambda t, name, average: t)
    trainer.sync = SimpleNamespace(drain=lambda: None)
    trainer.optimizer = SimpleNamespace(zero_grad=lambda: None)
    trainer.rank0 = False
    assert not Trainer.gradients_finite(trainer)  # skipped
    assert sorted(summed)[:2] == [2, 3]
