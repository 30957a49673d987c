"""CompLL (compbench.compll): every spec's generated code against the others and a reference.

Parametrized over every spec in compll/specs/, so a new spec is tested without new test code:
the generated C++ operators (when the extension is built) and the generated CUDA kernels (compiled
for the host with the shim of test_kernel_logic_host.py) give the generated torch oracle's codes bit
for bit at 1 and 2 threads, and their decodes; the oracle agrees with a reference written from
the algorithm's definition (REFERENCES: the hand-written twins for HiPress's built-ins, a numpy
transcription of the paper for natural compression)."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from ctypes import c_float, c_longlong, c_uint, c_void_p
from functools import partial

import numpy as np
import pytest
import torch

from compbench.catalog import registry
from compbench.codec.packing import decode_2bit, ternary_values
from compbench.compll import gen_cpu, gen_cuda, gen_torch, lang, runtime
from compbench.compressors import build_compressor
from compbench.compressors.onebit import _onebit
from compbench.kernels import cpu, twins
from tests.helpers import compbench
from tests.unit.test_kernel_logic_host import BLOCK, GRID, SHIM

SPECS = sorted(runtime.specs())
SIZES = [1, 7, 8, 9, 1001, 131072 + 5, 3 * 131072 + 13]
needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def _x(n: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 0.01 + 0.002
    if n > 100:
        x[5], x[6], x[7] = 0.0, -0.0, 1e-40  # zeros of both signs and a subnormal
    return x


def _inputs(s: lang.Spec, x: torch.Tensor) -> torch.Tensor:
    # The kernels' inputs: TernGrad's scale (max |x|, here unclipped).
    return x.abs().max().reshape(1).expand(s.inputs).contiguous() if s.inputs else x.new_zeros(0)


def _params(s: lang.Spec) -> dict:
    return {k: s.settings[k].default for k in s.params}


def _state(s: lang.Spec, n: int) -> torch.Tensor | None:
    """A stateful spec's state before the encode (TBQ's residual), else None."""
    return _x(n, 11) if s.stateful else None


def _natural_reference(x: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Natural compression from its definition (Horvath et al., 2019), in numpy: |x| in
    [2^e, 2^(e+1)) goes up to 2^(e+1) iff U < |x| / 2^e - 1, sign kept; compbench's 8-bit code: sign
    bit 7, exponent counted down from the top (biased exponent of max |x|, plus 1); 0 below it."""
    amax = np.float32(np.abs(x).max())
    top = int(np.frexp(amax)[1]) + 127  # frexp: amax = m 2^E, m in [0.5, 1): biased exponent E + 126
    u = twins.counter_uniform(seed, x.size).numpy()
    codes = np.zeros(x.size, np.uint8)
    for i, v in enumerate(x):
        a = np.float32(abs(v))
        if a == 0 or a < np.finfo(np.float32).tiny:
            continue
        m, big_e = np.frexp(a)
        e = int(big_e) + 126
        frac = np.float32(np.float32(a / np.float32(2.0 ** (e - 127))) - np.float32(1.0))
        k = e + int(u[i] < frac) - top + 127
        if k >= 1:
            codes[i] = (128 if v < 0 else 0) | k
    return codes, np.array([amax], np.float32)


def _reference(name: str, x: torch.Tensor, seed: int, state: torch.Tensor | None):
    """(codes packed, header) of the reference implementation of spec `name` (`state` updated)."""
    if name == "onebit":
        return _onebit(x, torch.empty_like(x))
    if name == "terngrad":
        scale = x.abs().max().reshape(1)
        return twins.terngrad_codes(x, scale, seed), scale
    if name == "tbq":
        return twins.tbq_step(state, x, 0.01), torch.zeros(0)
    if name == "natural":
        codes, header = _natural_reference(x.numpy(), seed)
        return torch.from_numpy(codes), torch.from_numpy(header)
    raise AssertionError(f"spec {name}: add its reference implementation to _reference")


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("n", [1, 9, 1001])
def test_torch_oracle_matches_the_reference(name, n):
    s = runtime.spec(name)
    x = _x(n, 1)
    state, want_state = _state(s, n), _state(s, n)
    packed, header = gen_torch.module(s).encode(x, _inputs(s, x), 12345, _params(s), state)
    want_packed, want_header = _reference(name, x, 12345, want_state)
    assert torch.equal(packed, want_packed)
    if s.stateful:
        assert torch.equal(state, want_state)
    torch.testing.assert_close(header, want_header.reshape(-1), rtol=2e-6, atol=1e-9)


