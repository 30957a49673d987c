"""compressor=sparseloco against a small independent re-implementation of its reference
(tplr-ai/templar main: ChunkingTransformer without DCT, TopKCompressor with 4 quantization bins,
batch_decompress with clip_norm, prepare_gradient_dict's error feedback), plus its wire bytes, k and
the clipped mean over senders on hand-made workers."""

from __future__ import annotations

import math

import pytest
import torch

from compbench.compressors import build_compressor, payload_nbytes
from compbench.compressors.sparseloco import chunk_k, chunk_side
from compbench.memory.residual import ResidualMemory

# --- the reference, re-written from its description (einops' rearrange as view/permute) ----------


def ref_split(n: int, close_to: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for ix, val in enumerate(divisors):
        if val == close_to:
            return val
        if val > close_to:
            return val if ix == 0 else divisors[ix - 1]
    return n


def ref_encode(x: torch.Tensor, target: int = 64) -> torch.Tensor:
    if x.dim() > 1:  # "(y h) (x w) -> y x h w"
        h, w = ref_split(x.shape[0], target), ref_split(x.shape[1], target)
        return x.reshape(x.shape[0] // h, h, x.shape[1] // w, w).permute(0, 2, 1, 3).contiguous()
    w = ref_split(x.shape[0], target)
    return x.reshape(-1, w)  # "(x w) -> x w"


def ref_decode(x: torch.Tensor) -> torch.Tensor:
    if x.dim() > 2:  # "y x h w -> (y h) (x w)"
        y, xx, h, w = x.shape
        return x.permute(0, 2, 1, 3).reshape(y * h, xx * w)
    return x.reshape(-1)


def ref_compress(enc: torch.Tensor, topk: int):
    xshape = enc.shape
    x = enc.reshape(*enc.shape[:2], -1) if enc.dim() > 2 else enc
    topk = max(min(topk, x.shape[-1]), 2)
    topk -= topk % 2
    idx = torch.topk(x.abs(), k=topk, dim=-1, largest=True, sorted=False).indices
    return idx, torch.gather(x, -1, idx), xshape


def ref_quantize(val: torch.Tensor, n_bins: int = 4, range_in_sigmas: float = 6):
    offset = n_bins // 2
    shift = val.mean()
    centered = val - shift
    std = centered.norm() / math.sqrt(centered.numel() - 1)
    scale = range_in_sigmas * std / n_bins
    qval = (centered / scale + offset).round().clamp(0, n_bins - 1).to(torch.uint8)
    sums = torch.zeros(n_bins).scatter_add_(0, qval.flatten().long(), centered.flatten())
    counts = torch.zeros(n_bins).scatter_add_(0, qval.flatten().long(), torch.ones(centered.numel()))
    lookup = torch.where(counts > 0, sums / counts, torch.zeros_like(sums))
    return qval, (shift, lookup)


def ref_dequantize(q: torch.Tensor, params) -> torch.Tensor:
    shift, lookup = params
    return lookup[q.long()] + shift


def ref_decompress(idx: torch.Tensor, val: torch.Tensor, xshape) -> torch.Tensor:
    x = torch.zeros(xshape)
    if len(xshape) > 2:
        x = x.reshape(*xshape[:2], -1)
    x.scatter_reduce_(dim=-1, index=idx, src=val, reduce="mean", include_self=False)
    return x.reshape(xshape)


def ref_batch_decompress(idxs, vals, xshape) -> torch.Tensor:
    norms = torch.stack([torch.norm(v, p=2) for v in vals])
    clip = torch.median(norms)
    vals = [v * torch.clamp(clip / (norms[i] + 1e-8), max=1) for i, v in enumerate(vals)]
    return ref_decompress(torch.cat(idxs, dim=-1), torch.cat(vals, dim=-1), xshape)


def ref_round_trip(x: torch.Tensor, topk: int):
    """(decoded transmit_grad, (idx, dequantized values, encoded shape)) of one worker."""
    idx, val, xshape = ref_compress(ref_encode(x), topk)
    q, params = ref_quantize(val)
    deq = ref_dequantize(q, params)
    return ref_decode(ref_decompress(idx, deq, xshape)), (idx, deq, xshape)


# --- the tests ------------------------------------------------------------------------------------

# (shape, k the reference is given): 64 x 64 chunks at 64 (its hparams), a 48 x 50 chunk, 1-D runs.
CASES = [((128, 192), 64), ((96, 50), 38), ((640,), 2), ((64, 64), 64)]


def _data(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape, topk", CASES, ids=str)
def test_round_trip_matches_the_reference(shape, topk):
    comp = build_compressor("sparseloco")
    assert comp.layout(shape).k == topk
    x = _data(shape, 0)
    payload, ctx = comp.compress(x, "w")
    expected, (idx, _, _) = ref_round_trip(x, topk)
    got = comp.decompress(payload, ctx)
    torch.testing.assert_close(got.reshape(-1), expected.reshape(-1), rtol=1e-5, atol=1e-6)
    # The same coordinates are sent (the decode could hide a sent value equal to 0: compare them).
    sent = torch.zeros(x.numel(), dtype=torch.bool)
    sent[comp.sent_indices(payload, ctx)] = True
    mask = ref_decode(ref_decompress(idx, torch.ones(idx.shape), ref_encode(x).shape)).reshape(-1) > 0
    assert torch.equal(sent, mask)
    assert len(comp.codes(payload, ctx).unique()) <= 4


@pytest.mark.parametrize("shape, topk", CASES, ids=str)
def test_aggregate_over_three_workers_matches_the_reference(shape, topk):
    comp = build_compressor("sparseloco")
    # Different scales, so that the median clipping bites on one worker.
    xs = [_data(shape, 10 + r) * s for r, s in enumerate((1.0, 3.0, 0.5))]
    payloads = [comp.compress(x, "w") for x in xs]
    ctx = payloads[0][1]
    got = comp.decompress_all([p for p, _ in payloads], ctx)
    parts = [ref_round_trip(x, topk)[1] for x in xs]
    expected = ref_decode(ref_batch_decompress([p[0] for p in parts], [p[1] for p in parts], parts[0][2]))
    torch.testing.assert_close(got.reshape(-1), expected.reshape(-1), rtol=1e-5, atol=1e-6)
    # Into a caller's buffer (comm=allgather decodes into the gradient).
    out = torch.full((xs[0].numel(),), float("nan"))
    into = comp.decompress_all([p for p, _ in payloads], ctx, out=out)
    assert into.data_ptr() == out.data_ptr()
    torch.testing.assert_close(into.reshape(-1), got.reshape(-1))


def test_error_accumulator_matches_the_reference_with_memory_residual():
    """memory=residual(beta=0.95, gamma=lr) is the reference's e = 0.95 e + lr * delta; e -= sent."""
    lr, shape = 0.7, (128, 192)
    comp = build_compressor("sparseloco")
    mem = ResidualMemory(beta=0.95, gamma=lr)
    e = torch.zeros(shape)
    for step in range(4):
        delta = _data(shape, 100 + step)
        x = mem.compensate(delta, "w")
        payload, ctx = comp.compress(x, "w")
        sent = comp.decompress(payload, ctx)
        mem.update(x, "w", comp, payload, ctx)
        e.mul_(0.95).add_(delta, alpha=lr)
        transmit, _ = ref_round_trip(e, 64)
        e.sub_(transmit)
        torch.testing.assert_close(sent, transmit.view(shape), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mem.residuals["w"], e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 100, 2400, 4096])
def test_k_is_even_and_at_the_ratio(size):
    for ratio in (0.01, 1 / 64, 0.03, 0.5, 1.0):
        k = chunk_k(size, ratio)
        if size == 1:
            assert k == 1  # the reference's topk would ask for 2 of 1 element
            continue
        assert k % 2 == 0 and 2 <= k <= size
        assert abs(k - ratio * size) <= 2  # ceil, then dropped to even, at least 2


def test_density_and_chunks_of_the_reference():
    comp = build_compressor("sparseloco")
    lay = comp.layout((4096, 1024))
    assert (lay.h, lay.w, lay.k, lay.chunks) == (64, 64, 64, 64 * 16)
    assert lay.sent / (4096 * 1024) == 1 / 64
    sides = [chunk_side(n, 64) for n in (4096, 50, 96, 67)]
    assert sides == [64, 50, 48, 1] == [ref_split(n, 64) for n in (4096, 50, 96, 67)]
    conv = comp.layout((16, 8, 3, 3))  # read as 16 x 72: chunks of 16 x 36
    assert (conv.rows, conv.cols, conv.h, conv.w) == (16, 72, 16, 36)


WIRE_SHAPES = [(128, 192), (96, 50), (640,), (16, 8, 3, 3), (7,), (1,), (131073,)]


@pytest.mark.parametrize("shape", WIRE_SHAPES, ids=str)
def test_exact_wire_bytes(shape):
    comp = build_compressor("sparseloco")
    payload, ctx = comp.compress(_data(shape, 3), "w")
    lay = comp.layout(shape)
    index_bits = max(0, math.ceil(math.log2(lay.size)))
    by_hand = math.ceil(lay.sent * index_bits / 8) + math.ceil(lay.sent / 4) + 16
    assert payload_nbytes(payload) == comp.payload_bytes(shape) == by_hand
    assert payload_nbytes(payload) <= comp.max_wire_bytes(math.prod(shape))
    assert comp.wire_bytes(math.prod(shape)) is None  # the chunks follow the shape
    if shape == (128, 192):  # 6 chunks of 64 x 64, 64 each: 12-bit indices as the reference's
        assert payload_nbytes(payload) == 384 * 12 // 8 + 384 // 4 + 16


def test_max_wire_bytes_bounds_every_matrix_shape():
    comp = build_compressor("sparseloco")
    for n in (60, 97, 4096, 6000):
        bound = comp.max_wire_bytes(n)
        shapes = [(n,)] + [(r, n // r) for r in range(1, n + 1) if n % r == 0]
        assert max(comp.payload_bytes(s) for s in shapes) <= bound


def _payload_of(comp, n: int, entries: dict[int, float]):
    x = torch.zeros(n)
    for i, v in entries.items():
        x[i] = v
    return comp.compress(x, "w")


def test_sender_mean_with_clipping_on_three_hand_made_workers():
    # One chunk of 8 elements, k = 2: each worker sends its two nonzeros, both equal, so the 2-bit
    # codes are exact (one bin, whose mean is the value).
    comp = build_compressor("sparseloco", ratio=0.25)
    a, ctx = _payload_of(comp, 8, {0: 3.0, 1: 3.0})  # norm 3 sqrt(2): clipped to the median, 2 sqrt(2)
    b, _ = _payload_of(comp, 8, {1: 1.0, 2: 1.0})  # norm sqrt(2)
    c, _ = _payload_of(comp, 8, {5: -2.0, 6: -2.0})  # norm 2 sqrt(2): the median
    for p, want in ((a, [3, 3, 0, 0, 0, 0, 0, 0]), (b, [0, 1, 1, 0, 0, 0, 0, 0])):
        torch.testing.assert_close(comp.decompress(p, ctx), torch.tensor(want, dtype=torch.float32))
    got = comp.decompress_all([a, b, c], ctx)
    # a is scaled by 2/3 to 2; coordinate 1 is the mean of a's 2 and b's 1 (its two senders), not /3.
    torch.testing.assert_close(got, torch.tensor([2.0, 1.5, 1.0, 0, 0, -2.0, -2.0, 0]))
    torch.testing.assert_close(comp.aggregate([comp.decompress(p, ctx) for p in (a, b, c)]), got)
    # Four workers: the lower median (2 sqrt(2) of norms 1, 2, 3, 5 x sqrt(2)), not their mean.
    d, _ = _payload_of(comp, 8, {7: 5.0, 0: 5.0})
    got = comp.decompress_all([a, b, c, d], ctx)
    torch.testing.assert_close(got, torch.tensor([2.0, 1.5, 1.0, 0, 0, -2.0, -2.0, 2.0]))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="ratio=0 is outside"):
        build_compressor("sparseloco", ratio=0)
    with pytest.raises(ValueError, match="chunk=0 must be an integer >= 1"):
        build_compressor("sparseloco", chunk=0)
    with pytest.raises(ValueError, match="quantization_range=-1 must be a number > 0"):
        build_compressor("sparseloco", quantization_range=-1)
