"""Focused tests of the sparsifiers (topk, randk, dgc, dragonn, graddrop), their shared decode and
memory=dgc. The contract tests (test_compressor_contract.py) cover the generic seam."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from compbench.codec.base import make_ctx
from compbench.compressors import build_compressor
from compbench.compressors.dgc import DGC, sample_layout
from compbench.compressors.dgc import _select as dgc_select
from compbench.compressors.dragonn import DRAGONN, murmur3_32
from compbench.compressors.randk import RandK, _draw_indices
from compbench.compressors.sparse import Workspace, magnitudes, sparse_decode, sparse_decode_all
from compbench.compressors.topk import TopK
from compbench.memory.dgc import DGCMemory


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- MurmurHash3_x86_32


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def _murmur3_bytes(data: bytes, seed: int) -> int:
    """Independent byte-wise MurmurHash3_x86_32 (Appleby's reference algorithm, any length)."""
    c1, c2, m = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & m
    nblocks = len(data) // 4
    for i in range(nblocks):
        k = data[4 * i] | data[4 * i + 1] << 8 | data[4 * i + 2] << 16 | data[4 * i + 3] << 24
        k = _rotl(k * c1 & m, 15) * c2 & m
        h = (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & m
    tail, k = data[4 * nblocks :], 0
    for j in reversed(range(len(tail))):
        k ^= tail[j] << (8 * j)
    if tail:
        h ^= _rotl(k * c1 & m, 15) * c2 & m
    h ^= len(data)
    h ^= h >> 16
    h = h * 0x85EBCA6B & m
    h ^= h >> 13
    h = h * 0xC2B2AE35 & m
    return h ^ (h >> 16)


def test_reference_murmur3_matches_published_vectors():
    # Published MurmurHash3_x86_32 test vectors: validate the byte-wise reference itself.
    assert _murmur3_bytes(b"", 0) == 0
    assert _murmur3_bytes(b"", 1) == 0x514E28B7
    assert _murmur3_bytes(b"", 0xFFFFFFFF) == 0x81F16F39
    assert _murmur3_bytes(b"\0\0\0\0", 0) == 0x2362F9DE
    assert _murmur3_bytes(b"aaaa", 0x9747B28C) == 0x5A97808A
    assert _murmur3_bytes(b"Hello, world!", 0x9747B28C) == 0x24884CBA
    assert _murmur3_bytes(bytes([0x21, 0x43, 0x65, 0x87]), 0) == 0xF55B516B
    assert _murmur3_bytes(bytes([0x21, 0x43, 0x65, 0x87]), 0x5082EDEE) == 0x2362F9DE


@pytest.mark.parametrize("seed", [0, 1, 0x9747B28C, 0xFFFFFFFF, 123456789])
def test_murmur3_32_matches_bytewise_reference(seed):
    keys = torch.cat(
        [
            torch.tensor([0, 1, 2, 0x87654321, 2**31 - 1, 2**31, 2**32 - 1]),
            torch.randint(0, 2**32, (500,), generator=torch.Generator().manual_seed(seed % 1000)),
        ]
    )
    got = murmur3_32(keys, seed)
    assert got.dtype == torch.int64
    expected = [_murmur3_bytes(struct.pack("<I", int(k)), seed) for k in keys]
    assert got.tolist() == expected
    assert murmur3_32(torch.tensor([0x87654321]), 0).item() == 0xF55B516B


# ---------------------------------------------------------------- fused sparse decode


def test_fused_decode_adds_duplicates_and_averages():
    ctx = make_ctx(torch.zeros(2, 3), "t")
    p1 = [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0, 5, 0], dtype=torch.int32)]  # duplicate 0
    p2 = [torch.tensor([10.0, 20.0]), torch.tensor([5, 2], dtype=torch.int32)]
    p3 = [torch.tensor([], dtype=torch.float32), torch.tensor([], dtype=torch.int32)]  # sent nothing
    torch.testing.assert_close(sparse_decode(p1, ctx), torch.tensor([[5.0, 0, 0], [0, 0, 2.0]]))
    fused = sparse_decode_all([p1, p2, p3], ctx)
    expected = torch.tensor([[5.0, 0.0, 20.0], [0.0, 0.0, 12.0]]) / 3
    torch.testing.assert_close(fused, expected)
    singles = sum(sparse_decode(p, ctx) for p in (p1, p2, p3)) / 3
    torch.testing.assert_close(fused, singles)


