"""Kernel sources the kernel layer builds and loads but does not generate: the hand-written kernels'
registrations (from `kernels.table`) and the units generated from CompLL specs. CompLL stands above
the kernels, so the kernels never import it: the package root (compbench/__init__.py) hands in a
provider with `provide`, which imports CompLL only when the kernels first ask for their sources.
Torch-free, so that `import compbench` stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class GeneratedSources:
    """`table` and `cpu`: C++ units built into the CPU extension after the hand-written ones;
    `cuda`: .cu sources loaded as RawModules by their stem (`compll_NAME`)."""

    table: list[Path] = field(default_factory=list)
    cpu: list[Path] = field(default_factory=list)
    cuda: list[Path] = field(default_factory=list)


_provider: list[Callable[[], GeneratedSources]] = []


def provide(provider: Callable[[], GeneratedSources]) -> None:
    """Hand in the generated sources (called once per process; a later call replaces the first)."""
    _provider[:] = [provider]


def sources() -> GeneratedSources:
    """The generated sources handed in, else none."""
    return _provider[0]() if _provider else GeneratedSources()
