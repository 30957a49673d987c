"""The CPU hot paths as a torch C++ extension (`extensions/cpu/*.cpp`, ops `torch.ops.compbench_cpu.*`).

`make setup` builds it (`make kernels`: `compbench.kernels.cpu.main`, ~30 s) into
~/.cache/compbench/cpu_kernels/KEY/, KEY a hash of the sources (*.cpp, *.h), torch's version, the
flags and the CPU model (the code is built for this CPU: -march=native). Processes load the built
library; nothing compiles at run time, so a job's workers never race to build it. Where it is not
built, or with `COMPBENCH_KERNELS=0`, the compressors run their torch/numpy twins (same results), and
`status()` says so: `compbench bench` records it in its environment.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from compbench.kernels import record

NAME = "compbench_cpu"
# -ffp-contract=off: a product and a sum stay two roundings, as in the twins (fused only where a
# kernel says std::fma / _mm256_fmadd_ps, as ATen's own vectorized add does).
FLAGS = ("-O3", "-march=native", "-std=c++17", "-ffp-contract=off")


def source_dir() -> Path:
    """`extensions/cpu/` of the repository (editable install) or $COMPBENCH_CPU_SOURCE."""
    env = os.environ.get("COMPBENCH_CPU_SOURCE")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "extensions" / "cpu"


def sources() -> list[Path]:
    """The translation units: the hand-written kernels, the unit generated from their table
    (kernels.table: declarations and registrations) and the CompLL specs' generated units (which
    register their own operators), handed in through `compbench.base.kernel_sources`; common.h is hashed
    too."""
    from compbench.base import kernel_sources

    made = kernel_sources.sources()
    return [*sorted(source_dir().glob("*.cpp")), *made.table, *made.cpu]


def cpu_model() -> str | None:
    """The processor's model name (/proc/cpuinfo), else platform's guess, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def build_dir() -> Path:
    key = hashlib.sha256()
    files = [*sources(), *sorted(source_dir().glob("*.h"))]
    for part in (*(f.read_bytes() for f in files), torch.__version__.encode(), " ".join(FLAGS).encode(),
                 (cpu_model() or '').encode(), platform.machine().encode()):
        key.update(part)
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compbench" / "cpu_kernels"
    return root / key.hexdigest()[:16]


def library() -> Path:
    return build_dir() / f"{NAME}.so"


def build(verbose: bool = False) -> Path:
    """Compile the extension unless this exact build exists; returns the library's path."""
    lib = library()
    if lib.is_file():
        return lib
    import ninja  # the pip package: torch's builder runs `ninja` from PATH, which may not hold the venv's
    from torch.utils.cpp_extension import load

    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    lib.parent.mkdir(parents=True, exist_ok=True)
    # -I: the generated units (in CompLL's cache folder) include common.h.
    load(name=NAME, sources=[str(f) for f in sources()], extra_cflags=list(FLAGS),
         extra_include_paths=[str(source_dir())], build_directory=str(lib.parent), is_python_module=False,
         verbose=verbose)
    return lib


@cache
def _load() -> str | None:
    """Load the built library once per process; None when loaded, else why not."""
    if not sources():
        return f"no sources in {source_dir()}"
    lib = library()
    if not lib.is_file():
        return "not built (make kernels)"
    torch.ops.load_library(str(lib))
    return None


def enabled(t: Tensor) -> bool:
    """Whether `t` is a contiguous fp32 CPU tensor and the compiled kernels are loaded (and not
    disabled by COMPBENCH_KERNELS=0, which selects the twins for A/B timing and the parity tests)."""
    if not (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()):
        return False
    on = os.environ.get("COMPBENCH_KERNELS", "1") != "0" and _load() is None
    record.note("cpu" if on else "twin")  # scripts/gpu_check.py's rows say which ran
    return on


def status() -> str:
    """'compiled: PATH', or 'torch twins: WHY'."""
    if os.environ.get("COMPBENCH_KERNELS", "1") == "0":
        return "torch twins: COMPBENCH_KERNELS=0"
    why = _load()
    return f"compiled: {library()}" if why is None else f"torch twins: {why}"


# The kernels' `nonfinite` argument when nothing is checked (0 elements). Given a 1-element int32
# tensor instead, a pass sets it to 1 when an element it reads is NaN or +-Inf and never clears it
# (compbench.codec.finite; twin: `kernels.twins.nonfinite`).
NO_CHECK = torch.empty(0, dtype=torch.int32)


def dragonn_select(flat: Tensor, threshold: float, slots: int, seed: int,
                   nonfinite: Tensor | None = None) -> Tensor:
    """int64: the indices in the filled slots of a table where slot murmur3_32(i, seed) % slots
    holds the largest i with |x_i| >= threshold, in slot order; `nonfinite` set when an element is
    NaN or +-Inf (see NO_CHECK). Twin: `compressors.dragonn._select`'s CPU path."""
    flag = NO_CHECK if nonfinite is None else nonfinite
    return torch.ops.compbench_cpu.dragonn_select(flat, threshold, slots, seed, flag)