def test_fused_decode_of_real_payloads_equals_mean_of_single_decodes():
    comp = DRAGONN(ratio=0.05)
    comp.begin_step(3, 0.0)
    xs = [_randn(50, 40, seed=s) for s in range(4)]
    payloads = [comp.compress(x, "w")[0] for x in xs]
    ctx = comp.compress(xs[0], "w")[1]
    single = torch.stack([comp.decompress(p, ctx) for p in payloads]).mean(0)
    torch.testing.assert_close(comp.decompress_all(payloads, ctx), single)
    comp.batching = False
    torch.testing.assert_close(comp.decompress_all(payloads, ctx), single)


# ---------------------------------------------------------------- topk


@pytest.mark.parametrize("n", [1000, 200_000])
def test_topk_selects_the_true_topk(n):
    x = _randn(n, seed=1)
    comp = TopK(ratio=0.01)
    payload, ctx = comp.compress(x, "w")
    k = math.ceil(n * 0.01)
    assert payload[1].dtype == torch.int32 and payload[1].numel() == k
    assert set(payload[1].tolist()) == set(torch.topk(x.abs(), k).indices.tolist())
    torch.testing.assert_close(payload[0], x[payload[1].long()])


@pytest.mark.parametrize("big_on_sample", [True, False])
def test_topk_exact_when_the_strided_sample_is_misleading(big_on_sample):
    # Large values exactly on (or exactly off) the positions a strided sample would read.
    n, k = 200_000, 2000
    x = _randn(n, seed=2) * 0.01
    on = torch.zeros(n, dtype=torch.bool)
    for stride in (31, 32, 33):
        on[::stride] = True
    x[on if big_on_sample else ~on] += 5.0 + torch.rand(int((on if big_on_sample else ~on).sum()))
    payload, _ = TopK(ratio=k / n).compress(x, "w")
    assert set(payload[1].tolist()) == set(torch.topk(x.abs(), k).indices.tolist())


# ---------------------------------------------------------------- randk


def test_randk_ranks_draw_identical_indices_per_step_and_name():
    rank0, rank1 = RandK(ratio=0.01, seed=7), RandK(ratio=0.01, seed=7)
    x0, x1 = _randn(300, 200, seed=0), _randn(300, 200, seed=1)
    seen = []
    for step in range(3):
        rank0.begin_step(step, 0.0)
        rank1.begin_step(step, 0.0)
        p0, c0 = rank0.compress(x0, "layer.weight")
        p1, c1 = rank1.compress(x1, "layer.weight")
        i0, i1 = rank0.sent_indices(p0, c0), rank1.sent_indices(p1, c1)
        assert torch.equal(i0, i1)
        assert i0.numel() == 600 and i0.unique().numel() == 600
        assert i0.min() >= 0 and i0.max() < 60_000
        torch.testing.assert_close(p0[0], x0.reshape(-1)[i0])
        assert payload_bytes(p0) == 4 * 600  # values only
        seen.append(i0)
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    # Another tensor name (same step) draws other indices.
    _, c_other = rank0.compress(x0, "other.weight")
    assert not torch.equal(c_other.meta["indices"], seen[2])
    # Summable: the summed payloads decoded once give the average.
    avg = rank0.decompress_all([p0, p1], c0)
    torch.testing.assert_close(avg, (rank0.decompress(p0, c0) + rank0.decompress(p1, c0)) / 2)


def payload_bytes(p):
    return sum(t.numel() * t.element_size() for t in p)


