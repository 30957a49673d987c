"""DeMo (`compbench.sync.demo_optim`) against an independent float64 re-implementation of the
reference (bloc97/DeMo demo.py, with scipy's DCT), on 2 thread ranks: the update, the bytes, the
mean over senders, the DCT, and an exact resume."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import scipy.fft
import torch

from compbench.compressors.chunk_dct import ChunkDCT, chunk_size, dct_matrix
from compbench.records.stats import StepStats
from tests.oracles.demo import DeMo
from tests.threaded_engine import ThreadWorld

# a matrix cut 64 x 48, a vector cut 50, a conv weight viewed (8, 27), a matrix of fewer than topk
# coefficients (k capped at 20), a scalar
SHAPES = [(128, 96), (100,), (8, 3, 3, 3), (4, 5), ()]
HP = dict(lr=0.01, compression_decay=0.9, compression_topk=32, compression_chunk=64, weight_decay=0.1)


def init_params(shapes=SHAPES) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(s, generator=gen) for s in shapes]


def grad(rank: int, step: int, j: int, shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(10_000 * rank + 100 * step + j))


# --- the independent reference (float64, numpy + scipy) -------------------------------------------


def ref_split(n: int, target: int) -> int:
    """bloc97/DeMo's _get_smaller_split over the sorted divisors."""
    divs = [d for d in range(1, n + 1) if n % d == 0]
    for ix, v in enumerate(divs):
        if v == target:
            return v
        if v > target:
            return divs[ix - 1] if ix else v
    return n


def ref_blocks(m: np.ndarray, target: int):
    """(block slices, block shape) of a 1-D or 2-D array."""
    sizes = [ref_split(d, target) for d in m.shape]
    ranges = [range(0, d, c) for d, c in zip(m.shape, sizes, strict=True)]
    grid = [(slice(a, a + sizes[0]),) for a in ranges[0]] if m.ndim == 1 else [
        (slice(a, a + sizes[0]), slice(b, b + sizes[1])) for a in ranges[0] for b in ranges[1]]
    return grid, tuple(sizes)


def ref_step(params, deltas, grads, *, lr, compression_decay, compression_topk, compression_chunk,
             weight_decay):
    """One DeMo step of every rank; params (shared) and deltas[rank] are float64 arrays, updated."""
    for j, p in enumerate(params):
        mat = p.reshape(1) if p.ndim == 0 else p.reshape(p.shape[0], -1) if p.ndim > 2 else p
        p *= 1.0 - lr * weight_decay
        grid, bshape = ref_blocks(mat, compression_chunk)
        k = min(compression_topk, math.prod(bshape))
        sums = [np.zeros(math.prod(bshape)) for _ in grid]
        counts = [np.zeros(math.prod(bshape)) for _ in grid]
        for r in range(len(deltas)):
            d = deltas[r][j]
            d *= compression_decay
            d += lr * grads[r][j]
            dm = d.reshape(mat.shape)
            for b, sl in enumerate(grid):
                coef = scipy.fft.dctn(dm[sl], norm="ortho").reshape(-1)
                top = np.argsort(-np.abs(coef), kind="stable")[:k]
                kept = np.zeros_like(coef)
                kept[top] = coef[top]
                dm[sl] -= scipy.fft.idctn(kept.reshape(bshape), norm="ortho")
                sums[b][top] += coef[top]
                counts[b][top] += 1
        update = np.zeros(mat.shape)
        for b, sl in enumerate(grid):
            mean = np.where(counts[b] > 0, sums[b] / np.maximum(counts[b], 1), 0.0)
            update[sl] = scipy.fft.idctn(mean.reshape(bshape), norm="ortho")
        p -= lr * np.sign(update).reshape(p.shape)


# --- the threaded runs --------------------------------------------------------------------------


def run(steps: range, world: int = 2, shapes=SHAPES, saved=None, hp=HP):
    """Per rank: (params, per-step stats, state_dict bytes) after `steps`, starting from `saved`
    (per rank (params, state bytes)) when given."""

    def rank(engine):
        params = init_params(shapes) if saved is None else [t.clone() for t in saved[engine.rank][0]]
        params = [torch.nn.Parameter(t) for t in params]
        stats = StepStats()
        opt = DeMo(params, engine=engine, stats=stats, **hp)
        if saved is not None:
            opt.load_state_dict(torch.load(io.BytesIO(saved[engine.rank][1]), weights_only=True))
        booked = []
        for step in steps:
            for j, p in enumerate(params):
                p.grad = grad(engine.rank, step, j, p.shape)
            stats.reset()
            opt.step()
            booked.append((stats.bytes_sent, stats.bytes_dense, stats.calls_compressed))
        buf = io.BytesIO()
        torch.save(opt.state_dict(), buf)
        return [p.detach().clone() for p in params], booked, buf.getvalue()

    return ThreadWorld(world).run(rank)


