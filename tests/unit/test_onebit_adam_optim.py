"""1-bit Adam (`compbench.sync.onebit_adam_optim`) against an independent float64 re-implementation
of the reference (DeepSpeed onebit/adam.py + comm/nccl.py compressed_allreduce), on 2 thread ranks:
the updates on both sides of the freeze, the warm-up boundary, the bytes, and an exact resume."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from compbench.records.stats import StepStats
from tests.oracles.onebit_adam import OnebitAdam, padded_size
from tests.threaded_engine import ThreadWorld

SHAPES = [(10,), (33, 7), (64,)]
HP = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, freeze_step=3)


def init_params(shapes=SHAPES) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(s, generator=gen) for s in shapes]


def grad(rank: int, step: int, j: int, shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(10_000 * rank + 100 * step + j))


# --- the independent reference (float64 numpy) ----------------------------------------------------


def ref_sign(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, 1.0, -1.0)  # DeepSpeed's sign().add_(1).bool(): zero is +1


def ref_compressed_allreduce(ms, werr, serr):
    """nccl.py compressed_allreduce on every rank at once: ms[r] flat momentum, werr[r] (padded)
    and serr[r] (one chunk) updated in place; returns the (same) result of every rank."""
    world, n, total = len(ms), ms[0].size, werr[0].size
    chunk = total // world
    signs, scales = [], []
    for r in range(world):
        buf = np.concatenate([ms[r], np.zeros(total - n)]) + werr[r]
        s = np.linalg.norm(buf) / np.sqrt(total)
        werr[r][:] = buf - s * ref_sign(buf)
        signs.append(ref_sign(buf))
        scales.append(s)
    out = np.zeros(total)
    for j in range(world):
        c = sum(signs[r][j * chunk:(j + 1) * chunk] * (scales[r] / world) for r in range(world)) + serr[j]
        t = np.linalg.norm(c) / np.sqrt(chunk)
        serr[j][:] = c - t * ref_sign(c)
        out[j * chunk:(j + 1) * chunk] = t * ref_sign(c)
    return out[:n]


def ref_run(steps: int, world: int, *, lr, betas, eps, weight_decay, freeze_step, shapes=SHAPES):
    """DeepSpeed's OnebitAdam over `steps` calls; per rank the list of float64 params after each call."""
    b1, b2 = betas
    params = [[p.double().numpy().copy() for p in init_params(shapes)] for _ in range(world)]
    m = [[np.zeros(p.size) for p in params[0]] for _ in range(world)]
    v = [[np.zeros(p.size) for p in params[0]] for _ in range(world)]
    werr = [[np.zeros(padded_ref(p.size, world)) for p in params[0]] for _ in range(world)]
    serr = [[np.zeros(padded_ref(p.size, world) // world) for p in params[0]] for _ in range(world)]
    frozen, history = False, []
    for call in range(1, steps + 1):
        step = call - 1  # the gradients' index
        if call > 1:
            for j in range(len(shapes)):
                g = [grad(r, step, j, shapes[j]).double().numpy().reshape(-1) for r in range(world)]
                if not frozen:
                    mean = sum(g) / world  # DeepSpeed's engine averages the gradients in warm-up
                    for r in range(world):
                        m[r][j] = b1 * m[r][j] + (1 - b1) * mean
                        v[r][j] = b2 * v[r][j] + (1 - b2) * mean * mean
                else:
                    for r in range(world):
                        m[r][j] = b1 * m[r][j] + (1 - b1) * g[r]
                if frozen and world > 1:  # the reference skips the exchange on one rank
                    out = ref_compressed_allreduce([m[r][j] for r in range(world)],
                                                   [werr[r][j] for r in range(world)],
                                                   [serr[r][j] for r in range(world)])
                    for r in range(world):
                        m[r][j] = out.copy()
                for r in range(world):
                    p = params[r][j].reshape(-1)
                    update = m[r][j] / (np.sqrt(v[r][j]) + eps) + weight_decay * p
                    p -= lr * update
            if not frozen and call >= freeze_step:
                frozen = True
        history.append([[p.copy() for p in params[r]] for r in range(world)])
    return history


def padded_ref(n: int, world: int) -> int:
    divider = world * 8 // math.gcd(world, 8)
    unit = world * divider
    return n if n % unit == 0 else n + unit - n % unit


# --- the threaded runs --------------------------------------------------------------------------


def run(steps: range, world: int = 2, saved=None, hp=HP, shapes=SHAPES):
    """Per rank: (params after each step, per-step stats, frozen after each step, state bytes)."""

    def rank(engine):
        params = init_params(shapes) if saved is None else [t.clone() for t in saved[engine.rank][0]]
        params = [torch.nn.Parameter(t) for t in params]
        stats = StepStats()
        opt = OnebitAdam(params, engine=engine, stats=stats, **hp)
        if saved is not None:
            opt.load_state_dict(torch.load(io.BytesIO(saved[engine.rank][1]), weights_only=True))
        history, booked, frozen = [], [], []
        for step in steps:
            for j, p in enumerate(params):
                p.grad = grad(engine.rank, step, j, p.shape)
            stats.reset()
            opt.step()
            history.append([p.detach().clone() for p in params])
            booked.append((stats.bytes_sent, stats.bytes_dense, stats.bytes_allreduce, stats.calls_compressed,
                           stats.calls_dense))
            frozen.append(opt.frozen)
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        return history, booked, frozen, buf.getvalue()

    return ThreadWorld(world).run(rank)


def test_updates_match_reference_across_the_freeze():
    steps = 7  # call 1 init, calls 2-3 dense Adam, calls 4-7 compressed
    out = run(range(steps))
    ref = ref_run(steps, 2, **HP)
    for r in range(2):
        for call in range(steps):
            for j, (a, b) in enumerate(zip(out[r][0][call], ref[call][r], strict=True)):
                np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-6,
                                           err_msg=f"rank {r} call {call + 1} param {j}")
    # every rank applies the same momentum: the parameters stay identical
    assert all(torch.equal(a, b) for a, b in zip(out[0][0][-1], out[1][0][-1], strict=True))


def test_warmup_boundary_and_bytes():
    out = run(range(6))
    init = init_params()
    numels = [math.prod(s) for s in SHAPES]
    dense = 4 * sum(numels)
    # P/8 (all-to-all of bits) + 4 (worker scale) + P/(8N) + 4 (server bits and scale), P padded to 16
    padded = [padded_size(n, 2) for n in numels]
    assert padded == [16, 240, 64] == [padded_ref(n, 2) for n in numels]
    compressed = sum(p // 8 + 4 + p // 16 + 4 for p in padded)
    assert compressed == 11 + 53 + 20
    for r in range(2):
        history, booked, frozen, _ = out[r]
        assert all(torch.equal(a, b) for a, b in zip(history[0], init, strict=True))  # call 1: nothing moves
        assert not torch.equal(history[1][0], init[0])  # call 2: the first Adam step
        assert booked[0] == (0, dense, 0, 0, 0)
        assert booked[1] == booked[2] == (dense, dense, dense, 0, len(SHAPES))  # dense until freeze_step
        assert booked[3:] == [(compressed, dense, 0, len(SHAPES), 0)] * 3
        assert frozen == [False, False, True, True, True, True]


@pytest.mark.parametrize("freeze_step", [0, 1, 2])
def test_at_least_one_dense_step(freeze_step):
    """As the reference: call 1 returns before the freeze check, so call 2 is always dense Adam."""
    out = run(range(4), hp={**HP, "freeze_step": freeze_step})
    booked, frozen = out[0][1], out[0][2]
    assert [b[4] for b in booked] == [0, len(SHAPES), 0, 0]
    assert [b[3] for b in booked] == [0, 0, len(SHAPES), len(SHAPES)]
    assert frozen == [False, True, True, True]


def test_one_rank_compresses_nothing():
    out = run(range(5), world=1)
    booked = out[0][1]
    assert [b[0] for b in booked] == [0, booked[1][0], booked[2][0], 0, 0]
    ref = ref_run(5, 1, **HP)
    for a, b in zip(out[0][0][-1], ref[-1][0], strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cut", [2, 4])  # in the warm-up, and after the freeze (errors in the state)
def test_resume_is_exact(cut):
    whole = run(range(7))
    first = run(range(cut))
    resumed = run(range(cut, 7), saved=[(first[r][0][-1], first[r][3]) for r in range(2)])
    for r in range(2):
        assert all(torch.equal(a, b) for a, b in zip(whole[r][0][-1], resumed[r][0][-1], strict=True))
        assert whole[r][2][cut:] == resumed[r][2]
        a = torch.load(io.BytesIO(whole[r][3]), weights_only=True)
        b = torch.load(io.BytesIO(resumed[r][3]), weights_only=True)
        assert a["param_groups"] == b["param_groups"]
        for j in a["state"]:
            assert a["state"][j].keys() == b["state"][j].keys() >= {"worker_error", "server_error"}
            assert all(torch.equal(torch.as_tensor(a["state"][j][k]), torch.as_tensor(b["state"][j][k]))
                       for k in a["state"][j])


@pytest.mark.parametrize("bad", [dict(freeze_step=-1), dict(betas=(0.9, 1.0)), dict(lr=-1.0), dict(eps=-1.0),
                                 dict(weight_decay=-0.1)])
def test_bad_settings_raise(bad):
    with pytest.raises(ValueError, match="OnebitAdam"):
        OnebitAdam([torch.nn.Parameter(torch.zeros(2))], engine=None, stats=StepStats(), **{**HP, **bad})