def test_randk_draws_distinct_uniform_indices_through_the_dedupe_loop():
    # k/n = 0.2 on n > 65536: many repeated draws, so the top-up loop runs.
    n, k, trials = 80_000, 16_000, 60
    counts = torch.zeros(n)
    for s in range(trials):
        idx = _draw_indices(n, k, torch.Generator().manual_seed(s))
        assert idx.numel() == k and idx.unique().numel() == k
        assert torch.equal(idx, idx.sort().values) and idx.min() >= 0 and idx.max() < n
        counts[idx] += 1
    # Inclusion probability k/n everywhere: compare 10 contiguous blocks (8000 * 60 draws each).
    rate = counts.view(10, -1).mean(1) / trials
    assert (rate - k / n).abs().max() < 0.01, rate


def test_randk_scale_is_unbiased_and_flags_itself():
    assert RandK(scale=True).caps.unbiased and not RandK(scale=False).caps.unbiased
    assert build_compressor("randk").caps.unbiased is False
    comp = RandK(ratio=0.05, scale=True)
    x = _randn(400, seed=3)
    trials = 1000
    total = torch.zeros(400, dtype=torch.float64)
    total_sq = torch.zeros(400, dtype=torch.float64)
    for i in range(trials):
        comp.begin_step(i, 0.0)
        p, ctx = comp.compress(x, "t")
        d = comp.decompress(p, ctx).double()
        total += d
        total_sq += d * d
    mean = total / trials
    se = ((total_sq / trials - mean**2).clamp_min(0) / trials).sqrt()
    assert ((mean - x.double()).abs() > 4 * se + 1e-6).float().mean() < 5e-3
    # The scale is n/k exactly: every sent value is 20x the entry.
    torch.testing.assert_close(p[0], x[ctx.meta["indices"]] * 20.0)


# ---------------------------------------------------------------- dgc


def test_dgc_warmup_ratios_for_5_epochs():
    comp = DGC(ratio=1e-3, warmup_epochs=5)
    got = []
    for epoch in range(7):
        comp.begin_step(epoch * 100, float(epoch))
        got.append(comp.ratio)
    assert got == pytest.approx([0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001, 0.001])
    comp.begin_step(150, 1.5)  # fractional epochs stay on the epoch's ratio
    assert comp.ratio == 0.0625
    comp.begin_step(0, 0.0)
    payload, _ = comp.compress(_randn(100, 100, seed=4), "w")
    assert payload[1].numel() <= 2500 and payload[1].numel() >= 0.8 * 2500
    assert comp.max_wire_bytes(10_000) == 8 * 2500
    assert DGC(ratio=1e-3).ratio == 1e-3  # no warm-up by default


def test_dgc_sends_between_08k_and_k_on_gaussian_data():
    n, r = 500_000, 1e-3
    k = math.ceil(n * r)
    comp = DGC(ratio=r)
    x = _randn(n, seed=5)
    for step in range(5):
        comp.begin_step(step, 0.0)
        payload, _ = comp.compress(x, "w")
        idx = payload[1].long()
        assert 0.8 * k <= idx.numel() <= k
        assert idx.unique().numel() == idx.numel()
        torch.testing.assert_close(payload[0], x[idx])
        # Everything sent is at least as large as everything not sent (a threshold rule).
        unsent = torch.ones(n, dtype=torch.bool)
        unsent[idx] = False
        assert payload[0].abs().min() >= x[unsent].abs().max()


def test_dgc_exact_topk_among_too_many_candidates():
    # Ties at the threshold make far more than 1.3k candidates: DGC must send the exact top-k.
    n, r = 10_000, 0.01
    k = 100
    x = torch.zeros(n)
    x[:50] = torch.linspace(2.0, 3.0, 50)  # 50 clear winners
    x[1000:1400] = 1.0  # 400 tied candidates at the k-th value
    payload, _ = DGC(ratio=r, sample_ratio=1.0).compress(x, "w")
    idx = set(payload[1].tolist())
    assert len(idx) == k
    assert set(range(50)) <= idx
    assert sorted(payload[0].tolist(), reverse=True) == torch.topk(x, k).values.tolist()