def sampled_threshold(flat: Tensor, m: int, j: int, seed: int) -> Tensor:
    """1-element fp32: the j-th largest of abs over m samples of the murmur3 stream (NaN largest).
    Twin: `compressors.dragonn.sampled_threshold`'s numpy path."""
    return torch.ops.compbench_cpu.sampled_threshold(flat, m, j, seed)


NO_SAMPLES = torch.empty(0)  # block_absmax / compensate_select without a strided sample


def block_absmax(flat: Tensor, samples: Tensor | None = None, sample_start: int = 0,
                 sample_stride: int = 1, nonfinite: Tensor | None = None) -> Tensor:
    """fp32: the largest abs of each whole block of 64 elements, NaN ignored; given fp32 `samples` of
    m elements, the same pass writes flat[sample_start + t * sample_stride] into them for t < m;
    `nonfinite` set when an element is NaN or +-Inf (see NO_CHECK). Twin: AbsIndex's amax/amin (and
    the strided slice)."""
    gathered = NO_SAMPLES if samples is None else samples
    flag = NO_CHECK if nonfinite is None else nonfinite
    return torch.ops.compbench_cpu.block_absmax(flat, gathered, sample_start, sample_stride, flag)


def blocks_abs_ge(flat: Tensor, block_max: Tensor, threshold: float) -> Tensor:
    """int64, ascending: the indices with abs(flat) >= threshold, reading only the blocks of 64 whose
    `block_max` (`block_absmax` of flat) reaches it (and the tail). Twin: AbsIndex's numpy query."""
    return torch.ops.compbench_cpu.blocks_abs_ge(flat, block_max, threshold)


