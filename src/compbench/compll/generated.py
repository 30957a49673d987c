"""The CompLL specs and the files generated from them (the registry imports this module, which
imports no registry module but the kernel table, plain data: no import cycle). `sources_for_kernels`
is what the kernel layer builds and loads: the package root hands it in (compbench.base.kernel_sources),
so the kernels never import CompLL.

- `specs()`: every spec with its `SPEC` (compbench's `specs/NAME.py` and the plugins' `compll/NAME.py`:
  `catalog`).
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
import os
from functools import cache
from pathlib import Path

from compbench.base import kernel_sources, plugins
from compbench.compll import catalog, gen_cpu, gen_cuda, lang


def _all() -> dict[str, lang.Spec | lang.Select]:
    """name -> SPEC of every spec (`catalog.all_specs`)."""
    return catalog.all_specs()


def specs() -> dict[str, lang.Spec]:
    """name -> Spec of every code spec (packed codes and a header)."""
    return {k: v for k, v in _all().items() if isinstance(v, lang.Spec)}


def selects() -> dict[str, lang.Select]:
    """name -> Select of every selection spec (sampled threshold + filter)."""
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
    where = catalog.origin(s.name).removeprefix("src/compbench/")
    lines = [f"# {s.doc.splitlines()[0]} (CompLL: {where})",
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


def generated_dir() -> Path:
    """The folder of every generated file (written on first use; see the module docstring)."""
    return _generated_dir(plugins.sources())  # keyed on the plugins, whose specs it holds too


@cache
def _generated_dir(_sources: tuple[plugins.ConfSource, ...]) -> Path:
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


def sources_for_kernels() -> kernel_sources.GeneratedSources:
    """What the kernel layer builds and loads (the package root hands this in: compbench/__init__.py)."""
    return kernel_sources.GeneratedSources(table=table_sources(), cpu=cpu_sources(), cuda=cuda_sources())


def build_kernels() -> None:
    """`make kernels`: the CPU extension with the generated units of every spec (plugins' included)."""
    from compbench.kernels.cpu import main

    main()
