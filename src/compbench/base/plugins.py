"""Components from other packages: extra `conf/` folders, found without editing compbench.

Two ways to add a folder laid out like compbench's own `conf/` (`conf/compressor/NAME.yaml`,
`conf/comm/NAME.yaml`, ..., each with a `_target_` into the plugin's own module):

- an installed package that declares an entry point in the group `compbench.plugins` whose value
  names the package (`mycomp = mycomp`): its `conf/` folder (next to its `__init__.py`) is read;
- `COMPBENCH_CONF_PATH`: folders separated by `os.pathsep` (":"), each laid out like `conf/` (for
  scripts and notebooks that do not build a package).

The registry lists their options next to compbench's and the config composer appends them to
Hydra's search path. Nothing of the plugin is imported here: its package is only located
(`importlib.util.find_spec`), and its classes are imported when a component is built, as compbench's
own are.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

ENTRY_POINT_GROUP = "compbench.plugins"
PATH_ENV = "COMPBENCH_CONF_PATH"


@dataclass(frozen=True)
class ConfSource:
    """One extra `conf/` folder and where it came from: `origin` is "package DIST" (an entry point
    of the installed distribution DIST) or "COMPBENCH_CONF_PATH"."""

    origin: str
    path: Path


def sources() -> tuple[ConfSource, ...]:
    """The extra conf folders: entry-point packages (sorted by distribution), then
    $COMPBENCH_CONF_PATH's folders in their order. ValueError for one that cannot be used."""
    # Keyed on what decides the answer, so a test or notebook that extends sys.path or sets the
    # variable sees its plugin without clearing a cache.
    return _sources(os.environ.get(PATH_ENV, ""), tuple(sys.path))


@cache
def _sources(conf_path: str, _sys_path: tuple[str, ...]) -> tuple[ConfSource, ...]:
    found: list[ConfSource] = []
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (_dist_name(e), e.name))
    for ep in eps:
        found.append(ConfSource(f"package {_dist_name(ep)}", _package_conf(ep)))
    for folder in conf_path.split(os.pathsep):
        if not folder:
            continue
        path = Path(folder).expanduser().resolve()
        if not path.is_dir():
            raise ValueError(f"{PATH_ENV}: {folder} is not a folder; list folders laid out like compbench's "
                             f"conf/ (GROUP/NAME.yaml), separated by '{os.pathsep}'")
        found.append(ConfSource(PATH_ENV, path))
    unique: dict[Path, ConfSource] = {}
    for source in found:  # the same folder twice (a package also on the variable): read once
        unique.setdefault(source.path, source)
    return tuple(unique.values())


def _dist_name(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else ep.module


def _package_conf(ep: EntryPoint) -> Path:
    """The `conf/` folder of the package the entry point names (located, not imported)."""
    who = f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}) of package {_dist_name(ep)}"
    if ep.attr:
        raise ValueError(f"{who} names an object; it must name the package that holds conf/: "
                         f"write `{ep.name} = {ep.module}`")
    try:
        spec = importlib.util.find_spec(ep.module)
    except Exception as e:  # noqa: BLE001 - finding a.b imports a, whose __init__ may raise anything
        spec = None
        reason = f" ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''})"
    else:
        reason = ""
    if spec is None:
        raise ValueError(f"{who}: package {ep.module} cannot be found{reason}; install it "
                         "or put its folder on PYTHONPATH")
    for folder in spec.submodule_search_locations or []:
        if (Path(folder) / "conf").is_dir():
            return (Path(folder) / "conf").resolve()
    raise ValueError(f"{who}: {ep.module} has no conf/ folder next to its __init__.py; add "
                     f"conf/GROUP/NAME.yaml files there (e.g. conf/compressor/NAME.yaml)")
