"""compbench.kernels.table, the one place a hand-written kernel is registered: the library registers
what it lists, every CUDA entry point is in it with its launcher, and every CPU operator gives its
twin's results (COMPBENCH_KERNELS=0) through the compbench function that dispatches to it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor

from compbench.codec import packing
from compbench.codec.base import make_ctx
from compbench.comm.base import encode
from compbench.compll.generated import cpu_sources
from compbench.compressors.dgc import DGC
from compbench.compressors.dragonn import DRAGONN, _select, sampled_threshold
from compbench.compressors.qsgd import _dequantize
from compbench.compressors.signum import _momentum_sign
from compbench.compressors.sparse import AbsIndex, Workspace, sparse_average
from compbench.compressors.terngrad import _scale
from compbench.kernels import cpu, ops, twins
from compbench.kernels.loader import source_dir
from compbench.kernels.table import KERNELS, cpu_kernels
from compbench.memory.dgc import DGCMemory
from compbench.memory.residual import ResidualMemory
from compbench.optim.optimizers import SGD, AdamW
from compbench.records.stats import StepStats

needs_kernels = pytest.mark.skipif(not cpu.status().startswith("compiled"), reason=cpu.status())


def _gradient(n: int, seed: int) -> Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2


def _qsgd(x: Tensor) -> tuple[Tensor, ...]:
    if cpu.enabled(x):
        return cpu.qsgd_quantize(x, 127, 512, 11)
    norms = twins.bucket_norms(x, 512)
    return twins.qsgd_codes(x, twins.qsgd_scale(norms, 127), 127, 512, 11), norms


def _signum(x: Tensor) -> tuple[Tensor, ...]:
    m = _gradient(x.numel(), 7)
    bits = _momentum_sign(m, x, 0.9)
    return bits, m  # the momentum is updated in place


def _decode(x: Tensor) -> tuple[Tensor, ...]:
    n = x.numel()
    gen = torch.Generator().manual_seed(n)
    packed = torch.randint(0, 256, ((n + 3) // 4,), dtype=torch.uint8, generator=gen)
    return (packing.decode_2bit(packed, n, torch.tensor([0.0, 2.0, float("nan"), -2.0])),)


def _dequant(x: Tensor) -> tuple[Tensor, ...]:
    n = x.numel()
    gen = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen)
    return (_dequantize(codes, torch.rand((n + 99) // 100, generator=gen) * 10, 127, 100, None),)


def _encode(compressor, memory) -> Callable[[Tensor], tuple[Tensor, ...]]:
    def run(x: Tensor) -> tuple[Tensor, ...]:  # two steps: the memory's state carries over
        first, _ = encode(compressor(), mem := memory(), x, "w", StepStats())
        second, _ = encode(compressor(), mem, x * 0.5, "w", StepStats())
        return (*first, *second)

    return run


def _sparse_average(x: Tensor) -> tuple[Tensor, ...]:
    """Two ranks' payloads of about n/3 indices each, overlapping (sums in payload order), on a flat
    and, where n allows, a 3-D view of x; then the same bunched in the first 64th of x (the
    kernel's crowded buckets), repeats within a payload included."""
    n = x.numel()
    gen = torch.Generator().manual_seed(n)
    spread = [torch.randperm(n, generator=gen)[: n // 3 + 1] for _ in range(2)]
    bunched = [torch.randint(max(1, n // 64), (n // 3 + 1,), generator=gen) for _ in range(2)]
    out = []
    for picks in (spread, bunched):
        payloads = [[x[idx], idx.int()] for idx in picks]
        for shape in [(n,)] + [(n // d, *rest) for d, rest in ((8, (2, 4)), (9, (3, 3))) if n % d == 0]:
            avg = sparse_average(payloads, make_ctx(x.view(shape), "w"))
            out += [avg.indices(), avg.values()]
    return tuple(out)


def _dgc_sgd(x: Tensor) -> tuple[Tensor, ...]:
    p = torch.nn.Parameter(x.clone())
    opt = SGD([{"params": [p], "dgc": {"weight_decay": 1e-4, "momentum": 0.9, "nesterov": False}}],
              lr=0.1, momentum=0.0, weight_decay=0.0)
    for step in range(2):  # the decay term's momentum carries over
        p.grad = x * (step + 1)
        opt.step()
    return (p.detach(),)


def _adamw(x: Tensor) -> tuple[Tensor, ...]:
    """AdamW's step from a sparse .grad (every third entry): the kernel, or the dense decode and torch's
    fused step."""
    p = torch.nn.Parameter(x.clone())
    opt = AdamW([p], lr=1e-2, weight_decay=0.05, fused=True)
    idx = torch.arange(0, x.numel(), 3)
    for step in range(2):  # the moments carry over
        p.grad = torch.sparse_coo_tensor(idx.view(1, -1), x[idx] * (step + 1), x.shape).coalesce()
        opt.step()
    return p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]


# Each CPU operator through the compbench function that dispatches to it (kernel, or twin when
# COMPBENCH_KERNELS=0), and the relative tolerance of the comparison (0: bit for bit; sums whose
# order differs between a kernel's chunks and the twin's: within float rounding).
DISPATCH: dict[str, tuple[Callable[[Tensor], tuple[Tensor, ...]], float]] = {
    "dragonn_select": (lambda x: (_select(x, torch.tensor([1.0]), x.numel() // 8 + 1, 1, Workspace()),), 0),
    # and DGC's selection without a memory: block maxima and its strided sample in one pass
    "block_absmax": (lambda x: (AbsIndex(x, Workspace(), density=1e-3).indices_ge(2.5),
                                *DGC(ratio=1e-3).compress(x, "w")[0]), 0),
    # sparse enough that the twin re-reads blocks too (not its dense fallback)
    "blocks_abs_ge": (lambda x: (AbsIndex(x, Workspace(), density=1e-4).indices_ge(3.5),), 0),
    "sampled_threshold": (lambda x: (sampled_threshold(x, max(1, x.numel() // 10), 3, 77),), 0),
    "pack_signs": (lambda x: packing.pack_signs(x), 1e-6),
    "signum_step": (_signum, 0),
    "absmax_var": (lambda x: (_scale(x, 2.5),), 1e-6),
    "qsgd_quantize": (_qsgd, 1e-6),
    "decode_codes": (_decode, 0),
    "sparse_average": (_sparse_average, 0),
    "compensate_select": (_encode(lambda: DGC(ratio=1e-3), lambda: DGCMemory(momentum=0.9)), 0),
    "compensate_at": (_encode(lambda: DRAGONN(ratio=1e-3), ResidualMemory), 0),
    "sgd_step": (_dgc_sgd, 0),
    "adam_step": (_adamw, 0),
    "qsgd_dequantize": (_dequant, 0),
}


def _same(got: Tensor, want: Tensor, rtol: float) -> bool:
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if rtol == 0 or not got.is_floating_point():
        return torch.equal(got, want) or torch.allclose(got, want, rtol=0, atol=0, equal_nan=True)
    return torch.allclose(got, want, rtol=rtol, atol=0, equal_nan=True)


def test_every_cpu_operator_has_its_dispatch_here():
    assert set(DISPATCH) == {k.name for k in cpu_kernels()}


@needs_kernels
def test_the_library_registers_the_table_and_the_compll_units():
    cpu.enabled(torch.zeros(1))  # loads the library
    registered = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith("compbench_cpu::")}
    generated = {m for f in cpu_sources() if f.name.startswith("compll_")
                 for m in re.findall(r'm\.def\("(\w+)\(', f.read_text())}
    assert registered == {k.name for k in cpu_kernels()} | generated


def test_every_cuda_entry_point_is_in_the_table_with_its_launcher():
    hand_written = {(f.name, m) for f in source_dir().glob("*.cu")
                    for m in re.findall(r'extern "C" __global__ void (\w+)', f.read_text())}
    assert hand_written == {(k.cuda, k.name) for k in KERNELS if k.cuda is not None}
    for k in KERNELS:
        if k.cuda is not None:
            assert callable(getattr(ops, k.launcher or "")), k.name
        if k.cpu is not None:
            cpp = Path(cpu.source_dir(), k.source or "").read_text()
            assert re.search(rf"\b{k.name}\(", cpp), f"{k.name} is not defined in {k.source}"


@needs_kernels
@pytest.mark.parametrize("name", sorted(DISPATCH))
@pytest.mark.parametrize("n", [1, 9, 1000, 65537])
@pytest.mark.parametrize("threads", [1, 2])
def test_each_operator_gives_its_twins_results(monkeypatch, name, n, threads):
    run, rtol = DISPATCH[name]
    x = _gradient(n, n)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = run(x.clone())
        monkeypatch.setenv("COMPBENCH_KERNELS", "0")
        want = run(x.clone())
    finally:
        torch.set_num_threads(old)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert _same(g, w, rtol), (name, n, threads, i)