def test_dgc_lowers_the_threshold_when_the_sample_overshoots():
    # The strided sample only sees large values: its threshold passes far fewer than 0.8k, so DGC
    # multiplies it by 0.8 until enough pass, then keeps the exact top-k.
    n, r = 100_000, 0.01
    k = 1000
    stride, _ = sample_layout(n, r, 0.01)
    gen_seed = 11
    start = int(torch.randint(stride, (1,), generator=torch.Generator().manual_seed(gen_seed)))
    x = 5.0 + torch.rand(n, generator=torch.Generator().manual_seed(0))  # in [5, 6)
    x[start::stride] = 10.0 + torch.rand(x[start::stride].numel())  # in [10, 11)
    ws = Workspace()
    mag = magnitudes(x, ws)
    idx = dgc_select(mag, k, r, 0.01, torch.Generator().manual_seed(gen_seed), ws)
    assert idx.numel() == k
    assert set(idx.tolist()) == set(torch.topk(x, k).indices.tolist())


def test_dgc_fp16_values_and_any_shape():
    comp = DGC(ratio=0.1, fp16_values=True)
    for shape in [(1,), (7,), (5, 4, 3)]:
        x = _randn(*shape, seed=6)
        payload, ctx = comp.compress(x, "b")
        assert payload[0].dtype == torch.float16 and payload[1].dtype == torch.int32
        assert comp.decompress(payload, ctx).shape == x.shape
        assert sum(t.numel() * t.element_size() for t in payload) <= comp.max_wire_bytes(x.numel())
    assert comp.max_wire_bytes(1000) == 6 * 100


# ---------------------------------------------------------------- dragonn


def test_dragonn_budget_and_survivors_on_gaussian_1e6():
    n, r = 1_000_000, 1e-3
    k = math.ceil(n * r)
    x = _randn(n, seed=7)
    exact = DRAGONN(ratio=r, sample_ratio=1.0)  # threshold = the exact k-th magnitude: ~k pass
    sampled = DRAGONN(ratio=r)  # the default 1% sample: noisy one-shot threshold
    counts = []
    for step in range(20):
        for comp in (exact, sampled):
            comp.begin_step(step, 0.0)
            payload, _ = comp.compress(x, "w")
            idx = payload[1].long()
            assert idx.numel() <= 4 * k
            assert idx.unique().numel() == idx.numel()
            torch.testing.assert_close(payload[0], x[idx])
            if comp is exact:
                # 4k slots, k writers: 4k(1 - e^(-1/4)) ~ 0.885k survive.
                assert 0.8 * k <= idx.numel() <= k
            else:
                counts.append(idx.numel())
    # One-shot 1% sample: the count passing varies by ~30% from call to call; on average ~0.88k.
    assert sum(counts) / len(counts) >= 0.8 * k
    assert sampled.max_wire_bytes(n) == 8 * 4 * k


def test_dragonn_budget_when_everything_passes():
    comp = DRAGONN(ratio=1e-3, small_numel=0)
    payload, _ = comp.compress(torch.ones(300_000), "w")  # all tied: every element writes
    assert 0 < payload[1].numel() <= 4 * 300
    assert sum(t.numel() * t.element_size() for t in payload) <= comp.max_wire_bytes(300_000)


def test_dragonn_can_select_element_0():
    comp = DRAGONN(ratio=0.01)
    payload, _ = comp.compress(torch.tensor([3.0]), "w")
    assert payload[1].tolist() == [0] and payload[0].tolist() == [3.0]
    # k = 1 and only element 0 passes the (exact) threshold: it must be sent, whatever the hash seed.
    x = _randn(5000, seed=8) * 1e-3
    x[0] = 10.0
    for step in range(5):
        comp = DRAGONN(ratio=1 / 5000, sample_ratio=1.0, small_numel=0)
        comp.begin_step(step, 0.0)
        payload, _ = comp.compress(x, "w")
        assert payload[1].tolist() == [0]


