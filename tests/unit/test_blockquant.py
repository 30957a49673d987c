"""The block quantizers of compressed sharded collectives (codec/blockquant.py) against references
written here from each source's formula: DeepSpeed's ZeRO++ symmetric quantizer (int8/int4),
torchao's float8 scaling (fp8_e4m3), unbiased stochastic rounding (QSDP) and LoCo's compensation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compbench.codec.blockquant import BlockFormat, ErrorCompensated, decode, encode

KINDS = ["int8", "int4", "fp8_e4m3"]
SCALE_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BITS = {"int8": 8, "int4": 4}


def _x(n: int, seed: int = 0) -> torch.Tensor:
    """Gradient-like values: normal, with a few outliers so blocks differ in scale."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    return x * torch.where(torch.rand(n, generator=g) < 0.01, 30.0, 1.0)


def _blocks_np(x: np.ndarray, block: int) -> list[np.ndarray]:
    size = block if block else max(len(x), 1)
    return [x[i:i + size] for i in range(0, len(x), size)]


# --- references, written from the sources' formulas ----------------------------------------------


def deepspeed_symmetric(x: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Params<Type::Symmetric, numBits> (csrc/includes/quantization_utils.h), in fp32: per group
    scale = (1 << bits) / (2 * max) (1 for max == 0), code = __float2int_rn(x * scale) clamped to
    [-2^(bits-1), 2^(bits-1)-1], stored param = 1 / scale."""
    codes, params = [], []
    for blk in _blocks_np(x.astype(np.float32), block):
        amax = np.float32(np.abs(blk).max())
        q = np.float32(1.0) if amax == 0 else np.float32(1 << bits) / (np.float32(2) * amax)
        v = np.rint(blk * q)  # rint: round half to even, as __float2int_rn
        codes.append(np.clip(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1).astype(np.int8))
        params.append(np.float32(1) / q)
    return np.concatenate(codes), np.array(params, dtype=np.float32)


def pack_low_nibble_first(codes: np.ndarray) -> np.ndarray:
    """The documented int4 layout, the slow obvious way: byte j = code[2j] & 15 | (code[2j+1] & 15) << 4."""
    nib = [int(c) & 0x0F for c in codes] + [0] * (len(codes) % 2)
    return np.array([nib[2 * j] | (nib[2 * j + 1] << 4) for j in range(len(nib) // 2)], dtype=np.uint8)


def torchao_float8(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao.float8: scale = (finfo(e4m3).max / clamp(amax.double(), min=EPS)).float(),
    bits = clamp(x.float() * scale, -max, max).to(e4m3); decode = bits / scale."""
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    codes, scales = [], []
    size = block if block else max(x.numel(), 1)
    for blk in x.float().split(size):
        amax = torch.max(torch.abs(blk))
        scale = (fp8_max / torch.clamp(amax.to(torch.float64), min=1e-12)).to(torch.float32)
        codes.append((blk.to(torch.float32) * scale).clamp(min=-fp8_max, max=fp8_max).to(torch.float8_e4m3fn))
        scales.append(scale)
    return torch.cat(codes), torch.stack(scales)


def _split(buf: torch.Tensor, n: int, fmt: BlockFormat) -> tuple[torch.Tensor, torch.Tensor]:
    cut = fmt.codes_nbytes(n)
    return buf[:cut], buf[cut:].clone().view(fmt.scale_dtype)


# --- exact agreement with the references ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("n,block", [(5000, 2048), (4096, 0), (1000, 64), (33, 8), (1, 2048)])
def test_int_matches_deepspeed_bit_for_bit(kind, n, block):
    x = _x(n)
    fmt = BlockFormat(kind, block=block)
    codes, params = deepspeed_symmetric(x.numpy(), BITS[kind], block)
    want_codes = pack_low_nibble_first(codes) if kind == "int4" else codes.view(np.uint8)
    got_codes, got_scales = _split(encode(x, fmt), n, fmt)
    np.testing.assert_array_equal(got_codes.numpy(), want_codes)
    np.testing.assert_array_equal(got_scales.numpy(), params)
    # DeepSpeed's dequantize: code * stored param, in fp32.
    blocks = _blocks_np(codes, block)
    want = np.concatenate([c.astype(np.float32) * p for c, p in zip(blocks, params, strict=True)])
    np.testing.assert_array_equal(decode(encode(x, fmt), n, fmt).numpy(), want)


@pytest.mark.parametrize("n,block", [(5000, 0), (5000, 2048), (300, 7)])
def test_fp8_matches_torchao_bit_for_bit(n, block):
    x = _x(n, seed=1)
    fmt = BlockFormat("fp8_e4m3", block=block)
    codes, scales = torchao_float8(x, block)
    buf = encode(x, fmt)
    got_codes, got_scales = _split(buf, n, fmt)
    assert torch.equal(got_codes, codes.view(torch.uint8))
    assert torch.equal(got_scales, scales)
    per_elem = scales.repeat_interleave(block if block else n)[:n]
    assert torch.equal(decode(buf, n, fmt), codes.to(torch.float32) / per_elem)


def test_fp8_per_tensor_uses_one_scale():
    x = torch.tensor([448.0, -1000.0, 0.5])
    fmt = BlockFormat("fp8_e4m3", block=0)
    assert fmt.num_blocks(3) == 1 and fmt.scales_nbytes(3) == 4
    buf = encode(x, fmt)
    assert buf[1].view(torch.float8_e4m3fn).float() == -448.0  # the amax lands on e4m3's largest value
    assert torch.isclose(decode(buf, 3, fmt)[1], torch.tensor(-1000.0))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_half_inputs_quantize_their_fp32_values(kind):
    x = _x(3000, seed=2)
    fmt = BlockFormat(kind, block=512)
    for dtype in (torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        assert torch.equal(encode(xd, fmt), encode(xd.float(), fmt))


# --- the reference's range, errors and sizes -----------------------------------------------------


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_deepspeed_range_clips_only_plus_amax(kind):
    """2^bits levels over [-amax, amax]: -amax is code -2^(bits-1), +amax rounds to 2^(bits-1) and
    clips to 2^(bits-1)-1, one step short."""
    half = 1 << (BITS[kind] - 1)
    fmt = BlockFormat(kind, block=0)
    for sign in (1.0, -1.0):
        x = torch.tensor([sign * 3.0, 0.5, -1.0])
        scale = _split(encode(x, fmt), 3, fmt)[1][0]
        assert scale == torch.tensor(3.0 / half)
        y = decode(encode(x, fmt), 3, fmt)
        assert y[0] == (3.0 * (half - 1) / half if sign > 0 else -3.0)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_int_round_trip_error_is_half_a_step(kind, scale_dtype):
    n, block = 5000, 256
    x = _x(n, seed=3)
    fmt = BlockFormat(kind, block=block, scale_dtype=scale_dtype)
    buf = encode(x, fmt)
    step = _split(buf, n, fmt)[1].float().repeat_interleave(block)[:n]
    err = (decode(buf, n, fmt) - x).abs()
    half = 1 << (BITS[kind] - 1)
    clipped = x / step > half - 0.5  # the reference's one clipped code per block: +amax
    assert (err[~clipped] <= step[~clipped] / 2 * (1 + 1e-5)).all()
    assert (err[clipped] <= step[clipped] * (1 + 1e-5)).all()
    assert clipped.sum() <= fmt.num_blocks(n)


@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_fp8_round_trip_error_is_half_an_ulp(scale_dtype):
    n, block = 5000, 512
    x = _x(n, seed=4)
    fmt = BlockFormat("fp8_e4m3", block=block, scale_dtype=scale_dtype)
    buf = encode(x, fmt)
    scale = _split(buf, n, fmt)[1].float().repeat_interleave(block)[:n]
    err = (decode(buf, n, fmt) - x).abs()
    # e4m3: 3 mantissa bits (half an ulp is 2^-4 relative), subnormal spacing 2^-9 below 2^-6.
    assert (err <= torch.maximum(x.abs() * 2.0**-4, 2.0**-10 / scale) * (1 + 1e-5)).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
@pytest.mark.parametrize("n,block", [(0, 2048), (1, 2048), (7, 2048), (2048, 2048), (2049, 2048),
                                     (5001, 64), (999, 0)])
def test_nbytes_is_the_encoded_length(kind, scale_dtype, n, block):
    fmt = BlockFormat(kind, block=block, scale_dtype=scale_dtype)
    buf = encode(_x(n), fmt)
    assert buf.dtype == torch.uint8 and buf.shape == (fmt.nbytes(n),)
    blocks = 0 if n == 0 else (1 if block == 0 else -(-n // block))
    codes = (n + 1) // 2 if kind == "int4" else n
    assert fmt.codes_nbytes(n) == codes
    assert fmt.scales_nbytes(n) == blocks * scale_dtype.itemsize
    assert decode(buf, n, fmt).shape == (n,)


def test_int4_packing_order():
    """Element 2i in the low nibble, 2i+1 in the high one, two's complement; odd tail: high nibble 0."""
    fmt = BlockFormat("int4", block=0)
    x = torch.tensor([1.0, -2.0, 7.0, -8.0, 3.0])  # amax 8: step 1, codes 1, -2, 7, -8, 3
    buf = encode(x, fmt)
    assert buf[:3].tolist() == [0xE1, 0x87, 0x03]
    assert decode(buf, 5, fmt).tolist() == x.tolist()


# --- edges ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scale_dtype", SCALE_DTYPES)
def test_zero_blocks_decode_to_zeros(kind, scale_dtype):
    fmt = BlockFormat(kind, block=16, scale_dtype=scale_dtype)
    x = torch.cat([torch.zeros(16), _x(16), torch.zeros(5)])
    y = decode(encode(x, fmt), x.numel(), fmt)
    assert torch.isfinite(y).all()
    assert (y[:16] == 0).all() and (y[32:] == 0).all()
    z = decode(encode(torch.zeros(40), fmt), 40, fmt)
    assert torch.equal(z, torch.zeros(40))


@pytest.mark.parametrize("kind", KINDS)
def test_short_last_block_has_its_own_scale(kind):
    block = 64
    x = _x(2 * block + 5, seed=5)
    x[-5:] = torch.tensor([0.1, -0.2, 0.3, -0.05, 0.0])  # much smaller than the other blocks
    fmt = BlockFormat(kind, block=block)
    buf = encode(x, fmt)
    scales = _split(buf, x.numel(), fmt)[1]
    assert scales.shape == (3,)
    tail = decode(buf, x.numel(), fmt)[-5:]
    # Its own amax (0.3), not the padding or the other blocks, sets the resolution.
    bound = {"int8": 0.3 / 128, "int4": 0.3 / 8, "fp8_e4m3": 0.2 / 16}[kind]
    assert (tail - x[-5:]).abs().max() <= bound * (1 + 1e-5)
    assert torch.equal(encode(x[-5:], BlockFormat(kind, block=block))[-scales.element_size():],
                       buf[-scales.element_size():])


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_narrow_scales_round_up_so_codes_do_not_clip(scale_dtype):
    fmt = BlockFormat("int8", block=0, scale_dtype=scale_dtype)
    x = torch.tensor([-1.2345678, 0.3, 1.0])  # 1.2345678/128 is not a bf16/fp16 value
    buf = encode(x, fmt)
    scale = _split(buf, 3, fmt)[1]
    assert scale.dtype == scale_dtype and scale.float() >= 1.2345678 / 128
    assert buf[0].view(torch.int8) >= -128
    assert ((decode(buf, 3, fmt) - x).abs() <= scale.float() / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.bfloat16])
def test_narrow_fp8_multipliers_round_down(scale_dtype):
    fmt = BlockFormat("fp8_e4m3", block=0, scale_dtype=scale_dtype)
    x = torch.tensor([-1.2345678, 0.3, 1.0])
    buf = encode(x, fmt)
    scale = _split(buf, 3, fmt)[1]
    assert scale.dtype == scale_dtype and scale.float() <= 448 / 1.2345678
    assert (x * scale.float()).abs().max() <= 448  # no saturation beyond torchao's
    assert torch.equal(buf[:3].view(torch.float8_e4m3fn), (x * scale.float()).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("kind", KINDS)
def test_fp16_scales_at_the_ends_of_their_range_stay_finite(kind):
    """fp16 cannot hold amax/128 for amax 1e-9 (rounds up to its smallest subnormal) nor 448/amax for
    amax 1e-9 (clamped to 65504), nor amax/128 for amax 1e7 (clamped: the codes saturate)."""
    fmt = BlockFormat(kind, block=4, scale_dtype=torch.float16)
    x = torch.tensor([1e-9, -5e-10, 0.0, 2e-10, 1e7, -3e6, 1.0, 0.0])
    y = decode(encode(x, fmt), 8, fmt)
    assert torch.isfinite(y).all()
    assert (y[:4].abs() <= 2e-9).all() and torch.sign(y[4]) == 1 and torch.sign(y[5]) == -1


def test_decode_into_out():
    fmt = BlockFormat("int8", block=32)
    x = _x(100)
    out = torch.empty(100, dtype=torch.bfloat16)
    got = decode(encode(x, fmt), 100, fmt, out=out)
    assert got is out
    assert torch.equal(out, decode(encode(x, fmt), 100, fmt).to(torch.bfloat16))
    with pytest.raises(ValueError):
        decode(encode(x, fmt), 100, fmt, out=torch.empty(99))
    with pytest.raises(ValueError):
        decode(encode(x, fmt)[:-1], 100, fmt)


def test_format_validation():
    with pytest.raises(ValueError) as err:
        BlockFormat("fp8_e4m3", stochastic=True)
    assert "\n" not in str(err.value)
    for bad in (dict(kind="int2"), dict(kind="int8", block=-1), dict(kind="int8", scale_dtype=torch.float64)):
        with pytest.raises(ValueError):
            BlockFormat(**bad)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_meta_device_runs_shapes_only(kind, scale_dtype):
    """On `meta` a host read raises and a tensor created without device= lands on the CPU, which
    torch.cat with meta tensors refuses: both paths are checked here."""
    n = 2 * 64 + 3
    fmt = BlockFormat(kind, block=64, scale_dtype=scale_dtype, stochastic=kind != "fp8_e4m3")
    x = torch.empty(n, device="meta")
    buf = encode(x, fmt)
    assert buf.device.type == "meta" and buf.shape == (fmt.nbytes(n),)
    y = decode(buf, n, fmt)
    assert y.device.type == "meta" and y.shape == (n,) and y.dtype == torch.float32
    ec = ErrorCompensated(fmt)
    wire = ec.encode(x)
    assert wire.device.type == "meta" and wire.shape == (fmt.nbytes(n),)


# --- stochastic rounding -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_stochastic_rounding_is_unbiased(kind):
    n, draws = 256, 2000
    qmax = (1 << (BITS[kind] - 1)) - 1
    # Fractional code positions (k + 0.3, 0.5, 0.7...) where round-to-nearest is biased by up to 0.5.
    x = torch.linspace(-qmax, qmax, n) + torch.linspace(0.1, 0.9, n).remainder(1.0)
    x = x.clamp(-qmax, qmax) / qmax  # amax 1: step 1/qmax
    fmt = BlockFormat(kind, block=0, stochastic=True)
    g = torch.Generator().manual_seed(0)
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(draws):
        buf = encode(x, fmt, generator=g)
        total += decode(buf, n, fmt).double()
    step = 1.0 / qmax
    # Each draw errs by at most one step: the mean's standard error is under step / (2 sqrt(draws)).
    bias = (total / draws - x.double()).abs()
    assert bias.max() <= 6 * step / (2 * draws**0.5)
    nearest = decode(encode(x, BlockFormat(kind, block=0)), n, BlockFormat(kind, block=0))
    assert (nearest - x).abs().max() > 0.2 * step  # the test can tell a biased rounding


def test_stochastic_rounding_formula_and_range():
    """code = floor(x * qmax/amax + u), u = torch.rand(numel) of the generator; no code clips."""
    n = 1000
    x = _x(n, seed=6)
    fmt = BlockFormat("int8", block=0, stochastic=True)
    buf = encode(x, fmt, generator=torch.Generator().manual_seed(7))
    u = torch.rand(n, generator=torch.Generator().manual_seed(7))
    q = 127 / x.abs().max()
    codes = torch.floor(x * q + u)
    assert torch.equal(buf[:n].view(torch.int8).float(), codes)
    assert codes.abs().max() <= 127
    assert _split(buf, n, fmt)[1][0] == 1 / q


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_stochastic_rounding_is_reproducible(kind):
    fmt = BlockFormat(kind, block=128, stochastic=True)
    x = _x(1000, seed=8)
    a = encode(x, fmt, generator=torch.Generator().manual_seed(11))
    b = encode(x, fmt, generator=torch.Generator().manual_seed(11))
    c = encode(x, fmt, generator=torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)


# --- LoCo's error compensation -------------------------------------------------------------------


def _drift(steps: int, compensated: bool, beta: float = 0.8) -> float:
    """|sum of decoded - sum of inputs| / |sum of inputs| after `steps` calls, int4 per 256."""
    fmt = BlockFormat("int4", block=256)
    ec = ErrorCompensated(fmt, beta=beta)
    g = torch.Generator().manual_seed(9)
    bias = _x(2048, seed=10)  # a persistent component: deterministic rounding errs the same way each step
    sent = torch.zeros(2048, dtype=torch.float64)
    true = torch.zeros(2048, dtype=torch.float64)
    for _ in range(steps):
        grad = bias + 0.1 * torch.randn(2048, generator=g)
        wire = ec.encode(grad) if compensated else encode(grad, fmt)
        sent += decode(wire, 2048, fmt).double()
        true += grad.double()
    return float((sent - true).norm() / true.norm())


def test_loco_sum_tracks_the_inputs():
    plain, loco = _drift(100, False), _drift(100, True)
    assert loco < plain / 5
    assert _drift(100, True, beta=0.0) < plain / 5  # beta = 0: plain error feedback


def test_loco_follows_deepspeeds_update():
    """e = beta * e + (1 - beta) * (h - deq(Q4(h))), h = g + deq8(e), e stored as int8 blocks."""
    fmt, efmt = BlockFormat("int4", block=64), BlockFormat("int8", block=32)
    ec = ErrorCompensated(fmt, error_fmt=efmt, beta=0.7)
    e = torch.zeros(200)
    for step in range(4):
        g = _x(200, seed=20 + step)
        h = g + e
        want = encode(h, fmt)
        assert torch.equal(ec.encode(g), want)
        e = decode(encode(0.7 * e + 0.3 * (h - decode(want, 200, fmt)), efmt), 200, efmt)
    assert ec.state_dict()["error"].numel() == efmt.nbytes(200)


def test_loco_state_dict_resumes_exactly_and_resets():
    fmt = BlockFormat("int4", block=64)
    a = ErrorCompensated(fmt, reset_every=5)
    for step in range(3):
        a.encode(_x(300, seed=30 + step))
    b = ErrorCompensated(fmt, reset_every=5)
    b.load_state_dict(a.state_dict())
    for step in range(3, 8):  # crosses the reset after 5 calls
        g = _x(300, seed=30 + step)
        assert torch.equal(a.encode(g), b.encode(g))
    fresh = ErrorCompensated(fmt)
    g = _x(300, seed=99)
    c = ErrorCompensated(fmt, reset_every=2)
    c.encode(_x(300, seed=98))
    c.encode(_x(300, seed=97))
    assert torch.equal(c.encode(g), fresh.encode(g))  # the third call starts from a zero error
    with pytest.raises(ValueError):
        c.encode(_x(301))
    with pytest.raises(ValueError):
        b.load_state_dict({"error": torch.zeros(3, dtype=torch.uint8), "numel": 300, "calls": 0})
