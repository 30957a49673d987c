"""What connects specs to compbench: finding them, writing their generated sources, running them.

- `specs()`: every `specs/NAME.py` with its `SPEC` (sorted by name).
- `generated_dir()`: a folder under ~/.cache/compbench/compll/KEY/ (KEY: a hash of everything
  generated) holding cpu/compll_NAME.cpp (built into the CPU extension by `make kernels`: the
  extension's cache key hashes these sources too), cuda/compll_NAME.cu (loaded by
  `kernels.loader` like extensions/cuda/*.cu) and conf/compressor/NAME.yaml for every spec with
  `register=True` (a conf folder the registry reads after compbench's own: the Hydra option and
  the registry entry of a spec-only compressor). Written once, atomically; cheap to recompute.
- `SpecCompressor`: the compressor of a registered spec (the generated torch module subclasses it
  with the spec's settings as keyword arguments, so the registry's signature checks apply).
- `cpu_encode` / `cpu_decode` / `cuda_encode` / `cuda_decode`: the generated kernels' launchers.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from compbench.compll import gen_cpu, gen_cuda, gen_torch, lang
from compbench.compressors.base import Ctx, make_ctx
from compbench.compressors.packing import (
    PackedCodeCompressor,
    noise_seed,
    pack_uint,
    packed_nbytes,
    unpack_uint,
)
from compbench.kernels.twins import counter_uniform

__all__ = ["counter_uniform", "pack_codes", "unpack_codes", "specs", "spec", "generated_dir"]


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """int codes < 2^bits -> uint8 bytes, code i at bits bits*(i mod 8/bits) of byte i*bits/8."""
    return pack_uint(codes.to(torch.uint8), bits)


def unpack_codes(packed: Tensor, bits: int, numel: int) -> Tensor:
    return unpack_uint(packed, bits, numel)


@cache
def specs() -> dict[str, lang.Spec]:
    """name -> Spec of every module in compbench/compll/specs/."""
    from compbench.compll import specs as package

    found: dict[str, lang.Spec] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{package.__name__}.{info.name}")
        s = getattr(mod, "SPEC", None)
        if not isinstance(s, lang.Spec) or s.name != info.name:
            raise ValueError(f"compll spec {mod.__file__}: define SPEC = Spec(name={info.name!r}, ...)")
        found[s.name] = s
    return found


def spec(name: str) -> lang.Spec:
    """The spec called `name`; ValueError listing them otherwise."""
    found = specs()
    if name not in found:
        raise ValueError(f"no CompLL spec {name!r}; choose one of: {', '.join(found)}")
    return found[name]


def conf_text(s: lang.Spec) -> str:
    """The generated conf/compressor/NAME.yaml of a registered spec."""
    lines = [f"# {s.doc.splitlines()[0]} (CompLL: compll/specs/{s.name}.py)",
             "# Generated from the spec by compbench.compll.runtime: do not edit.",
             f"_target_: compbench.compll.registered.{s.name}"]
    for key, setting in s.settings.items():
        value = str(setting.default).lower() if isinstance(setting.default, bool) else setting.default
        lines.append(f"{key}: {value}")
    lines += ["# Pipeline selection policy (experiment configs use the seeds' 204800 / 200; "
              "0 compresses everything).",
              "compress_threshold: 0", "dense_steps: 0", ""]
    return "\n".join(lines)


def _files() -> dict[str, str]:
    files = {}
    for s in specs().values():
        files[f"cpu/compll_{s.name}.cpp"] = gen_cpu.source(s)
        files[f"cuda/compll_{s.name}.cu"] = gen_cuda.source(s)
        if s.register:
            files[f"conf/compressor/{s.name}.yaml"] = conf_text(s)
    return files


@cache
def generated_dir() -> Path:
    """The folder of every generated file (written on first use; see the module docstring)."""
    files = _files()
    key = hashlib.sha256()
    for rel, text in sorted(files.items()):
        key.update(rel.encode() + b"\0" + text.encode() + b"\0")
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "compbench" / "compll"
    final = root / key.hexdigest()[:16]
    if not final.is_dir():
        tmp = root / f".tmp-{os.getpid()}-{key.hexdigest()[:8]}"
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        (tmp / "conf" / "compressor").mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(final)
        except OSError:  # another process wrote the same folder first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return final


def cpu_sources() -> list[Path]:
    return sorted((generated_dir() / "cpu").glob("*.cpp"))


def cuda_sources() -> list[Path]:
    return sorted((generated_dir() / "cuda").glob("*.cu"))


def conf_folder() -> Path:
    return generated_dir() / "conf"


# --- launchers --------------------------------------------------------------------------------------


def _op(name: str):
    return getattr(torch.ops.compbench_cpu, name)


def cpu_encode(s: lang.Spec, flat: Tensor, inputs: Tensor, seed: int,
               params: list[float]) -> tuple[Tensor, Tensor]:
    """The generated C++ encode: (packed codes, fp32 header). `flat`: contiguous fp32 CPU."""
    return _op(s.encode_name)(flat, inputs, seed & 0xFFFFFFFF, params)


def cpu_decode(s: lang.Spec, packed: Tensor, header: Tensor, numel: int, params: list[float],
               out: Tensor) -> Tensor:
    return _op(s.decode_name)(packed, header, numel, params, out)


def cuda_encode(s: lang.Spec, flat: Tensor, inputs: Tensor, seed: int,
                params: list[float]) -> tuple[Tensor, Tensor]:
    """The generated RawKernel: the header by the generated torch code on the GPU (reductions are
    torch's), then one thread per packed byte."""
    import numpy as np

    from compbench.kernels.loader import as_cupy, launch

    n = flat.numel()
    if s.header:
        header = gen_torch.module(s).make_header(flat, inputs, dict(zip(s.params, params, strict=True)))
        h = header
    else:
        header = flat.new_zeros(0)
        h = inputs.reshape(-1).float().contiguous() if inputs.numel() else flat.new_zeros(1)
    nbytes = packed_nbytes(n, s.bits)
    out = torch.empty(nbytes, dtype=torch.uint8, device=flat.device)
    args = [as_cupy(flat), np.int64(n), as_cupy(h.contiguous()), np.uint32(seed & 0xFFFFFFFF), as_cupy(out),
            np.int64(nbytes)]
    if s.params:
        args.append(as_cupy(torch.tensor(params, dtype=torch.float32, device=flat.device)))
    launch(f"compll_{s.name}", s.encode_name, nbytes, flat.device, tuple(args))
    return out, header


def cuda_decode(s: lang.Spec, packed: Tensor, header: Tensor, numel: int, params: list[float],
                out: Tensor) -> Tensor:
    import numpy as np

    from compbench.kernels.loader import as_cupy, launch

    table = gen_torch.module(s).table(header.cpu(), dict(zip(s.params, params, strict=True)))
    table = table.to(packed.device).contiguous()
    launch(f"compll_{s.name}", s.decode_name, numel, packed.device,
           (as_cupy(packed.contiguous()), np.int64(numel), as_cupy(table), as_cupy(out)))
    return out


# --- the compressor of a registered spec ---------------------------------------------------------


class SpecCompressor(PackedCodeCompressor):
    """A compressor generated from a CompLL spec: `spec_name`'s codes packed `bits` per element and
    its fp32 header on the wire ([codes, header], or [codes] without a header). Encode and decode
    run the generated C++ kernels on CPU (when built), the generated RawKernels on CUDA (with CuPy),
    else the generated torch code, which the parity tests compare them to."""

    spec_name = ""

    def __init__(self, **settings: float | int | bool) -> None:
        s = self.spec = spec(self.spec_name)
        self.name = s.name
        self.caps = s.caps
        for key, value in settings.items():
            rule = s.settings[key]
            ok = isinstance(value, rule.kind) and not (isinstance(value, bool) and rule.kind is not bool)
            if rule.kind is float and isinstance(value, int) and not isinstance(value, bool):
                ok, value = True, float(value)
            if ok and rule.check:
                ok = bool(eval(rule.check, {}, {"v": value}))  # noqa: S307 (the spec's own condition)
            if not ok:
                want = rule.hint or rule.kind.__name__
                raise ValueError(f"compressor={s.name}: {key}={value!r} must be {want}; "
                                 f"pass e.g. {key}={rule.default}")
            setattr(self, key, value)
        self.settings = settings
        self._params = [float(settings[k]) for k in s.params]  # the kernels' `params`, in spec order

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        from compbench.kernels import cpu_kernels_enabled, cuda_kernels_enabled

        s = self.spec
        flat = x.reshape(-1).float().contiguous()
        seed = noise_seed(int(self.settings.get("seed", 0)), self.step, name) & 0xFFFFFFFF if s.seeded else 0
        inputs = flat.new_zeros(0)
        if cpu_kernels_enabled(flat):
            packed, header = cpu_encode(s, flat, inputs, seed, self._params)
        elif cuda_kernels_enabled(flat):
            packed, header = cuda_encode(s, flat, inputs, seed, self._params)
        else:
            packed, header = gen_torch.module(s).encode(flat, inputs, seed, dict(self.settings))
        return ([packed, header] if s.header else [packed]), make_ctx(x, name)

    def _decode(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        from compbench.kernels import cpu_kernels_enabled, cuda_kernels_enabled

        s = self.spec
        packed = payload[0]
        header = payload[1] if s.header else packed.new_zeros(0, dtype=torch.float32)
        n = ctx.numel
        res = torch.empty(n, dtype=torch.float32, device=packed.device) if out is None else out
        res = res.reshape(-1)[:n]
        if cpu_kernels_enabled(res) and packed.device.type == "cpu":
            return cpu_decode(s, packed.contiguous(), header, n, self._params, res)
        if cuda_kernels_enabled(res):
            return cuda_decode(s, packed, header, n, self._params, res)
        return gen_torch.module(s).decode(packed, header, n, dict(self.settings), res)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, self.spec.bits) + 4 * len(self.spec.header)