def test_dragonn_small_tensor_ratio_rule():
    comp = DRAGONN(ratio=1e-3)
    assert comp.k_for(131072) == math.ceil(131072 * 0.01)
    assert comp.k_for(131073) == math.ceil(131073 * 1e-3)
    assert DRAGONN(ratio=0.1).k_for(1000) == 100  # never compresses small tensors harder


def test_dragonn_hash_seed_changes_every_step():
    x = _randn(100_000, seed=9)
    comp = DRAGONN(ratio=0.01, sample_ratio=1.0)
    sets = []
    for step in range(2):
        comp.begin_step(step, 0.0)
        sets.append(set(comp.compress(x, "w")[0][1].tolist()))
    assert sets[0] != sets[1]


# ---------------------------------------------------------------- graddrop


def test_graddrop_sends_everything_above_its_threshold():
    n, r = 200_000, 0.01
    k = math.ceil(n * r)
    comp = build_compressor("graddrop", ratio=r)
    x = _randn(n, seed=10)
    payload, _ = comp.compress(x, "w")
    idx = payload[1].long()
    assert 0.5 * k <= idx.numel() <= 2 * k
    unsent = torch.ones(n, dtype=torch.bool)
    unsent[idx] = False
    assert payload[0].abs().min() >= x[unsent].abs().max()


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("topk", {"ratio": 0}),
        ("randk", {"ratio": 2}),
        ("dgc", {"ratio": -1}),
        ("dragonn", {"ratio": 0}),
        ("graddrop", {"ratio": 1.5}),
        ("dgc", {"warmup_coeff": 1.0}),
        ("dragonn", {"sample_ratio": 0}),
    ],
)
def test_bad_parameters_raise_one_line_value_errors(name, kwargs):
    with pytest.raises(ValueError, match=f"^compressor={name}"):
        build_compressor(name, **kwargs)


# ---------------------------------------------------------------- memory=dgc


def _run_two_steps(mem: DGCMemory):
    comp = TopK(ratio=0.25)  # k = 1 of 4
    g1, g2 = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 1.0, 1.0, 1.0])
    v = mem.compensate(g1, "w")
    v_before = v.clone()
    payload, ctx = comp.compress(v, "w")
    assert payload[1].tolist() == [3]
    mem.update(v, "w", comp, payload, ctx)
    return v_before, mem.compensate(g2, "w").clone()


def test_dgc_memory_momentum_correction_and_masking():
    mem = DGCMemory(momentum=0.5)
    assert mem.traits.owns_momentum is True
    v1, v2 = _run_two_steps(mem)
    torch.testing.assert_close(v1, torch.tensor([1.0, 2.0, 3.0, 4.0]))  # u = g, v = u
    # Masked at index 3: u = [1, 2, 3, 0]; u = 0.5u + g2 = [1.5, 2, 2.5, 1]; v = [1, 2, 3, 0] + u.
    torch.testing.assert_close(mem.momentums["w"], torch.tensor([1.5, 2.0, 2.5, 1.0]))
    torch.testing.assert_close(v2, torch.tensor([2.5, 4.0, 5.5, 1.0]))


def test_dgc_memory_nesterov():
    mem = DGCMemory(momentum=0.5, nesterov=True)
    v1, v2 = _run_two_steps(mem)
    # u = (0 + g1) * 0.5 = [.5, 1, 1.5, 2]; v = u + g1 = [1.5, 3, 4.5, 6]; mask index 3.
    torch.testing.assert_close(v1, torch.tensor([1.5, 3.0, 4.5, 6.0]))
    # u = ([.5, 1, 1.5, 0] + g2) * .5 = [.75, 1, 1.25, .5]; v = [1.5, 3, 4.5, 0] + u + g2.
    torch.testing.assert_close(mem.momentums["w"], torch.tensor([0.75, 1.0, 1.25, 0.5]))
    torch.testing.assert_close(v2, torch.tensor([3.25, 5.0, 6.75, 1.5]))


