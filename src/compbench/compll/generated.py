"""The CompLL specs and the files generated from them (the kernels' loaders and the registry
import this module, which imports no kernel or registry module but the kernel table, plain data:
no import cycle).

- `specs()`: every `specs/NAME.py` with its `SPEC` (sorted by name).
- `generated_dir()`: a folder under ~/.cache/compbench/compll/KEY/ (KEY: a hash of everything
  generated) holding table/kernel_table.cpp (the hand-written kernels' declarations and
  registrations, from compbench.kernels.table), cpu/compll_NAME.cpp (both built into the CPU
  extension by `make kernels`: the extension's cache key hashes these sources too),
  cuda/compll_NAME.cu (loaded by `kernels.loader` like extensions/cuda/*.cu) and
  conf/compressor/NAME.yaml for every spec with `register=True` (a conf folder the registry reads
  after compbench's own: the Hydra option and the registry entry of a spec-only compressor).
  Written once, atomically; cheap to recompute.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
from functools import cache
from pathlib import Path

from compbench.compll import gen_cpu, gen_cuda, lang


@cache
def _all() -> dict[str, lang.Spec | lang.Select]:
    """name -> SPEC of every module in compbench/compll/specs/."""
    from compbench.compll import specs as package

    found: dict[str, lang.Spec | lang.Select] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{package.__name__}.{info.name}")
        s = getattr(mod, "SPEC", None)
        if not isinstance(s, (lang.Spec, lang.Select)) or s.name != info.name:
            raise ValueError(f"compll spec {mod.__file__}: define SPEC = Spec(name={info.name!r}, ...) "
                             f"or Select(name={info.name!r}, ...)")
        found[s.name] = s
    return found


def specs() -> dict[str, lang.Spec]:
    """name -> Spec of every code spec (packed codes and a header) in compbench/compll/specs/."""
    return {k: v for k, v in _all().items() if isinstance(v, lang.Spec)}


def selects() -> dict[str, lang.Select]:
    """name -> Select of every selection spec (sampled threshold + filter) in compbench/compll/specs/."""
    return {k: v for k, v in _all().items() if isinstance(v, lang.Select)}


def select(name: str) -> lang.Select:
    """The selection spec called `name`; ValueError listing them otherwise."""
    found = selects()
    if name not in found:
        raise ValueError(f"no CompLL selection {name!r}; choose one of: {', '.join(found)}")
    return found[name]


def spec(name: str) -> lang.Spec:
    """The spec called `name`; ValueError listing them otherwise (a selection: `select`)."""
    found = specs()
    if name in selects():
        return selects()[name]  # type: ignore[return-value]
    if name not in found:
        raise ValueError(f"no CompLL spec {name!r}; choose one of: {', '.join(sorted([*found, *selects()]))}")
    return found[name]


def conf_text(s: lang.Spec) -> str:
    """The generated conf/compressor/NAME.yaml of a registered spec."""
    lines = [f"# {s.doc.splitlines()[0]} (CompLL: compll/specs/{s.name}.py)",
             "# Generated from the spec by compbench.compll: do not edit.",
             f"_target_: compbench.compll.registered.{s.name}"]
    for key, setting in s.settings.items():
        value = str(setting.default).lower() if isinstance(setting.default, bool) else setting.default
        lines.append(f"{key}: {value}")
    lines += ["# Pipeline selection policy (experiment configs use the seeds' 204800 / 200; "
              "0 compresses everything).",
              "compress_threshold: 0", "dense_steps: 0", ""]
    return "\n".join(lines)


def _files() -> dict[str, str]:
    from compbench.kernels.table import registration_source

    # The hand-written kernels' registrations, generated from their table, live here too: one
    # folder of generated sources, one cache key.
    files = {"table/kernel_table.cpp": registration_source()}
    for s in _all().values():
        files[f"cpu/compll_{s.name}.cpp"] = gen_cpu.source(s)
        files[f"cuda/compll_{s.name}.cu"] = gen_cuda.source(s)
        if isinstance(s, lang.Spec) and s.register:
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


def table_sources() -> list[Path]:
    return [generated_dir() / "table" / "kernel_table.cpp"]


def cpu_sources() -> list[Path]:
    return sorted((generated_dir() / "cpu").glob("*.cpp"))


def cuda_sources() -> list[Path]:
    return sorted((generated_dir() / "cuda").glob("*.cu"))


def conf_folder() -> Path:
    return generated_dir() / "conf"
