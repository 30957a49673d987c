"""Every hand-written kernel, one row each: the one place a kernel is registered.

A row names the kernel, its torch twin (the oracle), its CPU operator's schema (torch's syntax; the
C++ function `compbench_cpu::NAME` that `extensions/cpu/SOURCE` defines) and, where a GPU does the
same, the CUDA source whose entry point NAME `compbench.kernels.ops.LAUNCHER` launches. From it:

- the C++ declarations and the `TORCH_LIBRARY(compbench_cpu)` registrations are generated
  (`registration_source`, built into the CPU extension by `make kernels`; a declaration that does
  not match the definition fails to load, so the build test catches it);
- tests/unit/test_kernel_table.py checks every CPU operator against the compbench function that
  dispatches to it, with the torch twin that `COMPBENCH_KERNELS=0` selects as the oracle, at 1 and
  2 threads; that the table lists every operator the library registers and every CUDA entry point in
  extensions/cuda/, each in its source with its launcher in kernels.ops.

Adding a kernel: its C++ definition (a file in extensions/cpu/), a row here, its CUDA source and
launcher where it has one, the dispatch in the compressor, and the row's entry in the table test.
Kernels generated from a CompLL spec (compbench.compll) are not listed: their generated units
register themselves (one spec file is their one place).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """One kernel. `cpu`: the operator's schema without its name, `(ARGS) -> RETURNS` in torch's
    syntax, defined as `compbench_cpu::NAME` in extensions/cpu/SOURCE (None: no CPU kernel, the torch
    twin runs on CPU). `cuda`: `FILE.cu` holding `extern "C" __global__ void NAME`, launched by
    `kernels.ops.LAUNCHER` (None: no CUDA kernel). `twin`: the torch code that does the same, the
    oracle of the parity tests."""

    name: str
    twin: str
    cpu: str | None = None
    source: str | None = None
    cuda: str | None = None
    launcher: str | None = None

    @property
    def schema(self) -> str:
        assert self.cpu is not None, f"{self.name} has no CPU operator"
        return f"{self.name}{self.cpu}"

    def declaration(self) -> str:
        """The C++ declaration the schema implies (Tensor -> const at::Tensor&, Tensor(a!) to
        Tensor(d!) -> at::Tensor&, float -> double, int -> int64_t, bool -> bool; a tuple of
        tensors -> std::tuple, () -> void)."""
        match = _ARGS.fullmatch(self.schema)
        assert match is not None, f"{self.name}: schema {self.schema!r} is not (args) -> returns"
        args, returns = match.groups()
        params = ", ".join(f"{_cpp_type(t)} {n}" for t, n in (a.rsplit(" ", 1) for a in _split(args)))
        return f"{_cpp_return(returns)} {self.name}({params});"


KERNELS: tuple[Kernel, ...] = (
    Kernel("dragonn_select", "compressors.dragonn._select (candidates by block maxima, numpy hashing); "
           "its nonfinite flag: kernels.twins.nonfinite",
           "(Tensor x, float threshold, int slots, int seed, Tensor(a!) nonfinite) -> Tensor", "select.cpp",
           "dragonn.cu", "dragonn_select"),
    Kernel("block_absmax", "compressors.sparse.AbsIndex (amax of each 64-element block; the strided slice); "
           "its nonfinite flag: kernels.twins.nonfinite",
           "(Tensor x, Tensor(a!) samples, int sample_start, int sample_stride, Tensor(b!) nonfinite) "
           "-> Tensor", "select.cpp"),
    Kernel("blocks_abs_ge", "compressors.sparse.AbsIndex.indices_ge (numpy: the blocks taken, compared)",
           "(Tensor x, Tensor block_max, float threshold) -> Tensor", "select.cpp"),
    Kernel("sampled_threshold", "compressors.dragonn.sampled_threshold (numpy sample of the stream)",
           "(Tensor x, int m, int j, int seed) -> Tensor", "select.cpp"),
    Kernel("compact_abs_ge", "torch.nonzero(x.abs() >= t)", cuda="compact.cu", launcher="compact_abs_ge"),
    Kernel("scatter_add", "index_add_ (compressors.sparse.scatter_add)", cuda="scatter.cu",
           launcher="scatter_add"),
    Kernel("pack_signs", "codec.packing._pack_signs_numpy", "(Tensor x) -> (Tensor, Tensor)",
           "signs.cpp", "pack.cu", "pack_signs"),
    Kernel("pack_bits", "codec.packing.pack_bits (torch path)", cuda="pack.cu", launcher="pack_bits"),
    Kernel("pack_2bit", "codec.packing.pack_2bit (torch path)", cuda="pack.cu", launcher="pack_2bit"),
    Kernel("decode_bits", "codec.packing.decode_bits (torch path)", cuda="pack.cu",
           launcher="decode_bits"),
    Kernel("decode_2bit", "codec.packing.decode_2bit (torch path)", cuda="pack.cu",
           launcher="decode_2bit"),
    Kernel("signum_step", "compressors.signum._momentum_sign (torch path)",
           "(Tensor(a!) m, Tensor g, float beta) -> Tensor", "signs.cpp"),
    Kernel("absmax_var", "compressors.terngrad._scale (torch path)", "(Tensor x) -> Tensor", "quantize.cpp"),
    Kernel("qsgd_quantize", "kernels.twins.bucket_norms and qsgd_codes",
           "(Tensor x, int levels, int bucket_size, int seed) -> (Tensor, Tensor)", "quantize.cpp"),
    Kernel("qsgd_codes", "kernels.twins.qsgd_codes", cuda="quantize.cu", launcher="qsgd_codes"),
    Kernel("compensate_select", "memory.dgc / memory.residual update, then the selection's torch path "
           "(comm.base.encode without fusion); its nonfinite flag: kernels.twins.nonfinite of g",
           "(Tensor(a!) a, Tensor(b!) b, Tensor g, int kind, float c0, float c1, float scale, "
           "float threshold, int slots, int seed, Tensor(c!) samples, int sample_start, int sample_stride, "
           "Tensor(d!) nonfinite) -> Tensor", "memory.cpp", "memory.cu", "compensate_select"),
    Kernel("compensate_at", "the memory's update read at the sampled indices (torch path)",
           "(Tensor a, Tensor b, Tensor g, Tensor indices, int kind, float c0, float c1, "
           "float scale) -> Tensor",
           "memory.cpp", "memory.cu", "compensate_at"),
    Kernel("sgd_step", "optim.optimizers.SGD's torch step from a dense gradient (torch's fused path)",
           "(Tensor(a!) p, Tensor(b!) buf, Tensor grad, Tensor indices, Tensor values, float lr, "
           "float weight_decay, float momentum, bool nesterov, bool first, bool dgc, int fma_tail) -> ()",
           "optim.cpp", "optim.cu", "sgd_step"),
    Kernel("sgd_sparse", "optim.optimizers.SGD's step on the k carried entries (no decay, no momentum)",
           cuda="optim.cu", launcher="sgd_step"),
    Kernel("adam_step", "optim.optimizers.Adam/AdamW's torch step from a dense gradient (torch's fused path, "
           "amsgrad off)",
           "(Tensor(a!) p, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, Tensor grad, Tensor indices, "
           "Tensor values, float lr, float beta1, float beta2, float eps, float weight_decay, float step, "
           "bool decoupled, int fma_tail) -> ()", "adam.cpp", "optim.cu", "adam_step"),
    Kernel("sparse_average",
           "compressors.sparse.sparse_average's torch path (unique, index_add_, unravel_index)",
           "(Tensor indices, Tensor values, int[] shape) -> (Tensor, Tensor)", "decode.cpp"),
    Kernel("decode_codes", "codec.packing.decode_bits / decode_2bit (torch paths)",
           "(Tensor packed, int numel, int bits, Tensor values, Tensor(a!) out) -> Tensor(a!)", "decode.cpp"),
    Kernel("qsgd_dequantize", "compressors.qsgd._dequantize (torch path)",
           "(Tensor codes, Tensor norms, int levels, int bucket_size, Tensor(a!) out) -> Tensor(a!)",
           "decode.cpp"),
)


def cpu_kernels() -> tuple[Kernel, ...]:
    return tuple(k for k in KERNELS if k.cpu is not None)


_ARGS = re.compile(r"\w+\((.*)\) -> (.+)")


def _split(args: str) -> list[str]:
    return [a.strip() for a in args.split(",") if a.strip()]


def _cpp_type(t: str) -> str:
    types = {"Tensor": "const at::Tensor&", "Tensor(a!)": "at::Tensor&", "Tensor(b!)": "at::Tensor&",
             "Tensor(c!)": "at::Tensor&", "Tensor(d!)": "at::Tensor&",
             "float": "double", "int": "int64_t", "bool": "bool",
             "int[]": "at::IntArrayRef"}
    if t not in types:
        raise ValueError(f"kernel table: schema type {t!r} has no C++ type here; add it to _cpp_type")
    return types[t]


def _cpp_return(returns: str) -> str:
    if returns == "()":
        return "void"
    if returns.startswith("("):
        parts = _split(returns.strip("()"))
        return f"std::tuple<{', '.join(_cpp_return(p) for p in parts)}>"
    if returns not in ("Tensor", "Tensor(a!)"):
        raise ValueError(f"kernel table: return type {returns!r} has no C++ type here; add it to _cpp_return")
    return "at::Tensor"


def registration_source() -> str:
    """The C++ unit that declares and registers every row (`make kernels` builds it with the rest)."""
    lines = ["// Generated from src/compbench/kernels/table.py: do not edit.",
             '#include <torch/library.h>', "", "#include <tuple>", "", "namespace compbench_cpu {", ""]
    lines += [k.declaration() for k in cpu_kernels()]
    lines += ["",
              "// The operators generated from CompLL specs register themselves (TORCH_LIBRARY_FRAGMENT).",
              "TORCH_LIBRARY(compbench_cpu, m) {"]
    lines += [f'  m.def("{k.schema}", &{k.name});' for k in cpu_kernels()]
    lines += ["}", "", "}  // namespace compbench_cpu", ""]
    return "\n".join(lines)