def test_dgc_memory_without_momentum_masking_keeps_u():
    mem = DGCMemory(momentum=0.5, momentum_masking=False)
    _run_two_steps(mem)
    torch.testing.assert_close(mem.momentums["w"], torch.tensor([1.5, 2.0, 2.5, 3.0]))


def test_dgc_memory_invariant_unsent_keep_sent_zeroed():
    mem = DGCMemory(momentum=0.9)
    comp = DGC(ratio=0.05)
    g = _randn(40, 30, seed=11)
    for step in range(3):
        comp.begin_step(step, 0.0)
        v = mem.compensate(g, "w")
        before = v.clone()
        payload, ctx = comp.compress(v, "w")
        mem.update(v, "w", comp, payload, ctx)
        sent = torch.zeros(g.numel(), dtype=torch.bool)
        sent[payload[1].long()] = True
        sent = sent.view_as(g)
        after = mem.velocities["w"]
        assert torch.equal(after[~sent], before[~sent])
        assert (after[sent] == 0).all() and (mem.momentums["w"][sent] == 0).all()
        torch.testing.assert_close(after, before - comp.decompress(payload, ctx))


def test_dgc_memory_payload_stays_intact():
    # Every element sent (ratio 1): v and u are zeroed everywhere, the payload's values are not.
    mem = DGCMemory(momentum=0.0)
    comp = TopK(ratio=1.0)
    g = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    v = mem.compensate(g, "w")
    payload, ctx = comp.compress(v, "w")
    mem.update(v, "w", comp, payload, ctx)
    torch.testing.assert_close(comp.decompress(payload, ctx), g)
    assert (mem.velocities["w"] == 0).all()


def test_dgc_memory_clipping_scaled_by_world_size():
    mem = DGCMemory(momentum=0.0, gradient_clipping=1.0, world_size=4)  # local max norm 0.5
    v = mem.compensate(torch.tensor([3.0, 4.0]), "w")
    torch.testing.assert_close(v, torch.tensor([0.3, 0.4]), atol=1e-5, rtol=0)
    small = DGCMemory(momentum=0.0, gradient_clipping=1.0, world_size=4)
    torch.testing.assert_close(small.compensate(torch.tensor([0.3, 0.0]), "w"), torch.tensor([0.3, 0.0]))
    with pytest.raises(ValueError, match="^memory=dgc"):
        DGCMemory(gradient_clipping=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dgc_memory_clipping_factor_on_the_device_is_the_references_host_double(dtype):
    # the factor stays a device tensor (no host read), with the bits of the reference's arithmetic:
    # the norm read as a Python float, clip / (norm + 1e-6) in double, multiplied into g
    gen = torch.Generator().manual_seed(3)
    mem = DGCMemory(momentum=0.0, gradient_clipping=1.0, world_size=4)
    for scale in (1e-3, 0.1, 0.5, 3.0, 1e4):
        g = (torch.randn(1001, generator=gen) * scale).to(dtype)
        norm = float(torch.linalg.vector_norm(g.float()))
        want = g * (mem.clip_norm / (norm + 1e-6)) if norm > mem.clip_norm else g
        got = mem._clip(g)
        assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_dgc_memory_state_dict_round_trip():
    mem = DGCMemory(momentum=0.5)
    _run_two_steps(mem)
    state = mem.state_dict()
    other = DGCMemory(momentum=0.5)
    other.load_state_dict(state)
    for key in ("momentums", "velocities"):
        for name, t in getattr(mem, key).items():
            assert torch.equal(getattr(other, key)[name], t)
    g = torch.tensor([0.5, -1.0, 2.0, 0.0])
    torch.testing.assert_close(mem.compensate(g, "w"), other.compensate(g, "w"))
    # The state is a copy: later steps do not change it.
    assert not torch.equal(state["velocities"]["w"], mem.velocities["w"])