@needs_kernels
@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("threads", [1, 2])
def test_generated_cpu_kernels_match_the_torch_oracle(name, n, threads):
    s = runtime.spec(name)
    x = _x(n, n)
    params = [float(v) for v in _params(s).values()]
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    state, want_state = _state(s, n), _state(s, n)
    try:
        packed, header = runtime.cpu_encode(s, x, _inputs(s, x), 2**40 + 77, params, state)
        out = torch.full((n + 3,), 7.0)
        decoded = runtime.cpu_decode(s, packed, header, n, params, out)
    finally:
        torch.set_num_threads(old)
    oracle = gen_torch.module(s)
    want_packed, want_header = oracle.encode(x, _inputs(s, x), 77, _params(s), want_state)
    assert torch.equal(packed, want_packed)
    if s.stateful:
        assert torch.equal(state, want_state)
    # fp64 sums in another order: the header may differ in its last bit; max, min, counts are exact.
    torch.testing.assert_close(header, want_header, rtol=2e-6, atol=1e-9)
    assert torch.equal(decoded[:n], oracle.decode(packed, header, n, _params(s)))
    assert torch.equal(out[n:], torch.full((3,), 7.0))  # nothing past numel is written


@needs_kernels
def test_onebit_header_is_the_same_at_any_number_of_threads():
    s = runtime.spec("onebit")
    x = _x(5 * 131072 + 3, 9)
    got = []
    for threads in (1, 2):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got.append(runtime.cpu_encode(s, x, x.new_zeros(0), 0, [])[1])
        finally:
            torch.set_num_threads(old)
    assert torch.equal(got[0].view(torch.int32), got[1].view(torch.int32))


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    tmp = tmp_path_factory.mktemp("compll")
    (tmp / "shim.h").write_text(SHIM)
    unit = tmp / "generated.cpp"
    unit.write_text("".join(f'#include "{p}"\n' for p in runtime.cuda_sources()))
    lib = tmp / "generated.so"
    from compbench.kernels import loader

    cmd = ["g++", "-std=c++14", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-include",
           str(tmp / "shim.h"), f"-I{loader.source_dir()}", str(unit), "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return ctypes.CDLL(str(lib))


def _grid(lib, fn, *args) -> None:
    lib.cb_set_launch.argtypes = [c_uint] * 4
    for b in range(GRID):
        for t in range(BLOCK):
            lib.cb_set_launch(GRID, BLOCK, b, t)
            fn(*args)


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("n", [1, 9, 1001])
def test_generated_cuda_kernels_match_the_torch_oracle_on_the_host(host_lib, name, n):
    s = runtime.spec(name)
    oracle = gen_torch.module(s)
    x = _x(n, 3)
    inputs = _inputs(s, x)
    state, want_state = _state(s, n), _state(s, n)
    want_packed, header = oracle.encode(x, inputs, 99, _params(s), want_state)
    h = (header if s.header and not s.inputs else inputs).numpy().astype(np.float32).copy()
    xs = x.numpy().copy()
    st = state.numpy().copy() if s.stateful else None
    nbytes = want_packed.numel()
    out = np.zeros(nbytes, np.uint8)
    given = {"state": st, "x": xs, "n": n, "h": h, "seed": 99, "out": out, "nbytes": nbytes, **_params(s)}
    types, args = [], []
    for ctype, name in gen_cuda.encode_args(s):
        value = given[name]
        if isinstance(value, np.ndarray):
            types.append(c_void_p)
            args.append(value.ctypes.data_as(c_void_p))
        else:
            cls = {"long long": c_longlong, "unsigned int": c_uint, "float": c_float}[ctype]
            types.append(cls)
            args.append(cls(value))
    enc = getattr(host_lib, s.encode_name)
    enc.argtypes = types
    enc.restype = None
    _grid(host_lib, enc, *args)
    assert torch.equal(torch.from_numpy(out), want_packed)
    if s.stateful:
        assert torch.equal(torch.from_numpy(st), want_state)
    table = oracle.table(header, _params(s)).numpy().copy()
    decoded = np.zeros(n, np.float32)
    dec = getattr(host_lib, s.decode_name)
    dec.argtypes = [c_void_p, c_longlong, c_void_p, c_void_p]
    dec.restype = None
    _grid(host_lib, dec, out.ctypes.data_as(c_void_p), n, table.ctypes.data_as(c_void_p),
          decoded.ctypes.data_as(c_void_p))
    assert torch.equal(torch.from_numpy(decoded), oracle.decode(want_packed, header, n, _params(s)))


def test_terngrad_spec_decodes_as_the_handwritten_table():
    s = runtime.spec("terngrad")
    x = _x(1001, 4)
    scale = x.abs().max().reshape(1)
    packed = twins.terngrad_codes(x, scale, 5)
    got = gen_torch.module(s).decode(packed, scale, 1001, {})
    assert torch.equal(got, decode_2bit(packed, 1001, ternary_values(scale)))


def test_natural_rounds_to_a_neighbouring_power_of_two_without_bias():
    comp = build_compressor("natural")
    x = torch.tensor([0.3, -0.3, 1.0, 0.75, -5.0, 0.0, 2e-38])
    decoded = []
    for step in range(2000):
        comp.begin_step(step, 0.0)
        payload, ctx = comp.compress(x, "w")
        decoded.append(comp.decompress(payload, ctx))
    d = torch.stack(decoded)
    lo = 2.0 ** torch.floor(torch.log2(x.abs().clamp_min(1e-38)))
    for j in range(x.numel()):
        seen = set(d[:, j].abs().unique().tolist())
        assert seen <= {lo[j].item(), 2 * lo[j].item(), 0.0}, (x[j], seen)
    # 1.0 is a power of two: always itself; 2e-38 is more than 2^126 below the largest (8): sent as 0.
    assert torch.equal(d[:, 2], torch.ones(2000)) and torch.equal(d[:, 6], torch.zeros(2000))
    mean, std = d[:, :5].double().mean(0), d[:, :5].double().std(0)
    assert torch.all((mean - x[:5].double()).abs() <= 5 * std / math.sqrt(2000) + 1e-12)


def test_natural_is_registered_from_its_spec_alone():
    assert "natural" in registry.options("compressor")
    path = registry.option_path("compressor", "natural")
    assert path.parent.parent == runtime.conf_folder()
    assert registry.option_origin("compressor", "natural") == "compbench"
    comp = build_compressor("natural", seed=3)
    assert isinstance(comp, runtime.SpecCompressor) and comp.caps.unbiased and comp.wire_bytes(10) == 14
    with pytest.raises(ValueError, match="natural: seed=0.5 must be an integer; pass e.g. seed=0"):
        build_compressor("natural", seed=0.5)
    # Only registered specs get a conf entry: the kernels of hand-written compressors do not.
    assert not (runtime.conf_folder() / "compressor" / "onebit.yaml").exists()


def test_generated_sources_follow_the_cuda_rules():
    for name in SPECS:
        text = gen_cuda.source(runtime.spec(name))
        includes = [line.strip() for line in text.splitlines() if line.strip().startswith("#include")]
        assert includes == ['#include "common.cuh"']
        assert "__shared__" not in text and "__shfl" not in text
        assert "TORCH_LIBRARY_FRAGMENT(compbench_cpu" in gen_cpu.source(runtime.spec(name))


def test_the_extension_is_keyed_on_the_generated_sources():
    assert set(runtime.cpu_sources()) <= set(cpu.sources())
    assert all(p.read_text() == gen_cpu.source(runtime.spec(p.stem.removeprefix("compll_")))
               for p in runtime.cpu_sources())


@pytest.mark.parametrize("bad, message", [
    (lambda: lang.Spec(name="b", doc="d", bits=3, code=lang.to_int(lang.x), value=lang.Code() * 1.0),
     "bits=3; codes pack 1, 2, 4 or 8 bits per element"),
    (lambda: lang.Spec(name="b", doc="d", bits=8, code=lang.Code(), value=lang.Code() * 1.0),
     "Code cannot appear in the code expression"),
    (lambda: lang.Spec(name="b", doc="d", bits=8, code=lang.to_int(lang.x), value=lang.x),
     "X cannot appear in the value expression"),
    (lambda: lang.Spec(name="b", doc="d", bits=8, code=lang.to_int(lang.Header(0)),
                       value=lang.Code() * 1.0),
     r"Header\(0\) but the header has 0 entries"),
    (lambda: lang.Spec(name="b", doc="d", bits=8, code=lang.x * 2.0, value=lang.Code() * 1.0),
     "code must be an int expression"),
    (lambda: lang.where(lang.x, 1, 0).kind, "needs a comparison as cond"),
    (lambda: lang.Spec(name="b", doc="d", bits=8, code=lang.to_int(lang.x), value=lang.Code() * 1.0,
                       update=lang.State() + lang.x), "a compressor of its own keeps no state yet"),
    (lambda: lang.Spec(name="b", doc="d", bits=8, code=lang.to_int(lang.Input(0)), value=lang.Code() * 1.0,
                       inputs=1), "a compressor of its own has no caller to hand it inputs"),
    (lambda: bool(lang.x < 1.0), "has no truth value"),
    (lambda: lang.reduce("mean", lang.x), "use one of sum, max, min, count"),
])
def test_the_language_refuses_what_it_cannot_generate(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()


def test_gen_prints_each_target_and_refuses_bad_input():
    gen = partial(compbench, "gen", timeout=120)  # `compbench gen ARGS` in a subprocess

    ok = gen("natural", "--target", "cpu")
    assert ok.returncode == 0 and "natural_encode" in ok.stdout and "TORCH_LIBRARY_FRAGMENT" in ok.stdout
    assert "class Compressor(SpecCompressor)" in gen("natural").stdout
    assert "__global__ void terngrad_codes" in gen("terngrad", "--target", "cuda").stdout
    assert "state[i] = " in gen("tbq", "--target", "cuda").stdout
    every = ", ".join(sorted([*SPECS, *runtime.selects()]))  # code specs and selections alike
    for args, message in [(("nope",), f"error: no CompLL spec 'nope'; choose one of: {every}"),
                          (("natural", "--target", "java"),
                           "error: --target java: choose one of torch, cpu, cuda, conf")]:
        res = gen(*args)
        assert res.returncode == 2 and res.stderr.strip().splitlines() == [message], res.stderr


@needs_kernels
def test_a_registered_spec_runs_its_compiled_kernels_on_cpu(monkeypatch):
    calls = []
    encode, decode = runtime.cpu_encode, runtime.cpu_decode
    monkeypatch.setattr(runtime, "cpu_encode", lambda *a: calls.append("encode") or encode(*a))
    monkeypatch.setattr(runtime, "cpu_decode", lambda *a: calls.append("decode") or decode(*a))
    x = _x(7 * 14287, 8).reshape(7, -1)
    comp = build_compressor("natural")
    comp.begin_step(5, 0.0)
    payload, ctx = comp.compress(x, "w")
    out = comp.decompress(payload, ctx)
    assert calls == ["encode", "decode"]
    monkeypatch.setenv("COMPBENCH_KERNELS", "0")  # the generated torch code: the same payload and decode
    twin_payload, _ = comp.compress(x, "w")
    assert all(torch.equal(a, b) for a, b in zip(payload, twin_payload, strict=True))
    assert torch.equal(comp.decompress(twin_payload, ctx), out) and calls == ["encode", "decode"]


@pytest.mark.parametrize("name", SPECS)
def test_the_decode_table_is_made_where_the_header_is_without_host_copies(monkeypatch, name):
    # cuda_decode's table: the generated code run on the header's device (no header.cpu(), no
    # torch.tensor constants copied from the host), the same values as the oracle's host table.
    s = runtime.spec(name)
    x = _x(1001, 3)
    _, header = gen_torch.module(s).encode(x, _inputs(s, x), 5, _params(s), _state(s, 1001))
    want = gen_torch.module(s).table(header, _params(s))

    def no_host_tensor(*args, **kwargs):
        raise AssertionError("a constant copied from the host")

    monkeypatch.setattr(torch, "tensor", no_host_tensor)
    monkeypatch.setattr(torch.Tensor, "cpu", no_host_tensor)
    got = runtime.device_table(s, header, _params(s))
    assert got.dtype == want.dtype and torch.equal(got.view(torch.int32), want.view(torch.int32))
