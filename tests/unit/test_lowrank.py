"""Low-rank compressors: ATOMO (unbiased SVD-atom sampling) and PowerSGD (both APIs)."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from compbench.catalog import registry
from compbench.compressors import SELECTION_KEYS, payload_nbytes
from compbench.compressors.atomo import Atomo, atomo_probabilities
from compbench.compressors.lowrank import as_matrix, matrix_shape
from compbench.compressors.powersgd import PowerSGD, orthogonalize_


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _low_rank(rows: int, cols: int, q: int, seed: int) -> torch.Tensor:
    g = _gen(seed)
    return torch.randn(rows, q, generator=g) @ torch.randn(q, cols, generator=g)


def _with_spectrum(rows: int, cols: int, sigma: list[float], seed: int) -> torch.Tensor:
    g = _gen(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, len(sigma), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(sigma), generator=g, dtype=torch.float64))
    return ((u * torch.tensor(sigma, dtype=torch.float64)) @ v.T).float()


# ---------------------------------------------------------------------------------------------- helpers
def test_matrix_view_of_conv_and_vectors():
    assert matrix_shape((16, 8, 3, 3)) == (16, 72)
    assert matrix_shape((7,)) is None and matrix_shape(()) is None
    x = torch.arange(16 * 8 * 9.0).view(16, 8, 3, 3)
    assert torch.equal(as_matrix(x)[2], x[2].reshape(-1))


# ------------------------------------------------------------------------------------------------ ATOMO
@pytest.mark.parametrize("budget", [0.5, 1, 2.5, 3, 7, 50])
def test_atomo_probabilities_sum_to_min_budget_rank(budget):
    g = _gen(1)
    for trial in range(20):
        rank = 1 + trial % 12
        sigma = torch.cat([torch.rand(rank, generator=g).pow(3) * 10 + 1e-3, torch.zeros(5)])
        sigma = sigma.sort(descending=True).values.double()
        p = atomo_probabilities(sigma, budget)
        assert math.isclose(float(p.sum()), min(budget, rank), rel_tol=1e-9)
        assert ((p[:rank] > 0) & (p[:rank] <= 1)).all()
        assert (p[rank:] == 0).all()
        # p_i = min(1, c * sigma_i): a larger atom never has a smaller probability.
        assert (p[:-1] >= p[1:] - 1e-12).all()


def test_atomo_probabilities_redistribute_what_clipped_atoms_leave():
    sigma = torch.tensor([100.0, 1, 1, 1, 1], dtype=torch.float64)
    p = atomo_probabilities(sigma, 2)
    # The paper's one-shot min(1, 2*sigma/sum) gives [1, .0194, ...] (sum 1.08): budget lost.
    torch.testing.assert_close(p, torch.tensor([1.0, 0.25, 0.25, 0.25, 0.25], dtype=torch.float64))
    # Two clip levels: 50 and 40 clip, the remaining budget 1 is spread over [1, 1, 2].
    p = atomo_probabilities(torch.tensor([50.0, 40, 2, 1, 1], dtype=torch.float64), 3)
    torch.testing.assert_close(p, torch.tensor([1.0, 1, 0.5, 0.25, 0.25], dtype=torch.float64))


def test_atomo_numerically_zero_atoms_are_never_sent():
    x = _low_rank(20, 30, 2, 0)
    comp = Atomo(svd_rank=3)
    comp.begin_step(0, 0.0)
    payload, ctx = comp.compress(x, "w")
    # Rank 2 <= budget 3: both atoms with p = 1, the rounding-noise atoms with p = 0: exact.
    assert payload[2].numel() == 2
    torch.testing.assert_close(comp.decompress(payload, ctx), x, rtol=1e-4, atol=1e-4)
    assert payload_nbytes(payload) == comp.payload_bytes(x.shape, 2) == 4 * 2 * (20 + 30 + 1)


@pytest.mark.parametrize("budget", [1, 2.5, 6])
def test_atomo_unbiased_with_several_budgets(budget):
    x = _with_spectrum(12, 16, [5, 3, 2, 1.5, 1, 0.7, 0.5, 0.3, 0.2, 0.1], 3)
    comp = Atomo(svd_rank=budget)
    trials = 3000
    total = torch.zeros(x.shape, dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    atoms = []
    for i in range(trials):
        comp.begin_step(i, 0.0)
        payload, ctx = comp.compress(x, "w")
        d = comp.decompress(payload, ctx).double()
        total += d
        total_sq += d * d
        atoms.append(payload[2].numel())
    mean = total / trials
    se = ((total_sq / trials - mean * mean).clamp_min(0) / trials).sqrt()
    bad = ((mean - x.double()).abs() > 4 * se + 1e-6).double().mean().item()
    assert bad < 5e-3, f"{bad:.2%} of elements outside 4 standard errors"
    # The expected number of atoms is exactly the budget (water-filled probabilities).
    counts = torch.tensor(atoms, dtype=torch.float64)
    assert abs(counts.mean().item() - budget) < 4 * counts.std().item() / math.sqrt(trials) + 1e-9


def test_atomo_wire_format_and_bytes_for_conv_weight():
    x = torch.randn(16, 8, 3, 3, generator=_gen(4))
    comp = Atomo()
    comp.begin_step(5, 0.0)
    (u, vh, s), ctx = comp.compress(x, "conv")
    m = s.numel()
    assert u.numel() == 16 * m and vh.numel() == m * 72 and s.dtype == torch.float32
    sent = payload_nbytes([u, vh, s])
    assert sent == comp.payload_bytes(x.shape, m) == 4 * m * (16 + 72 + 1)
    assert sent <= comp.max_wire_bytes(x.numel())
    assert comp.wire_bytes(x.numel()) is None


def test_atomo_max_wire_bytes_bounds_every_matrix_shape():
    comp = Atomo()
    for n in [1, 12, 97, 360, 1024]:
        for rows in range(1, n + 1):
            if n % rows == 0:
                cols = n // rows
                assert 4 * min(rows, cols) * (rows + cols + 1) <= comp.max_wire_bytes(n)
    assert comp.max_wire_bytes(1024) == 4 * 32 * (32 + 32 + 1)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 40)])
def test_atomo_dense_when_atoms_would_not_be_smaller(shape):
    x = torch.randn(shape, generator=_gen(5))
    comp = Atomo(svd_rank=3)
    payload, ctx = comp.compress(x, "b")
    assert len(payload) == 1 and payload_nbytes(payload) == 4 * x.numel()
    assert torch.equal(comp.decompress(payload, ctx), x)


def test_atomo_draws_depend_on_rank_step_and_name(monkeypatch):
    x = _with_spectrum(30, 40, [1.0] * 20, 6)  # flat spectrum: every atom has p = 3/20

    def kept(step: int, name: str = "w") -> torch.Tensor:
        comp = Atomo(svd_rank=3)
        comp.begin_step(step, 0.0)
        return comp.compress(x, name)[0][0]  # U of the kept atoms: says which atoms were drawn

    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    monkeypatch.setenv("RANK", "0")
    r0 = kept(1)
    assert torch.equal(r0, kept(1)), "same (rank, step, name) must reproduce"
    assert not torch.equal(r0, kept(2)) or not torch.equal(r0, kept(3)), "a new step draws anew"
    assert not torch.equal(r0, kept(1, "v")) or not torch.equal(r0, kept(1, "u")), "so does a new name"
    rank0 = [kept(step) for step in range(1, 5)]
    monkeypatch.setenv("RANK", "1")
    r1 = kept(1)
    rank1 = [kept(step) for step in range(1, 5)]
    assert any(not torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True)), "ranks draw independently"
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("HOROVOD_RANK", "1")
    assert torch.equal(kept(1), r1), "HOROVOD_RANK is read when RANK is unset"


def test_atomo_fused_decompress_all_equals_mean_of_decodes():
    comp = Atomo(svd_rank=2)
    payloads = []
    for step in range(4):
        comp.begin_step(step, 0.0)
        p, ctx = comp.compress(torch.randn(24, 18, generator=_gen(10 + step)), "w")
        payloads.append(p)
    expected = torch.stack([comp.decompress(p, ctx) for p in payloads]).mean(0)
    torch.testing.assert_close(comp.decompress_all(payloads, ctx), expected)


def test_atomo_decodes_an_empty_draw_to_zeros():
    comp = Atomo()
    ctx = comp.compress(torch.randn(10, 20, generator=_gen(0)), "w")[1]
    empty = [torch.zeros(0), torch.zeros(0), torch.zeros(0)]
    assert torch.equal(comp.decompress(empty, ctx), torch.zeros(10, 20))


@pytest.mark.parametrize("bad", [0, -1, -0.5, True, "3"])
def test_atomo_rejects_bad_svd_rank(bad):
    with pytest.raises(ValueError, match="compressor=atomo: svd_rank="):
        Atomo(svd_rank=bad)


# --------------------------------------------------------------------------------------------- PowerSGD
def test_orthogonalize_gives_orthonormal_columns_and_survives_rank_deficiency():
    p = torch.randn(50, 4, generator=_gen(0))
    orthogonalize_(p)
    torch.testing.assert_close(p.T @ p, torch.eye(4), atol=1e-5, rtol=0)
    # Column 2 depends on columns 0 and 1: it must become ~0, not NaN; the others stay orthonormal.
    d = torch.randn(50, 4, generator=_gen(1))
    d[:, 2] = 2 * d[:, 0] - d[:, 1]
    orthogonalize_(d)
    assert torch.isfinite(d).all()
    assert torch.equal(d[:, 2], torch.zeros(50))
    keep = d[:, [0, 1, 3]]
    torch.testing.assert_close(keep.T @ keep, torch.eye(3), atol=1e-5, rtol=0)
    z = torch.zeros(10, 2)
    assert torch.equal(orthogonalize_(z), torch.zeros(10, 2))


def _started(**kw) -> PowerSGD:
    comp = PowerSGD(**kw)
    comp.begin_step(comp.start_iter, 0.0)
    return comp


@pytest.mark.parametrize("q", [1, 2, 3])
@pytest.mark.parametrize("shape", [(40, 30), (16, 8, 3, 3)], ids=str)
def test_powersgd_local_exact_recovery_of_low_rank(q, shape):
    rows, cols = matrix_shape(shape)
    x = _low_rank(rows, cols, q, q).view(shape)
    comp = _started(rank=q)
    payload, ctx = comp.compress(x, "w")
    assert payload_nbytes(payload) == 4 * q * (rows + cols) == comp.payload_bytes(x.shape)
    out = comp.decompress(payload, ctx)
    assert (out - x).norm() / x.norm() < 1e-5


def test_powersgd_warm_start_converges_to_best_rank_q():
    sigma = [4.0, 3.0, 1.5, 1.0, 0.5]
    x = _with_spectrum(60, 50, sigma, 7)
    best = math.sqrt(sum(s * s for s in sigma[2:]))  # Eckart-Young, q = 2
    warm = _started(rank=2)
    errors = []
    first = warm.compress(x, "w")
    errors.append((warm.decompress(*first) - x).norm().item())
    for _ in range(24):
        payload, ctx = warm.compress(x, "w")
        # Warm start: the Q sent is the Q kept for the next step.
        assert torch.equal(payload[1].view(50, 2), warm._q["w"])
        errors.append((warm.decompress(payload, ctx) - x).norm().item())
    assert errors[-1] < best * 1.001
    # Later steps did not touch an earlier payload (the kept Q is not the payload's tensor).
    assert (warm.decompress(*first) - x).norm().item() == errors[0]
    assert errors[0] > best * 1.02, "one cold power step is not optimal on this spectrum"
    # Without warm start (fresh state every step) the error stays at the cold level.
    cold = _started(rank=2).compress(x, "w")
    assert (PowerSGD(rank=2).decompress(*cold) - x).norm().item() == pytest.approx(errors[0], rel=1e-5)


def test_powersgd_rank_deficient_gradient_gives_zero_columns_then_regains_rank():
    comp = _started(rank=2)
    one = _low_rank(30, 20, 1, 0)
    payload, ctx = comp.compress(one, "w")
    p = payload[0].view(30, 2)
    assert torch.isfinite(p).all() and torch.equal(p[:, 1], torch.zeros(30))
    assert (comp.decompress(payload, ctx) - one).norm() / one.norm() < 1e-5
    assert torch.equal(comp._q["w"][:, 1], torch.zeros(20))
    # The zero column of the kept Q is redrawn: a rank-2 gradient is recovered at the next step.
    comp.begin_step(comp.step + 1, 0.0)
    two = _low_rank(30, 20, 2, 1)
    payload, ctx = comp.compress(two, "w")
    assert (comp.decompress(payload, ctx) - two).norm() / two.norm() < 1e-5


def test_powersgd_dense_before_start_iter():
    x = torch.randn(40, 30, generator=_gen(2))
    comp = PowerSGD(rank=1, start_iter=10)
    comp.begin_step(9, 0.0)
    payload, ctx = comp.compress(x, "w")
    assert len(payload) == 1 and payload_nbytes(payload) == 4 * x.numel() == comp.payload_bytes(x.shape)
    assert torch.equal(comp.decompress(payload, ctx), x)
    assert "w" not in comp._q
    comp.begin_step(10, 0.0)
    payload, _ = comp.compress(x, "w")
    assert payload_nbytes(payload) == 4 * (40 + 30)


def test_powersgd_min_compression_rate_and_vectors_go_dense():
    comp = _started(rank=1, min_compression_rate=2)
    # (4, 4): 1*(4+4)*2 = 16 <= 16 -> compressed; (3, 4): 7*2 = 14 > 12 -> dense.
    assert payload_nbytes(comp.compress(torch.randn(4, 4, generator=_gen(0)), "a")[0]) == 4 * 8
    assert payload_nbytes(comp.compress(torch.randn(3, 4, generator=_gen(0)), "b")[0]) == 4 * 12
    loose = _started(rank=1, min_compression_rate=1)
    assert payload_nbytes(loose.compress(torch.randn(3, 4, generator=_gen(0)), "b")[0]) == 4 * 7
    v = torch.randn(100, generator=_gen(1))
    payload, ctx = comp.compress(v, "bias")
    assert payload_nbytes(payload) == 400 and torch.equal(comp.decompress(payload, ctx), v)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"rank": 0}, "rank=0"),
        ({"rank": 1.5}, "rank=1.5"),
        ({"start_iter": 1}, "start_iter=1 must be an integer > 1"),
        ({"start_iter": 0}, "start_iter=0"),
        ({"min_compression_rate": 0.5}, "min_compression_rate=0.5"),
    ],
)
def test_powersgd_rejects_bad_parameters(kw, match):
    with pytest.raises(ValueError, match=f"compressor=powersgd: {match}"):
        PowerSGD(**kw)


class _FakeAllreduce:
    """Mean over `world` simulated ranks, each a thread calling in lock-step (like a real collective)."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * world
        self.calls = 0

    def for_rank(self, rank: int):
        def allreduce_mean(t: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = t.clone()
            self.barrier.wait()
            out = torch.stack(self.slots).mean(0)  # same order on every rank: identical results
            if rank == 0:
                self.calls += 1
            self.barrier.wait()
            return out

        return allreduce_mean


def _lockstep(comps: list[PowerSGD], xs: list[torch.Tensor], name: str, fake: _FakeAllreduce):
    results: list = [None] * len(comps)
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            results[rank] = comps[rank].compress_collective(xs[rank], name, fake.for_rank(rank))
        except BaseException as e:  # surface a rank's failure in the test thread
            errors.append(e)
            fake.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(comps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("q", [1, 2, 3])
def test_powersgd_collective_recovers_rank_q_average_identically_on_both_ranks(q):
    comps = [_started(rank=q), _started(rank=q)]
    fake = _FakeAllreduce(2)
    avg = _low_rank(48, 36, q, 100)
    for t in range(4):
        comps[0].begin_step(10 + t, 0.0)
        comps[1].begin_step(10 + t, 0.0)
        noise = torch.randn(48, 36, generator=_gen(200 + t))  # full rank, cancels in the average
        (o0, b0), (o1, b1) = _lockstep(comps, [avg + noise, avg - noise], "w", fake)
        assert torch.equal(o0, o1)
        assert b0 == b1 == 4 * q * (48 + 36)
        # Exact up to fp32 rounding from the first (random-Q) step on, and it stays so warm-started.
        assert (o0 - avg).norm() / avg.norm() < 2e-6
    assert fake.calls == 2 * 4, "one allreduce of P and one of Q per step"
    # error_r = M_r - P Q^T keeps each rank's (accumulated) noise; the two cancel in the average.
    pending = comps[0]._error["w"] + comps[1]._error["w"]
    torch.testing.assert_close(pending, torch.zeros(48, 36), atol=1e-4, rtol=0)


def test_powersgd_collective_error_feedback_keeps_local_minus_averaged_approximation():
    comps = [_started(rank=1), _started(rank=1)]
    fake = _FakeAllreduce(2)
    sum_avg = torch.zeros(30, 20)
    sum_out = torch.zeros(30, 20)
    for t in range(5):
        gs = [torch.randn(30, 20, generator=_gen(10 * t + r)) for r in range(2)]
        prev = [c._error.get("w", torch.zeros(30, 20)).clone() for c in comps]
        (o0, _), (o1, _) = _lockstep(comps, gs, "w", fake)
        for r in range(2):
            # error_r = (g_r + previous error_r) - the averaged approximation P Q^T.
            torch.testing.assert_close(comps[r]._error["w"], gs[r] + prev[r] - o0)
        sum_avg += (gs[0] + gs[1]) / 2
        sum_out += o0
    # Nothing is lost: what was applied plus the mean pending error is what the ranks computed.
    mean_err = (comps[0]._error["w"] + comps[1]._error["w"]) / 2
    torch.testing.assert_close(sum_out + mean_err, sum_avg, atol=1e-5, rtol=1e-5)


def test_powersgd_collective_dense_phase_and_vectors_average_exactly():
    comps = [PowerSGD(), PowerSGD()]
    fake = _FakeAllreduce(2)
    for c in comps:
        c.begin_step(3, 0.0)
    xs = [torch.randn(12, 10, generator=_gen(r)) for r in range(2)]
    (o0, b0), (o1, _) = _lockstep(comps, xs, "w", fake)
    torch.testing.assert_close(o0, (xs[0] + xs[1]) / 2)
    assert b0 == 4 * 120 and torch.equal(o0, o1) and comps[0]._error == {}
    for c in comps:
        c.begin_step(50, 0.0)
    vs = [torch.randn(9, generator=_gen(5 + r)) for r in range(2)]
    (v0, bv), _ = _lockstep(comps, vs, "bias", fake)
    torch.testing.assert_close(v0, (vs[0] + vs[1]) / 2)
    assert bv == 36


def test_powersgd_state_dict_round_trip_reproduces_the_next_step():
    a = _started(rank=2)
    fake = _FakeAllreduce(1)
    for t in range(3):
        _lockstep([a], [torch.randn(20, 16, generator=_gen(t))], "w", fake)
    b = _started(rank=2)
    b.load_state_dict(a.state_dict())
    x = torch.randn(20, 16, generator=_gen(9))
    (oa, _), = _lockstep([a], [x], "w", fake)
    (ob, _), = _lockstep([b], [x], "w", fake)
    assert torch.equal(oa, ob)


# ---------------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name, cls", [("atomo", Atomo), ("powersgd", PowerSGD)])
def test_yaml_builds_with_the_class_defaults(name, cls):
    path = Path(__file__).resolve().parents[2] / "conf" / "compressor" / f"{name}.yaml"
    cfg = OmegaConf.to_container(OmegaConf.load(path))
    built = registry.build(cfg, drop=SELECTION_KEYS)
    default = cls()
    assert type(built) is cls and vars(built).keys() == vars(default).keys()
    for key, value in vars(default).items():
        if not isinstance(value, dict):
            assert getattr(built, key) == value, key


@pytest.mark.parametrize("dead_cols", [[], [1], [0, 2]])
def test_powersgd_redraw_chosen_on_the_device_is_the_hosts(dead_cols):
    # On a GPU the redraw is chosen by the device (no host read of `dead`): the same Q bit for bit.
    comp = _started(rank=3)
    q = orthogonalize_(torch.randn(20, 3, generator=_gen(5)))
    q[:, dead_cols] = 0
    dead = q.abs().amax(0) == 0
    host = comp._redraw_dead(q.clone(), dead, "w", on_device=False)
    device = comp._redraw_dead(q.clone(), dead, "w", on_device=True)
    assert torch.equal(host, device)
    assert torch.equal(host, q) == (not dead_cols)
    assert bool((host.abs().amax(0) > 0).all())
