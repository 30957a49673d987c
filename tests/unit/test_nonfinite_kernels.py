"""The non-finite check folded into the compiled first passes (codec/finite.py): dragonn_select,
block_absmax and compensate_select set their `nonfinite` flag exactly when the twin
(`kernels.twins.nonfinite`) says the gradient holds a NaN/Inf, at any number of threads, never clear
it, and select, summarize and update the memory bit for bit as without the check; the compressors
record in their ledger exactly the tensors such a pass read."""

from __future__ import annotations

import pytest
import torch

from compbench.codec.finite import FiniteLedger
from compbench.comm.base import encode
from compbench.compressors.dgc import DGC
from compbench.compressors.dragonn import DRAGONN
from compbench.compressors.topk import TopK
from compbench.kernels import cpu, twins
from compbench.memory.dgc import DGCMemory
from compbench.memory.none import NoMemory
from compbench.memory.residual import ResidualMemory
from compbench.records.stats import StepStats

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())

# 600_001 elements: several parallel_for ranges (4096 blocks of 64 each) and a tail of one element
SIZES = [1, 9, 1000, 600_001]
POISONS = [None, ("nan", "first"), ("inf", "middle"), ("-inf", "last"), ("nan", "middle")]


def _gradient(n: int, poison: tuple[str, str] | None) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 2
    if poison is not None:
        value, where = poison
        x[{"first": 0, "middle": n // 2, "last": n - 1}[where]] = float(value)
    return x


def _flag(preset: int = 0) -> torch.Tensor:
    return torch.full((1,), preset, dtype=torch.int32)


def _run(kernel: str, x: torch.Tensor, nonfinite: torch.Tensor | None) -> list[torch.Tensor]:
    """The kernel's outputs (and the state it updates) with or without the check."""
    n = x.numel()
    if kernel == "dragonn_select":
        return [cpu.dragonn_select(x, 1.0, n // 8 + 1, 5, nonfinite)]
    if kernel == "block_absmax":
        samples = torch.empty(max(1, n // 7))
        return [cpu.block_absmax(x, samples, 0, max(1, n // samples.numel()), nonfinite), samples]
    kind, slots = {"compensate_select_dgc": (cpu.DGC, 0), "compensate_select_residual": (cpu.RESIDUAL, 97),
                   "compensate_select_nesterov": (cpu.DGC_NESTEROV, 0)}[kernel]
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(n, generator=gen)
    b = torch.randn(n, generator=gen) if kind != cpu.RESIDUAL else torch.empty(0)
    out = cpu.compensate_select(a, b, x, kind, 0.9, 0.7 if kind == cpu.RESIDUAL else 0.0, 1.0, 1.5, slots, 11,
                                nonfinite=nonfinite)
    return [out, a, b]


KERNELS = ["dragonn_select", "block_absmax", "compensate_select_dgc", "compensate_select_residual",
           "compensate_select_nesterov"]


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("poison", POISONS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_flag_is_the_twins_and_the_results_do_not_change(kernel, n, poison, threads):
    x = _gradient(n, poison)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flag = _flag()
        checked = _run(kernel, x.clone(), flag)
        plain = _run(kernel, x.clone(), None)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(flag, twins.nonfinite(x)), (kernel, n, poison, threads)
    for got, want in zip(checked, plain, strict=True):  # bit for bit, NaN included
        assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@needs_kernels
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_kernels_never_clear_the_flag(kernel):
    flag = _flag(1)
    _run(kernel, _gradient(1000, None), flag)
    assert flag.item() == 1


@needs_kernels
def test_a_flag_of_the_wrong_kind_is_refused():
    with pytest.raises(RuntimeError, match="nonfinite"):
        cpu.dragonn_select(torch.randn(10), 1.0, 3, 1, torch.zeros(1))  # fp32, not int32
    with pytest.raises(RuntimeError, match="nonfinite"):
        cpu.block_absmax(torch.randn(10), nonfinite=torch.zeros(2, dtype=torch.int32))


# --- the compressors' ledgers -------------------------------------------------------------------

def _compress(compressor, memory, g: torch.Tensor, name: str = "w", steps: int = 2) -> FiniteLedger:
    """`steps` steps of memory -> compress on `g` (a memory fuses from its second step); the ledger
    as the trainer's check finds it after the last."""
    for step in range(steps):
        compressor.begin_step(step, 0.0)
        encode(compressor, memory, g.clone(), name, StepStats())
    return compressor.finite


CASES = {
    "dragonn": (lambda: DRAGONN(ratio=1e-3), NoMemory),
    "dragonn_residual": (lambda: DRAGONN(ratio=1e-3), ResidualMemory),
    "dgc": (lambda: DGC(ratio=1e-3), NoMemory),
    "dgc_dgc": (lambda: DGC(ratio=1e-3), lambda: DGCMemory(momentum=0.9)),
    "topk_residual": (lambda: TopK(ratio=1e-3), ResidualMemory),
}


@needs_kernels
@pytest.mark.parametrize("poisoned", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_compressors_record_what_their_pass_checked(case, poisoned):
    compressor, memory = (make() for make in CASES[case])
    g = _gradient(300_000, ("nan", "middle") if poisoned else None)
    checked, flags = _compress(compressor, memory, g).close()
    assert checked == {"w": g.numel()}
    assert len(flags) == 1 and flags[0].item() == int(poisoned)


@needs_kernels
def test_the_twins_record_nothing_and_a_closed_ledger_nothing(monkeypatch):
    compressor = DRAGONN(ratio=1e-3)
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")
    assert _compress(compressor, NoMemory(), _gradient(300_000, None)).close() == ({}, [])
    monkeypatch.delenv("COMPBENCH_KERNELS")
    compressor.begin_step(5, 0.0)
    compressor.finite.close()  # the trainer's check has run: what follows is not this step's
    encode(compressor, NoMemory(), _gradient(300_000, None), "w", StepStats())
    assert compressor.finite.close() == ({}, [])


def test_a_fused_groups_members_are_recorded_when_they_add_up():
    ledger = FiniteLedger()
    ledger.begin_step()
    ledger.group("fused.0-1", [("a", 6), ("b", 4)])
    ledger.group("fused.2-3", [("c", 6), ("d", 4)])
    for name, numel in (("fused.0-1", 10), ("fused.2-3", 9), ("e", 3)):
        check = ledger.check(name, numel)
        assert check is not None
        check.take(torch.device("cpu"))
    checked, flags = ledger.close()
    assert checked == {"a": 6, "b": 4, "fused.2-3": 9, "e": 3}  # a group that does not add up: its own name
    assert len(flags) == 1 and flags[0].item() == 0
    assert ledger.check("a", 6) is None  # closed until the next step


def test_the_flag_is_zeroed_once_per_step_and_reused():
    ledger = FiniteLedger()
    ledger.begin_step()
    flag = ledger.flag_for(torch.device("cpu"))
    flag.fill_(1)
    assert ledger.flag_for(torch.device("cpu")).item() == 1  # the same step: kept
    ledger.close()
    ledger.begin_step()
    assert ledger.close() == ({}, [])  # not taken this step: not handed to the check
    ledger.begin_step()
    again = ledger.flag_for(torch.device("cpu"))
    assert again is flag and again.item() == 0


# --- from the backward hooks of an overlapping scheduler to the trainer's check ----------------------

@needs_kernels
@pytest.mark.parametrize("fused", [False, True])
def test_a_layerwise_step_leaves_the_members_names_in_the_ledger(fused):
    from compbench.schedulers.layerwise import Layerwise
    from tests.unit.test_schedulers import make_pipeline

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10))
    sched, pipeline = Layerwise(), make_pipeline(compressor="dragonn")
    sched.setup(model)
    if fused:  # two flat buffers of two tensors each: the check of a buffer checks its members
        sched.set_runs([[0, 1], [2, 3]])
    names = {n for n, _ in model.named_parameters()}
    for step, poison in enumerate([False, True]):
        pipeline.begin_step(step, 0.0)
        sched.before_backward(pipeline)
        x = torch.randn(8, 64)
        if poison:
            x[3, 5] = float("inf")  # the first layer's weight gradient gets infinities and NaN
        model(x).square().sum().backward()
        checked, flags = pipeline.compressor.finite.close()  # what the trainer's check finds
        assert set(checked) == names and all(checked[n] == p.numel() for n, p in model.named_parameters())
        assert [f.item() for f in flags] == [int(poison)]
        sched.synchronize(pipeline)
        model.zero_grad()