def test_update_matches_reference():
    steps = range(3)
    out = run(steps)
    params = [p.double().numpy().copy() for p in init_params()]
    deltas = [[np.zeros(p.shape) for p in params] for _ in range(2)]
    for step in steps:
        grads = [[grad(r, step, j, p.shape).double().numpy() for j, p in enumerate(params)] for r in range(2)]
        ref_step(params, deltas, grads, **HP)
    for r in range(2):
        mine, _, state = out[r]
        for j, (a, b) in enumerate(zip(mine, params, strict=True)):
            np.testing.assert_allclose(a.numpy(), b, rtol=0, atol=1e-5, err_msg=f"rank {r} param {j}")
        sd = torch.load(io.BytesIO(state), weights_only=True)["state"]
        for j in range(len(params)):
            assert sd[j]["step"] == 3
            np.testing.assert_allclose(sd[j]["delta"].numpy(), deltas[r][j], rtol=0, atol=1e-5)
    # same parameters on every rank (each applies the same gathered update)
    assert all(torch.equal(a, b) for a, b in zip(out[0][0], out[1][0], strict=True))


def test_bytes_exact():
    out = run(range(2))
    # chunks * k * (int16 index + fp32 value), per parameter of SHAPES
    expected = 4 * 32 * 6 + 2 * 32 * 6 + 1 * 32 * 6 + 1 * 20 * 6 + 1 * 1 * 6
    dense = 4 * (128 * 96 + 100 + 216 + 20 + 1)
    for r in range(2):
        assert out[r][1] == [(expected, dense, len(SHAPES))] * 2


def test_mean_over_senders_not_over_all_ranks():
    """Rank 0 sends DCT coefficients {0: 1, 1: 0.8}, rank 1 {0: 1, 2: -0.8} (topk 2 of a chunk of 4):
    the average over senders is [1, 0.8, -0.8, 0], whose inverse DCT is negative at element 3;
    averaging over both ranks ([1, 0.4, -0.4, 0]) would make it positive."""
    d = dct_matrix(4, torch.float64)
    coefs = [torch.tensor([1.0, 0.8, 0.0, 0.0]), torch.tensor([1.0, 0.0, -0.8, 0.0])]
    over_n = d.T @ (coefs[0] + coefs[1]).double() / 2
    assert over_n[3] > 0  # the wrong rule would step element 3 the other way

    def rank(engine):
        p = torch.nn.Parameter(torch.zeros(4))
        opt = DeMo([p], engine=engine, stats=StepStats(), lr=1.0, compression_decay=0.0, compression_topk=2)
        p.grad = (d.T @ coefs[engine.rank].double()).float()
        opt.step()
        return p.detach().clone(), opt.state[p]["delta"].clone()

    for p, delta in ThreadWorld(2).run(rank):
        assert p.tolist() == [-1.0, -1.0, -1.0, 1.0]
        assert delta.abs().max() < 1e-6  # everything was sent: nothing left in delta


def test_dct_is_orthonormal_dct2():
    x = torch.randn(128, 96, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for n in (1, 5, 48, 64):
        d = dct_matrix(n, torch.float64)
        torch.testing.assert_close(d @ d.T, torch.eye(n, dtype=torch.float64))
        v = x[0, :n]
        want = scipy.fft.dct(v.numpy(), type=2, norm="ortho")
        np.testing.assert_allclose((d @ v).numpy(), want, atol=1e-12)
    tf = ChunkDCT(x.shape, 64, torch.float64, torch.device("cpu"))
    coef = tf.encode(x)
    assert coef.shape == (2, 2, 64 * 48)
    # coefficient (a, b) of chunk (y, x) at index a*48 + b: scipy's 2-D DCT-II of the block, row-major
    block = x[64:128, 48:96].numpy()
    want = scipy.fft.dctn(block, norm="ortho").reshape(-1)
    np.testing.assert_allclose(coef[1, 1].numpy(), want, atol=1e-12)
    torch.testing.assert_close(tf.decode(coef), x)  # the inverse recovers the input
    vec = ChunkDCT(torch.Size([100]), 64, torch.float64, torch.device("cpu"))
    torch.testing.assert_close(vec.decode(vec.encode(x.reshape(-1)[:100])), x.reshape(-1)[:100])


@pytest.mark.parametrize(("dim", "want"),
                         [(64, 64), (96, 48), (100, 50), (10, 10), (67, 1), (4096, 64), (1, 1)])
def test_chunk_size_is_the_references(dim, want):
    assert chunk_size(dim, 64) == want == ref_split(dim, 64)


def test_resume_is_exact():
    whole = run(range(5))
    first = run(range(2))
    resumed = run(range(2, 5), saved=[(first[r][0], first[r][2]) for r in range(2)])
    for r in range(2):
        assert all(torch.equal(a, b) for a, b in zip(whole[r][0], resumed[r][0], strict=True))
        a = torch.load(io.BytesIO(whole[r][2]), weights_only=True)["state"]
        b = torch.load(io.BytesIO(resumed[r][2]), weights_only=True)["state"]
        assert all(a[j]["step"] == b[j]["step"] == 5 and torch.equal(a[j]["delta"], b[j]["delta"]) for j in a)


@pytest.mark.parametrize("bad", [dict(compression_topk=0), dict(compression_chunk=0),
                                 dict(compression_decay=1.0), dict(lr=-1.0), dict(weight_decay=-0.1)])
def test_bad_settings_raise(bad):
    with pytest.raises(ValueError, match="DeMo"):
        DeMo([torch.nn.Parameter(torch.zeros(2))], engine=None, stats=StepStats(), **{**HP, **bad})