def sparse_average(indices: Tensor, values: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(int64 coordinates [len(shape), u] of the distinct `indices` in ascending order, their fp32
    sums of `values` in the order given). Twin: `sparse.sparse_average`'s torch path."""
    return torch.ops.compbench_cpu.sparse_average(indices, values, list(shape))


def pack_signs(flat: Tensor) -> tuple[Tensor, Tensor]:
    """(packed bits of flat < 0, sum of abs as a 1-element fp32 tensor). Twin: `packing.pack_signs`."""
    return torch.ops.compbench_cpu.pack_signs(flat)


def absmax_var(flat: Tensor) -> Tensor:
    """fp64 [max abs, population variance] in one read (NaN if any element is). Twin: `terngrad._scale`."""
    return torch.ops.compbench_cpu.absmax_var(flat)


def terngrad_codes(flat: Tensor, scale: Tensor, seed: int) -> Tensor:
    """Packed 2-bit TernGrad codes with the counter-based stream of the CUDA kernel (seed mod 2^32),
    generated from compll/specs/terngrad.py. Twin: `kernels.twins.terngrad_codes`."""
    return torch.ops.compbench_cpu.terngrad_codes(flat, scale.reshape(1), seed & 0xFFFFFFFF, [])[0]


def tbq_step(r: Tensor, g: Tensor, tau: float) -> Tensor:
    """TBQ's step, residual `r` updated in place; packed 2-bit codes (generated from
    compll/specs/tbq.py). Twin: `kernels.twins.tbq_step`."""
    return torch.ops.compbench_cpu.tbq_step(g, g.new_zeros(0), 0, [float(tau)], r)[0]


def onebit_pack(flat: Tensor) -> tuple[Tensor, Tensor]:
    """(packed bits of flat < 0, fp32 [mean of negatives, mean of the others]), generated from
    compll/specs/onebit.py. Twin: `onebit._onebit`."""
    return torch.ops.compbench_cpu.onebit_pack(flat, flat.new_zeros(0), 0, [])


def signum_step(m: Tensor, g: Tensor, beta: float) -> Tensor:
    """m = beta*m + (1 - beta)*g in place; packed bits of m < 0. Twin: `signum._momentum_sign`."""
    return torch.ops.compbench_cpu.signum_step(m, g, beta)


def qsgd_quantize(flat: Tensor, levels: int, bucket_size: int, seed: int) -> tuple[Tensor, Tensor]:
    """(uint8 codes, fp32 bucket norms) in one read, the counter-based stream of `seed` (mod 2^32).
    Twin: `kernels.twins.bucket_norms` and `qsgd_codes`."""
    return torch.ops.compbench_cpu.qsgd_quantize(flat, levels, bucket_size, seed & 0xFFFFFFFF)


def decode_codes(packed: Tensor, numel: int, bits: int, values: Tensor, out: Tensor) -> Tensor:
    """out[:numel] = values[code] of packed 1- or 2-bit codes; returns out. Twin: `packing.decode_bits`
    and `decode_2bit`'s row gather."""
    return torch.ops.compbench_cpu.decode_codes(packed, numel, bits, values, out)


def qsgd_dequantize(codes: Tensor, norms: Tensor, levels: int, bucket_size: int, out: Tensor) -> Tensor:
    """out[:n] = (code - levels) * norm / levels per bucket, in one pass; returns out.
    Twin: `qsgd._dequantize`."""
    return torch.ops.compbench_cpu.qsgd_dequantize(codes, norms, levels, bucket_size, out)


# Kinds of compensate_select / compensate_at (extensions/cpu/memory.cpp).
RESIDUAL, DGC, DGC_NESTEROV = 0, 1, 2


def compensate_select(a: Tensor, b: Tensor, g: Tensor, kind: int, c0: float, c1: float, scale: float,
                      threshold: float = 0.0, slots: int = 0, seed: int = 0, samples: Tensor | None = None,
                      sample_start: int = 0, sample_stride: int = 1,
                      nonfinite: Tensor | None = None) -> Tensor:
    """The memory's state (`a` residual or momentum, `b` velocity; unused for RESIDUAL) updated in
    place with `g`, and in the same pass: slots == 0, `block_absmax` of the compensated tensor (and,
    given fp32 `samples` of m elements, result[sample_start + t * sample_stride] for t < m written
    into them); slots > 0, `dragonn_select` of it. `nonfinite` is set when an element of the raw
    gradient `g` is NaN or +-Inf (see NO_CHECK). Twin: memory/residual.py and memory/dgc.py's
    `compensate`, then those kernels (and the strided slice) on the result."""
    gathered = NO_SAMPLES if samples is None else samples
    flag = NO_CHECK if nonfinite is None else nonfinite
    return torch.ops.compbench_cpu.compensate_select(a, b, g, kind, c0, c1, scale, threshold, slots,
                                                     seed & 0xFFFFFFFF, gathered, sample_start, sample_stride,
                                                     flag)


def compensate_at(a: Tensor, b: Tensor, g: Tensor, indices: Tensor, kind: int, c0: float, c1: float,
                  scale: float) -> Tensor:
    """The compensated values at flat int64 `indices`, the state untouched (the same arithmetic as
    `compensate_select`). Twin: the compensated tensor's `index_select`."""
    return torch.ops.compbench_cpu.compensate_at(a, b, g, indices, kind, c0, c1, scale)


def sgd_step(p: Tensor, buf: Tensor, grad: Tensor, indices: Tensor, values: Tensor, lr: float,
             weight_decay: float, momentum: float, nesterov: bool, first: bool, dgc: bool,
             fma_tail: int = 0) -> None:
    """One SGD step in one pass over p (and buf), from a dense `grad` or (grad empty) a sparse update:
    sorted unique int64 `indices` and their `values`. `dgc`: DGC's SGD (momentum on the decay term
    only), else torch's (dampening 0); the last `fma_tail` elements update the momentum buffer with
    one fma (torch's fused kernel's scalar tail: `fused_sgd_tail`). Twin: the sparse decode into
    .grad, then `optim.optimizers.SGD`."""
    torch.ops.compbench_cpu.sgd_step(p, buf, grad, indices, values, lr, weight_decay, momentum, nesterov,
                                     first, dgc, fma_tail)


def adam_step(p: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, grad: Tensor, indices: Tensor, values: Tensor,
              lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: float,
              decoupled: bool, fma_tail: int = 0) -> None:
    """One Adam (AdamW: `decoupled`) step in one pass over p and its two moments, from a dense `grad`
    or (grad empty) a sparse update: sorted unique int64 `indices` and their `values`; `step` is the
    count after this step's increment. The last `fma_tail` elements round as torch's fused kernel's
    scalar tail does (`fused_sgd_tail`: the same vector width). Twin: the sparse decode into .grad,
    then torch's fused Adam/AdamW step (amsgrad off, not maximizing)."""
    torch.ops.compbench_cpu.adam_step(p, exp_avg, exp_avg_sq, grad, indices, values, lr, beta1, beta2, eps,
                                      weight_decay, step, decoupled, fma_tail)


def fused_sgd_tail(numel: int) -> int:
    """How many trailing elements torch's fused CPU SGD kernel steps in its scalar loop, where its
    compiler contracted buf*m + g into one fma: numel mod its vector width, 8 floats (its AVX2 build
    runs on AVX-512 machines too: measured with torch 2.13, tests/unit/test_fused_optimizer.py).
    Its tasks are whole cache lines of 16 floats, so only the tensor's end has a tail."""
    return numel % 8


def main() -> None:
    """`make setup`: build (or find) the extension and say where it is."""
    try:
        print(f"cpu kernels: {build(verbose=bool(os.environ.get('VERBOSE')))}")
    except Exception as e:  # no compiler, no ninja: the twins still work; say how to retry
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"note: the CPU kernels did not build ({why}); compressors use their torch twins. "
              f"Retry: make kernels", file=sys.stderr)
