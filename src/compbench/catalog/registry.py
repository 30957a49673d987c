"""Lazy component registry: the Hydra config folders are the registry.

`conf/<group>/<name>.yaml` names an option; its `_target_` says which class builds it. Nothing is
imported until a component is built, so optional dependencies (CuPy, Horovod) are loaded only by the
component that needs them and every CPU path works without them.

Plugins add conf folders of the same layout (compbench.plugins: an entry point, or
$COMPBENCH_CONF_PATH); their options are listed and built exactly as compbench's own.
"""

from __future__ import annotations

import importlib
import inspect
import os
from functools import cache
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf


def conf_dir() -> Path:
    """The `conf/` folder: $COMPBENCH_CONF_DIR, else the repository's (editable install)."""
    env = os.environ.get("COMPBENCH_CONF_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[3] / "conf"
    if not (path / "train.yaml").is_file():
        raise ValueError(f"no compbench config at {path}; set COMPBENCH_CONF_DIR to the repository's conf/")
    return path


def conf_sources() -> list[tuple[str, Path]]:
    """Every conf folder as (origin, path): compbench's own ("compbench") first, then the one
    generated from its CompLL specs (`compll.generated.conf_folder`), then the plugins'
    (compbench.plugins: entry points and $COMPBENCH_CONF_PATH)."""
    from compbench.base import plugins
    from compbench.compll.generated import conf_folder

    own = conf_dir()
    # Second, compbench's compressors written as CompLL specs (their generated conf/compressor/*.yaml).
    return [("compbench", own), ("compbench", conf_folder()),
            *((s.origin, s.path) for s in plugins.sources() if s.path != own.resolve())]


def check_sources(groups: tuple[str, ...]) -> None:
    """ValueError for a plugin folder compbench would misread: a file outside a group folder, a
    folder that is no config group (a typo such as conf/compressors/), or an option that another
    folder also defines (every group is read, so the refusal does not depend on the command)."""
    for origin, path in conf_sources()[1:]:
        for entry in sorted(path.iterdir()):
            if entry.suffix == ".yaml" or (entry.is_dir() and entry.name not in groups):
                raise ValueError(f"{entry}: a plugin's conf folder ({origin}) holds only group folders "
                                 f"({', '.join(groups)}) of NAME.yaml files; move or rename it")
    for group in groups:
        option_paths(group)


def option_paths(group: str) -> dict[str, tuple[str, Path]]:
    """The options of a config group: name -> (origin, YAML file). A plugin may not shadow an
    option of compbench or of another plugin: ValueError naming both files."""
    found: dict[str, tuple[str, Path]] = {}
    for origin, root in conf_sources():
        for path in _yaml_files(root / group):
            if path.stem in found:
                first, where = found[path.stem]
                raise ValueError(f"{group}={path.stem} is defined twice: by {first} ({where}) and by "
                                 f"{origin} ({path}); options may not shadow one another: rename {origin}'s")
            found[path.stem] = (origin, path)
    return found


def _yaml_files(folder: Path) -> tuple[Path, ...]:
    """The folder's NAME.yaml files, sorted; read again only when the folder changes (a file added,
    removed or renamed changes its mtime), so that the config check, which asks for every group's
    options many times, lists each folder once."""
    try:
        stamp = folder.stat().st_mtime_ns
    except FileNotFoundError:
        return ()
    return _listing(folder, stamp)


@cache
def _listing(folder: Path, stamp: int) -> tuple[Path, ...]:  # noqa: ARG001 - the stamp keys the cache
    return tuple(sorted(folder.glob("*.yaml")))


def options(group: str) -> list[str]:
    """Names of the options of a config group (compbench's and the plugins'), sorted."""
    return sorted(option_paths(group))


def option_path(group: str, name: str) -> Path:
    """The YAML file of option `name` of `group`; ValueError listing the options if there is none."""
    found = option_paths(group)
    if name not in found:
        raise ValueError(f"unknown {group}={name}; choose one of: {', '.join(sorted(found))}")
    return found[name][1]


def option_origin(group: str, name: str) -> str:
    """Where option `name` comes from: "compbench", "package DIST" or "COMPBENCH_CONF_PATH"."""
    option_path(group, name)  # unknown: the same ValueError
    return option_paths(group)[name][0]


def option_config(group: str, name: str) -> dict[str, Any]:
    """The option's YAML as a plain dict (read once per file; shared: do not modify it)."""
    return _load(option_path(group, name))


def train_config() -> dict[str, Any]:
    """conf/train.yaml as a plain dict, its `defaults` list included (read once; shared: do not
    modify it)."""
    return _load(conf_dir() / "train.yaml")


@cache  # by file, not by name: a plugin installed or removed later in the process is seen
def _load(path: Path) -> dict[str, Any]:
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    try:
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (YAMLError, OmegaConfBaseException, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{path} is not a readable YAML config ({first}); fix it or remove it") from None
    if not isinstance(node, dict):
        raise ValueError(f"{path} is not a YAML mapping of settings; fix it or remove it")
    return {str(k): v for k, v in node.items()}


def locate(target: str) -> Any:
    """The object `target` ("package.module.Name") names; ValueError (one line) where it cannot be
    imported: a missing module, a plugin package that raises on import, a name it does not have."""
    module, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - whatever a plugin's import raises is reported in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"_target_ {target} cannot be loaded ({type(e).__name__}: {first}); install what "
                         "provides it or fix the _target_ of its conf file") from None


def component_class(group: str, name: str) -> Any:  # a located class: its `traits`/`caps` are read
    return locate(option_config(group, name)["_target_"])


# What a component of each group declares on its class (the config check reads only these).
DECLARATIONS = {"compressor": "caps", "memory": "traits", "comm": "traits", "scheduler": "traits",
                "sync": "sync_traits"}


def declared(group: str, name: str) -> Any:
    """The record option `name` of `group` declares (a compressor's `caps`, a synchronization
    mode's `sync_traits`, the others' `traits`); ValueError naming the option where it has none
    (a plugin's class written without it). The flags that promise a method are derived from the
    class (`codec.base.derive`: a plugin that implements the method has the flag), ValueError where
    it declares one without the method."""
    cls, attr = component_class(group, name), DECLARATIONS[group]
    record = getattr(cls, attr, None)
    if record is None:
        raise ValueError(f"{group}={name} ({cls.__module__}.{cls.__qualname__}) declares no `{attr}`; "
                         f"a {group} declares what it is there (docs: Your own components and plugins)")
    from compbench.codec.base import derive  # torch, as the class itself: imported where it is used

    try:
        return derive(record, cls)
    except TypeError as e:
        raise ValueError(f"{group}={name}: {e}") from None


def plain(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """A config node as a plain dict (components never see a DictConfig)."""
    if isinstance(cfg, DictConfig):
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # a DictConfig: a dict
    return dict(cfg)


def check_settings(cfg: DictConfig | dict[str, Any], who: str, *, drop: tuple[str, ...] = (),
                   passed: tuple[str, ...] = (), declared: tuple[str, ...] = ()) -> None:
    """ValueError naming the first key of the node that its `_target_` does not take (a typo such as
    `+compressor.ratoi=...`, which Hydra's `+` lets through): the key would otherwise fail inside
    a worker, or be ignored. `drop`: keys the caller removes; `passed`: arguments the caller supplies
    itself; `declared`: the option's own YAML keys, the settings of a target that takes any keyword
    (a data set's factory, which the model's interpolations hand keys it does not read)."""
    kwargs = plain(cfg)
    named, open_ended = named_parameters(locate(kwargs.pop("_target_")))
    takes = [k for k in named if k not in passed]
    if open_ended:
        if not declared:  # nothing says which keys it reads: any
            return
        takes += [k for k in declared if k not in takes and k != "_target_"]
    unknown = [k for k in kwargs if k not in drop and k not in takes]
    if unknown:
        group = who.partition("=")[0]
        settings = ", ".join([*takes, *drop])
        raise ValueError(f"{group}.{unknown[0]} is not a setting of {who}; "
                         + (f"its settings are: {settings}" if settings else "it takes none"))


def named_parameters(obj: Any) -> tuple[list[str], bool]:
    """The keyword arguments `obj` (a class or a function) names, and whether it takes others too. A
    class whose constructor passes `**kwargs` on to its base's (compbench's SGD to torch's) names
    its bases' arguments as well, up to the first constructor without `**kwargs`."""
    names: list[str] = []
    classes = obj.__mro__ if inspect.isclass(obj) else ()
    inits = [vars(c)["__init__"] for c in classes if "__init__" in vars(c)] or [obj]
    for fn in inits:
        params = inspect.signature(fn).parameters
        names += [k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and k not in ("self", *names)]
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return names, False
    return names, True


def build(cfg: DictConfig | dict[str, Any], *, drop: tuple[str, ...] = (), **extra: Any) -> Any:
    """Instantiate `_target_` with the node's other keys as flat keyword arguments."""
    kwargs = plain(cfg)
    target = kwargs.pop("_target_")
    for key in drop:
        kwargs.pop(key, None)
    return locate(target)(**kwargs, **extra)
