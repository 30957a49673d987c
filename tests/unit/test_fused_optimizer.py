"""Decode and optimizer in one pass (extensions/cpu/optim.cpp): `optim.optimizers.SGD` stepping each
parameter in one pass, from a dense .grad or from the averaged sparse payload (a coalesced COO
.grad, decoded nowhere), against its twin (COMPBENCH_KERNELS=0: the dense decode, the decay term and
torch's step): the same parameters and buffers, bit for bit, at 1 and 2 threads, including torch's
fused CPU kernel's quirk: it rounds the momentum buffer buf*m + g twice in its vector loop but once
(an fma) in its scalar tail, which the one-pass step reproduces (`kernels.cpu.fused_sgd_tail`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compbench.codec.base import make_ctx
from compbench.compressors.dgc import DGC
from compbench.compressors.dragonn import DRAGONN
from compbench.compressors.sparse import sparse_decode_all
from compbench.kernels import cpu
from compbench.optim.optimizers import build_optimizer, param_groups

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def _payloads(shape: tuple[int, ...], step: int, ranks: int = 2) -> list[list[torch.Tensor]]:
    """Sparse payloads of `ranks` ranks that overlap (duplicate indices add up) and hit index 0."""
    n = int(torch.tensor(shape).prod())
    gen = torch.Generator().manual_seed(step)
    out = []
    for r in range(ranks):
        idx = torch.randperm(n, generator=gen)[: max(2, n // 50)]
        idx[0] = 0
        if r:
            idx[1] = out[0][1][1]  # a shared index
        vals = torch.randn(idx.numel(), generator=gen)
        vals[0] = -0.0
        out.append([vals, idx.to(torch.int32)])
    return out


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 257), nn.Linear(257, 3))
    with torch.no_grad():
        model[0].weight.view(-1)[:3] = torch.tensor([0.0, -0.0, 1e-30])  # zeros of both signs
    return model


def _run(monkeypatch, optim: dict, dgc: bool, sparse: bool, kernels: bool,
         steps: int = 3) -> list[torch.Tensor]:
    monkeypatch.setenv("COMPBENCH_KERNELS", "1" if kernels else "0")
    model = _model()
    opt = build_optimizer(param_groups(model, dgc, lambda p: p.dim() >= 2, optim), **optim)
    for step in range(steps):
        for p in model.parameters():
            ctx = make_ctx(p, "p")
            payloads = _payloads(tuple(p.shape), 10 * step + p.dim())
            if sparse and p.dim() >= 2:
                p.grad = DGC().decompress_all_sparse(payloads, ctx)
            else:
                p.grad = sparse_decode_all(payloads, ctx)
        opt.step()
    state = [opt.state[p][key] for p in model.parameters() for key in sorted(opt.state[p])
             if isinstance(opt.state[p][key], torch.Tensor)]
    return [p.detach().clone() for p in model.parameters()] + state


OPTIMS = {
    "dgc_sgd": ({"momentum": 0.9, "weight_decay": 5e-4}, True),
    "dgc_sgd_nesterov": ({"momentum": 0.9, "weight_decay": 5e-4, "nesterov": True}, True),
    "dgc_sgd_no_decay": ({"momentum": 0.9, "weight_decay": 0.0}, True),
    "sgd_momentum": ({"momentum": 0.9, "weight_decay": 5e-4}, False),
    "sgd_nesterov": ({"momentum": 0.9, "weight_decay": 1e-3, "nesterov": True}, False),
    "sgd_decay": ({"momentum": 0.0, "weight_decay": 5e-4}, False),
    "sgd_plain": ({"momentum": 0.0, "weight_decay": 0.0}, False),
}


@needs_kernels
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("which", sorted(OPTIMS))
def test_one_pass_step_gives_the_twin_bytes(monkeypatch, which, sparse, fused, threads):
    settings, dgc = OPTIMS[which]
    optim = {"name": "sgd", "lr": 0.1, "nesterov": False, "fused": fused, **settings}
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = _run(monkeypatch, optim, dgc, sparse, kernels=True)
        want = _run(monkeypatch, optim, dgc, sparse, kernels=False)
    finally:
        torch.set_num_threads(old)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), which


@needs_kernels
@pytest.mark.parametrize("which", ["sgd_momentum", "sgd_nesterov"])
def test_fused_torch_tail_is_what_separates_fused_from_foreach_torch(monkeypatch, which):
    """The tail rule is real: fused and foreach torch differ (in the last elements only), and the
    one-pass step follows whichever the group asks for."""
    settings, _ = OPTIMS[which]
    optim = {"name": "sgd", "lr": 0.1, "nesterov": False, **settings}
    fused = _run(monkeypatch, {**optim, "fused": True}, False, True, kernels=False)
    foreach = _run(monkeypatch, {**optim, "fused": False}, False, True, kernels=False)
    assert any(not torch.equal(a, b) for a, b in zip(fused, foreach, strict=True))
    for a, b in zip(fused, foreach, strict=True):
        n = a.numel()
        head = n - cpu.fused_sgd_tail(n)
        assert torch.equal(a.reshape(-1)[:head], b.reshape(-1)[:head])  # the vector loop agrees


@needs_kernels
def test_sparse_step_without_state_touches_only_the_carried_entries(monkeypatch):
    monkeypatch.setenv("COMPBENCH_KERNELS", "1")
    p = nn.Parameter(torch.randn(400, 300))
    before = p.detach().clone()
    opt = build_optimizer([{"params": [p]}], name="sgd", lr=0.5, momentum=0.0, weight_decay=0.0)
    p.grad = DGC().decompress_all_sparse(_payloads((400, 300), 0), make_ctx(p, "p"))
    carried = p.grad.coalesce().indices()
    opt.step()
    changed = (p.detach() != before).nonzero().T
    assert set(map(tuple, changed.T.tolist())) <= set(map(tuple, carried.T.tolist()))
    assert opt.state[p] == {}  # no dense state was created
    assert p.grad.is_sparse  # the averaged update stays readable after the step


@pytest.mark.parametrize("shape", [(1000,), (40, 25), (4, 5, 50)])
@pytest.mark.parametrize("compressor", [DGC(), DRAGONN(), DRAGONN(batching=False)])
def test_sparse_average_is_the_dense_decode_at_its_indices(shape, compressor):
    ctx = make_ctx(torch.empty(shape), "w")
    payloads = _payloads(shape, 7, ranks=3)
    sparse = compressor.decompress_all_sparse(payloads, ctx)
    assert sparse.is_sparse and sparse.is_coalesced() and sparse.shape == torch.Size(shape)
    dense = compressor.decompress_all(payloads, ctx)
    assert torch.equal(sparse.to_dense().view(torch.int32), dense.view(torch.int32))


def test_only_compressors_whose_average_is_sparse_declare_it():
    from compbench.compressors.randk import RandK
    from compbench.compressors.sparseloco import SparseLoCo

    assert DGC.caps.sparse_average and DRAGONN.caps.sparse_average
    assert not RandK.caps.sparse_average  # shared indices: the payload carries values only
    assert not SparseLoCo.caps.sparse_average  # the mean over the senders, not over all ranks
