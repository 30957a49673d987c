"""Where CompLL specs come from: compbench's own `compll/specs/NAME.py`, then the plugins'.

A plugin (compbench.plugins: an installed package with a `compbench.plugins` entry point, or a
folder on $COMPBENCH_CONF_PATH) may hold specs in a `compll/` folder beside its `conf/` folder:
`mypkg/compll/NAME.py` next to `mypkg/conf/`, each defining `SPEC` as compbench's do. They are
generated, built into the CPU extension, loaded as RawKernels and registered as `compressor=NAME`
exactly as compbench's own. A spec file is imported by its path (not as a submodule of the plugin's
package), so it imports what it needs absolutely (`from compbench.compll.lang import ...`).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from compbench.base import plugins
from compbench.compll import lang

AnySpec = lang.Spec | lang.Select
OWN = "src/compbench/compll/specs"  # how generated files name a spec of compbench's own


def all_specs() -> dict[str, AnySpec]:
    """name -> SPEC of every spec: compbench's (sorted by name), then the plugins' (sorted by name
    within each plugin, plugins in `plugins.sources()` order)."""
    # Keyed on the plugin folders, so a test or notebook that adds one sees its specs.
    return _found(plugins.sources())[0]


def origin(name: str) -> str:
    """The file spec `name` comes from, as generated files cite it (compbench's own: relative to the
    repository; a plugin's: its absolute path)."""
    return _found(plugins.sources())[1][name]


def plugin_folders() -> list[Path]:
    """The plugins' spec folders that exist (`compll/` beside each plugin's `conf/`)."""
    return [s.path.parent / "compll" for s in plugins.sources() if (s.path.parent / "compll").is_dir()]


@cache
def _found(_sources: tuple[plugins.ConfSource, ...]) -> tuple[dict[str, AnySpec], dict[str, str]]:
    from compbench.compll import specs as package

    found: dict[str, AnySpec] = {}
    origins: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        mod = importlib.import_module(f"{package.__name__}.{info.name}")
        found[info.name] = _spec_of(mod, info.name)
        origins[info.name] = f"{OWN}/{info.name}.py"
    for folder in plugin_folders():
        for path in sorted(folder.glob("*.py")):
            if path.stem.startswith("_"):
                continue
            if path.stem in found:
                raise ValueError(f"CompLL spec {path}: {path.stem} is also {origins[path.stem]}; "
                                 "rename one of them (a spec may not shadow another)")
            found[path.stem] = _spec_of(_import(path), path.stem)
            origins[path.stem] = str(path)
    return found, origins


def _import(path: Path) -> ModuleType:
    """The module of a plugin's spec file, imported by path once per process."""
    name = f"compbench_compll_plugin_{path.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"CompLL spec {path}: cannot be imported")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look the module up
    spec.loader.exec_module(mod)
    return mod


def _spec_of(mod: ModuleType, name: str) -> AnySpec:
    s = getattr(mod, "SPEC", None)
    if not isinstance(s, (lang.Spec, lang.Select)) or s.name != name:
        raise ValueError(f"compll spec {mod.__file__}: define SPEC = Spec(name={name!r}, ...) "
                         f"or Select(name={name!r}, ...)")
    return s
