"""Decode and Adam/AdamW in one pass (extensions/cpu/adam.cpp): `optim.optimizers.Adam`/`AdamW` stepping
a parameter with a sparse .grad (the averaged sparse payload, a coalesced COO tensor, decoded nowhere)
in one pass over it and its two moments, against its twin (COMPBENCH_KERNELS=0: the dense decode,
then torch's fused CPU step): the same parameters and state, bit for bit, at 1 and 2 threads; and the
kernel from a dense gradient against torch's fused kernel itself, whose contracted fmas and scalar
tail (the last n % 8 elements) it reproduces."""

from __future__ import annotations

import pytest
import torch

from compbench.codec.base import make_ctx
from compbench.compressors.dgc import DGC
from compbench.compressors.sparse import sparse_decode_all
from compbench.kernels import cpu
from compbench.optim.optimizers import Adam, AdamW, build_optimizer, param_groups
from tests.unit.test_fused_optimizer import _model, _payloads

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())

OPTIMS = {
    "adam": {"name": "adam", "weight_decay": 0.0},
    "adam_decay": {"name": "adam", "weight_decay": 1e-2},
    "adamw": {"name": "adamw", "weight_decay": 0.05},
    "adamw_beta1_small": {"name": "adamw", "weight_decay": 0.05, "betas": [0.3, 0.99]},  # torch's other lerp
    "adamw_unfused": {"name": "adamw", "weight_decay": 0.05, "fused": False},  # torch's step (decoded)
    "adam_amsgrad": {"name": "adam", "weight_decay": 0.0, "amsgrad": True},  # torch's step (decoded)
}


def _run(monkeypatch, optim: dict, sparse: bool, kernels: bool, steps: int = 4) -> list[torch.Tensor]:
    monkeypatch.setenv("COMPBENCH_KERNELS", "1" if kernels else "0")
    model = _model()
    opt = build_optimizer(param_groups(model, False, lambda p: True, optim), **optim)
    for step in range(steps):
        for p in model.parameters():
            ctx = make_ctx(p, "p")
            payloads = _payloads(tuple(p.shape), 10 * step + p.dim())
            p.grad = (DGC().decompress_all_sparse(payloads, ctx) if sparse and p.dim() >= 2
                      else sparse_decode_all(payloads, ctx))
        opt.step()
    state = [opt.state[p][key] for p in model.parameters() for key in sorted(opt.state[p])]
    return [p.detach().clone() for p in model.parameters()] + state


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("which", sorted(OPTIMS))
def test_one_pass_adam_gives_the_twin_bytes(monkeypatch, which, sparse, threads):
    optim = {"lr": 1e-2, "betas": [0.9, 0.999], "fused": True, **OPTIMS[which]}
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = _run(monkeypatch, optim, sparse, kernels=True)
        want = _run(monkeypatch, optim, sparse, kernels=False)
    finally:
        torch.set_num_threads(old)
    assert len(got) == len(want) >= 4 * 4  # weight and bias of two layers, each with its step and moments
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), which


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 13, 1000, 70001])
@pytest.mark.parametrize("decoupled,wd", [(False, 0.0), (False, 1e-2), (True, 0.05)])
def test_dense_kernel_is_torchs_fused_step(n, decoupled, wd, threads):
    """The kernel from a dense gradient against torch.optim.Adam/AdamW(fused=True) on the same data:
    the vector body's fmas and the scalar tail's (n % 8 elements) both."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(n)
        p = torch.nn.Parameter(torch.randn(n, generator=gen))
        q, m, v = p.detach().clone(), torch.zeros(n), torch.zeros(n)
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        opt = cls([p], lr=1e-3, weight_decay=wd, fused=True)
        for step in range(1, 6):
            g = torch.randn(n, generator=gen)
            p.grad = g.clone()
            opt.step()
            cpu.adam_step(q, m, v, g, torch.empty(0, dtype=torch.int64), torch.empty(0), 1e-3, 0.9, 0.999,
                          1e-8, wd, float(step), decoupled, cpu.fused_sgd_tail(n))
            for a, b in ((q, p.detach()), (m, opt.state[p]["exp_avg"]), (v, opt.state[p]["exp_avg_sq"])):
                assert torch.equal(a.view(torch.int32), b.view(torch.int32)), step
    finally:
        torch.set_num_threads(old)


@needs_kernels
def test_the_scalar_tail_is_what_the_kernel_must_reproduce():
    """Without the tail's own rounding the last n % 8 elements differ: the test above could fail."""
    n = 4101
    gen = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(n, generator=gen))
    q, m, v = p.detach().clone(), torch.zeros(n), torch.zeros(n)
    opt = torch.optim.Adam([p], lr=1e-3, fused=True)
    differ = 0
    for step in range(1, 6):
        g = torch.randn(n, generator=gen)
        p.grad = g.clone()
        opt.step()
        cpu.adam_step(q, m, v, g, torch.empty(0, dtype=torch.int64), torch.empty(0), 1e-3, 0.9, 0.999, 1e-8,
                      0.0, float(step), False, 0)
        differ += int((v != opt.state[p]["exp_avg_sq"]).sum())
        assert torch.equal(v[: n - 5], opt.state[p]["exp_avg_sq"][: n - 5])
    assert differ > 0


@pytest.mark.parametrize("settings,takes", [({}, True), ({"amsgrad": True}, False), ({"fused": False}, False),
                                            ({"maximize": True}, False)])
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_sparse_params_are_the_groups_the_kernel_spells(monkeypatch, cls, settings, takes):
    monkeypatch.setenv("COMPBENCH_KERNELS", "1")
    p = torch.nn.Parameter(torch.zeros(4))
    opt = cls([p], **{"fused": True, **settings})
    assert opt.sparse_params() == ({p} if takes and cpu.enabled(p) else set())


@needs_kernels
@pytest.mark.parametrize("which,calls", [("adamw", 2 * 4), ("adamw_unfused", 0), ("adam_amsgrad", 0)])
def test_the_sparse_grads_take_the_kernel_where_it_spells_the_group(monkeypatch, which, calls):
    """The parity above compares the kernel with its twin only where the kernel ran: count its calls
    (the two weight matrices get sparse .grads, over 4 steps)."""
    seen = []
    real = cpu.adam_step
    monkeypatch.setattr(cpu, "adam_step", lambda *a: seen.append(a[0].shape) or real(*a))
    _run(monkeypatch, {"lr": 1e-2, "betas": [0.9, 0.999], "fused": True, **OPTIMS[which]}, True, kernels=True)
    assert len(seen) == calls
