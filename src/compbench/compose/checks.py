"""Value checks of a composed train config, run once in the parent (`compbench.compose.config.check`).

Every setting a worker would otherwise trip over (a string where a number belongs, a negative
learning rate, a batch larger than the data set, an output folder that cannot be created) is
refused here with one line naming the key and the fix, before any folder or file exists. The
combination checks (compressor x memory x comm x scheduler x engine x optimizer) live in
`compbench.compose.compat`.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from compbench.base.settings import RunSettings
from compbench.base.values import KeyRange, is_int, is_number, require_int, require_number, show, type_problem
from compbench.train import loggers

# `engine.np` above this many workers per core is refused: each worker is a full process with its
# own copy of the model and of the engine's buffers; at 32 workers per core (np=64 on 2 cores) a
# job took 9.7 GB, ran 167 s and died of a gloo timeout. Above one per core it only warns.
MAX_WORKERS_PER_CORE = 4
_LR_SCHEDULES = ("constant", "cosine", "step")
_BACKENDS = ("auto", "gloo", "nccl")
NICE_LOWEST = 19  # the lowest CPU priority (nice=-20 is the highest)


def check_settings(cfg: DictConfig) -> None:
    """Refuse bad values with a ValueError (one line: key, value, fix); warn where a value only hurts."""
    _check_model_fits_dataset(cfg)  # first: a mismatch leaves ${dataset.*} interpolations unresolved
    _check_finite(cfg)
    _check_declared_keys(cfg)
    _check_run_settings(cfg)
    loggers.check(OmegaConf.to_object(cfg.loggers) if OmegaConf.is_config(cfg.loggers) else cfg.loggers,
                  cast(dict[str, Any], OmegaConf.to_container(cfg.mlflow)),
                  cfg.get("outputs_root") or "outputs")
    _check_engine(cfg)
    _check_device(cfg)
    _check_optim(cfg)
    _check_group_keys(cfg)
    _check_batch_fits_dataset(cfg)
    _check_output_dir(cfg)
    _check_profiled_model(cfg)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], node


# -- checks ----------------------------------------------------------------------------------

def _check_finite(cfg: DictConfig) -> None:
    """No setting anywhere may be NaN or infinite (`optim.lr=nan`, `memory.beta=inf`): such a
    run trains on garbage and publishes numbers that look like results."""
    from omegaconf.errors import OmegaConfBaseException

    try:
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:  # e.g. output_dir=${nope}: the user's interpolation
        raise ValueError(f"{str(e).splitlines()[0]}; fix the ${{...}} in that setting") from None
    for key, v in _leaves(plain):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{key}={v} must be a finite number; pass a real value")


def _check_group_keys(cfg: DictConfig) -> None:
    """Every setting of every group, typed where its component declares it: the range in the
    component's `KEY_RANGES` (beside its constructor: a class attribute, or its module's), else the
    type its constructor's signature gives the key (`type_problem`: `compressor.seed=abc`,
    `scheduler.confirm=0.5`, `compressor.dense_steps=null` stop here, not in a worker), else, for
    a key no signature names (optim, engine), the type of its default in the option's YAML file: a
    true or false default takes only true or false (`sync.nesterov=0` must not read as truthy), a
    numeric one a finite number."""
    from compbench.catalog import registry

    for group, option in cfg.choices.items():  # exactly the config groups (compbench.compose.config.GROUPS)
        if option not in registry.options(group):
            continue
        node = cfg[group]
        hints, ranges = declared_keys(node.get("_target_"))
        if group == "compressor":  # the keys the pipeline splits off (which tensors it compresses)
            from compbench.compressors import SELECTION_RANGES

            ranges = {**SELECTION_RANGES, **ranges}
        defaults = registry.option_config(group, option)
        for key in map(str, node):
            if key == "_target_":
                continue
            value, default = node.get(key), defaults.get(key)
            if key in ranges:
                problem = ranges[key].problem(value)
            elif key in hints:
                problem = type_problem(hints[key], value)
            else:
                problem = _default_type_problem(default, value)
            if problem:
                raise ValueError(f"{group}.{key}={show(value)} {problem}")


def declared_keys(target: str | None) -> tuple[dict[str, Any], dict[str, KeyRange]]:
    """The constructor's annotations and the declared KEY_RANGES of a `_target_` (none for a group
    without one). An unloadable target is the registry's one-line error; annotations that cannot be
    resolved here (a name imported only for the type checker) leave the keys to the component's own
    checks."""
    import inspect
    import sys
    import typing

    from compbench.catalog import registry

    if not target:
        return {}, {}
    obj = registry.locate(target)
    try:
        hints = typing.get_type_hints(obj.__init__ if inspect.isclass(obj) else obj)
    except (NameError, TypeError):
        hints = {}
    module = sys.modules[obj.__module__]
    ranges = {**getattr(module, "KEY_RANGES", {}), **getattr(obj, "KEY_RANGES", {})}
    return hints, ranges


def _default_type_problem(default: Any, value: Any) -> str | None:
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "must be true or false"
    if is_number(default) and not (is_number(value) and math.isfinite(value)):
        return "must be a number"
    return None


def _check_declared_keys(cfg: DictConfig) -> None:
    """A key that nothing reads (`+foo=1`, `+net.foo=1`: Hydra's `+` adds any) is refused: the run
    would start without it doing anything. The top level takes conf/train.yaml's keys and the
    groups; `net` (read by key, no constructor) its option's file's keys. The groups built from a
    `_target_` are checked against what it takes (compbench.compose.config.check)."""
    from compbench.catalog import registry

    top = registry.train_config()
    known = {str(k) for k in top if k != "defaults"} | set(cfg.choices) | {"choices", "recipe"}
    for key in map(str, cfg):
        if key not in known:
            raise ValueError(f"{key} is not a setting of compbench train; remove +{key}= (the settings are "
                             "listed by `compbench train --cfg job`)")
    declared = registry.option_config("net", cfg.choices["net"])
    for key in map(str, cfg.net):
        if key not in declared:
            raise ValueError(f"net.{key} is not a setting of net={cfg.choices['net']}; its settings are: "
                             f"{', '.join(declared)}")


def _check_run_settings(cfg: DictConfig) -> None:
    s = RunSettings.of(cfg)  # the top-level keys, typed (compbench.base.settings)
    if s.target_loss is not None and s.target_acc1 is not None:
        raise ValueError("target_loss and target_acc1 are both set; keep one of them")
    target = next((k for k in ("target_loss", "target_acc1") if getattr(s, k) is not None), None)
    if target and not s.eval:
        raise ValueError(f"{target} is checked at evaluations and eval=false runs none; drop {target} or "
                         "pass eval=true")
    if s.max_train_s is not None and not s.eval:
        raise ValueError("max_train_s is checked at evaluations and eval=false runs none; drop max_train_s "
                         "or pass eval=true")
    if s.nice is not None and s.nice > NICE_LOWEST:
        raise ValueError(f"nice={s.nice} must be an integer within [-20, {NICE_LOWEST}] (the workers' CPU "
                         "priority, -20 first)")
    if s.nice is not None and s.nice < 0 and os.geteuid() != 0:
        raise ValueError(f"nice={s.nice} raises the workers' CPU priority, which needs root; run as root or "
                         "pass nice=0 or higher")
    if s.budget_clock == "unloaded" and s.max_train_s is None and not s.eval_every_s:
        raise ValueError("budget_clock=unloaded is the clock of max_train_s and eval_every_s, and neither is "
                         "set; set max_train_s=SECONDS or drop budget_clock")
    if s.stop_at_target and target is None:
        raise ValueError("stop_at_target=true needs a target; pass target_loss=VALUE or target_acc1=VALUE")
    if s.eval_near_target and target is None:
        raise ValueError(f"eval_near_target={s.eval_near_target:g} refines the evaluations near a target and "
                         "none is set; pass target_loss=VALUE or target_acc1=VALUE, or drop eval_near_target")
    if s.target_acc1 is not None and "vocab_size" in cfg.model:
        raise ValueError(f"target_acc1 is an accuracy and model={cfg.choices['model']} a language model; "
                         "pass target_loss=VALUE instead")


def _check_engine(cfg: DictConfig) -> None:
    np = cfg.engine.get("np", 1)
    require_int("engine.np", np, 1, "it is the number of workers")
    if "timeout_s" in cfg.engine:
        require_number("engine.timeout_s", cfg.engine.timeout_s, 0, strict=True,
                       fix="seconds a collective may wait, e.g. engine.timeout_s=300")
    backend = cfg.engine.get("backend")
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"engine.backend={show(backend)} is unknown; use {', '.join(_BACKENDS)}")
    from compbench.launch.processes import external_engine

    if external_engine() is None:  # under horovodrun / torchrun the launcher decides the ranks
        _check_worker_count(np)
        _check_groups(cfg, np)


def _check_device(cfg: DictConfig) -> None:
    """device, precision and the engine's backend on this machine (compbench.engines.device)."""
    from compbench.engines import device

    placement = device.check(cfg.device, cfg.precision, device.local_workers(cfg.engine.get("np", 1)),
                             cfg.choices["engine"], cfg.engine.get("backend"))
    if cfg.budget_clock == "unloaded" and placement.kind != "cpu":
        raise ValueError(f"budget_clock=unloaded estimates a CPU step from its CPU time and this run trains "
                         f"on a GPU ({placement.why}); use budget_clock=wall or device=cpu")


def _check_groups(cfg: DictConfig, np: int) -> None:
    """A mode averaging within groups of workers (sync=noloco's `group_size`): the groups must divide
    the workers, and Horovod needs dynamic process sets for groups smaller than the world."""
    sync = cfg.get("sync") or {}
    value = sync.get("group_size")
    if not is_int(value):
        return  # its own check refuses a bad value
    size = int(cast(int, value))
    if size > np >= 1:
        raise ValueError(f"sync.group_size={size} is more than engine.np={np}: no group of {size} can form, "
                         f"so every round would average all workers; pass sync.group_size<={np}")
    if size < 2 or np == size:
        return  # a group of every worker is the world
    if np % size:
        raise ValueError(f"sync.group_size={size} does not divide engine.np={np} (every worker in one group "
                         f"each round); pass engine.np={-(-np // size) * size} or a sync.group_size that "
                         "divides it")
    horovod = "horovod" in str(cfg.engine.get("_target_", ""))
    if horovod and os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
        raise ValueError(f"sync.group_size={size} with engine.np={np} averages within groups, which Horovod "
                         "allows only with dynamic process sets; set HOROVOD_DYNAMIC_PROCESS_SETS=1 in the "
                         "environment or use engine=torch")


def _check_worker_count(np: int) -> None:
    cores = os.cpu_count() or 1
    bound = MAX_WORKERS_PER_CORE * cores
    if np > bound:
        raise ValueError(f"engine.np={np} is more than {MAX_WORKERS_PER_CORE} workers per core on "
                         f"{cores} cores (each is a process with its own model); use engine.np<={bound}, "
                         f"or horovodrun/torchrun across machines")
    if np > cores:
        warnings.warn(f"engine.np={np} workers share {cores} cores: steps will be slow and timings "
                      f"not representative", stacklevel=2)


def _check_profiled_model(cfg: DictConfig) -> None:
    if cfg.model.get("_target_") != "compbench.models.profiled.profiled":
        return
    require_number("model.backward_ms", cfg.model.backward_ms, 0, fix="milliseconds of backward, e.g. 100")
    import torchvision

    if cfg.model.arch not in torchvision.models.list_models(torchvision.models):
        raise ValueError(f"model.arch={cfg.model.arch} is not a torchvision classification model; "
                         "use e.g. model.arch=resnet50")


def _check_optim(cfg: DictConfig) -> None:
    from compbench.optim.optimizers import ChecksOwnOptions, optimizer_class

    o = cfg.optim
    name = o.get("name", "optim")
    cls = optimizer_class(name)  # a known name or an importable Optimizer class, before any worker
    _check_optimizer_takes(cls, o)
    if isinstance(cls, ChecksOwnOptions):  # an optimizer's own keys (optim=muon's)
        import inspect

        plain = cast(dict[str, Any], OmegaConf.to_container(o, resolve=True))
        takes = inspect.signature(cls.check_options).parameters
        cls.check_options(**{k: v for k, v in plain.items() if k in takes})
    require_number("optim.lr", o.get("lr"), 0, strict=True, fix=f"e.g. optim.lr={_default_lr(name)}")
    for key in ("momentum", "weight_decay", "warmup_epochs", "lr_min_factor"):
        if key in o:
            require_number(f"optim.{key}", o[key], 0)
    if "warmup_steps" in o:
        require_int("optim.warmup_steps", o.warmup_steps, 0, "0 warms up over optim.warmup_epochs instead")
    if "lr_gamma" in o:
        require_number("optim.lr_gamma", o.lr_gamma, 0, strict=True)
    if o.get("clip_grad_norm") is not None:
        require_number("optim.clip_grad_norm", o.clip_grad_norm, 0, strict=True,
                       fix="the largest gradient norm, e.g. optim.clip_grad_norm=1.0 (null: no clipping)")
    if "momentum" in o and o.momentum >= 1:
        raise ValueError(f"optim.momentum={show(o.momentum)} must be below 1 (it would never decay); "
                         "e.g. optim.momentum=0.9")
    if "lr_min_factor" in o and o.lr_min_factor > 1:
        raise ValueError(f"optim.lr_min_factor={show(o.lr_min_factor)} must be at most 1 (a fraction of "
                         "optim.lr)")
    if "betas" in o:
        betas = o.betas
        if (not OmegaConf.is_list(betas) or len(betas) != 2
                or not all(is_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"optim.betas={show(betas)} must be two numbers in [0, 1); "
                             f"e.g. optim.betas=[0.9,0.999]")
    if "lr_schedule" in o and o.lr_schedule not in _LR_SCHEDULES:
        raise ValueError(f"optim.lr_schedule={show(o.lr_schedule)} is unknown; use "
                         f"{', '.join(_LR_SCHEDULES)}")
    steps = o.get("lr_step_epochs")
    steps_ok = steps is None or (OmegaConf.is_list(steps) and all(is_number(s) and s >= 0 for s in steps))
    if not steps_ok:
        raise ValueError(f"optim.lr_step_epochs={show(steps)} must be a list of epochs >= 0, e.g. [30,60]")


def _check_optimizer_takes(cls: type, o: DictConfig) -> None:
    """The optimizer class (compbench's, or a user's: optim.name=package.module.Class) takes the group's
    keys as keyword arguments, the schedule's aside: one it does not take (`+optim.lrr=0.1`) is refused
    here, not by a worker's TypeError; a class that takes any keyword takes them all."""
    from compbench.catalog import registry
    from compbench.optim.clip import CLIP_KEY
    from compbench.optim.schedule import SCHEDULE_KEYS

    params, open_ended = registry.named_parameters(cls)
    if open_ended:
        return
    for key in map(str, o):
        if key not in ("name", CLIP_KEY, *SCHEDULE_KEYS) and key not in params:
            if "." in str(o.name):  # a user's class under another option's keys (optim=sgd's momentum)
                raise ValueError(f"optim.{key}: optim.name={o.name} takes no such argument; remove it "
                                 f"(~optim.{key}) or give your optimizer its own conf/optim/NAME.yaml")
            settings = ", ".join(k for k in params if k != "params")
            raise ValueError(f"optim.{key} is not a setting of optim.name={o.name}; remove it "
                             f"(~optim.{key}); its settings are: {settings}")


def _default_lr(name: str) -> str:
    return "0.1" if name == "sgd" else "1e-3"


def _check_model_fits_dataset(cfg: DictConfig) -> None:
    """A language model (its config takes the dataset's `vocab_size`) needs a dataset whose module
    declares TASK = "language_model", and a classifier one that does not; a context no longer than
    the model's positions."""
    from compbench.train.task import LanguageModel, task_of

    picked = cfg.choices
    lm_data = isinstance(task_of(cfg.dataset._target_), LanguageModel)
    lm_model = "vocab_size" in cfg.model
    if lm_data and not lm_model:
        raise ValueError(f"dataset={picked['dataset']} is language modelling and model={picked['model']} a "
                         f"classifier; use a language model, e.g. model=gpt")
    if lm_model and not lm_data:
        raise ValueError(f"model={picked['model']} is a language model and dataset={picked['dataset']} is "
                         f"classification; use a text dataset, e.g. dataset=shakespeare")
    if lm_data:
        vocab, tokens = cfg.model.get("vocab_size"), cfg.dataset.get("vocab_size")
        if vocab != tokens:
            raise ValueError(f"model.vocab_size={show(vocab)} differs from the dataset's vocab_size={tokens} "
                             "(its tokens); drop model.vocab_size: it follows dataset.vocab_size")
        block, context = cfg.model.get("block_size"), cfg.dataset.get("block_size")
        if is_int(block) and is_int(context) and block < context:
            raise ValueError(f"model.block_size={block} is shorter than the dataset's windows "
                             f"(dataset.block_size={context}); raise it or lower dataset.block_size")


def _check_batch_fits_dataset(cfg: DictConfig) -> None:
    """Every worker needs at least one full batch of its shard (drop_last keeps step counts equal)."""
    # None for file-backed sets without a cheap size (ImageNet): the worker checks after loading.
    size_of = importlib.import_module(cfg.dataset._target_.rsplit(".", 1)[0]).train_size_of
    n = size_of(**cast(dict[str, Any], OmegaConf.to_container(cfg.dataset, resolve=True)))
    np = cfg.engine.get("np", 1)
    if n is not None and n // np < cfg.batch_size:
        raise ValueError(f"batch_size={cfg.batch_size} x {np} workers exceeds the {n} training samples "
                         f"(each worker needs one full batch); use batch_size<={max(1, n // np)}")


def _check_output_dir(cfg: DictConfig) -> None:
    """The run folder (output_dir, or one under outputs_root) must be creatable: try it for real in
    its nearest existing parent (a scratch folder, removed at once), so /proc, /dev/null/x, a file
    in the way or a read-only disk fail here and not with a traceback half-way through."""
    from compbench.records.rundir import resume_dir

    out = resume_dir(cfg)
    key, path = ("output_dir", out) if out else ("outputs_root", cfg.outputs_root)
    check_creatable(key, Path(str(path)))


def check_creatable(key: str, path: Path, shown: Path | None = None,
                    fix: str = "pass {key}=DIR with DIR a folder you can write") -> None:
    """Refuse `key=path` unless `path` is a folder or one can be made there (nothing is left behind).
    `shown` is the value named in the message (a file's path when `path` is its folder)."""
    fix, shown = fix.format(key=key), shown or path
    if path.exists() and not path.is_dir():
        raise ValueError(f"{key}={shown}: {path} exists and is not a folder; {fix}" if shown != path else
                         f"{key}={path} exists and is not a folder; {fix}")
    parent = path.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{key}={shown}: {parent} is not a folder; {fix}")
    try:
        scratch = tempfile.mkdtemp(prefix=".compbench-check-", dir=parent)
        os.rmdir(scratch)
    except OSError as e:
        raise ValueError(f"{key}={shown}: cannot create folders in {parent} ({e.strerror}); {fix}") from None


def check_writable_file(key: str, path: Path, ours: Callable[[Path], bool] | None = None,
                        what: str = "") -> None:
    """Refuse `key=path` for a file written at the end of a long job (a benchmark, a plan) unless it
    can be written: not a folder, not a read-only file, its folder exists or can be made, and an
    existing file is one compbench wrote (`ours(path)`, `what` names it; None: any file):
    `output=~/.bashrc` must not replace the user's file."""
    fix = f"pass {key}=FILE with FILE a path you can write"
    if path.is_dir():
        raise ValueError(f"{key}={path} is a folder; {fix}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{key}={path} exists and is not writable; {fix}")
    if ours is not None and path.exists() and not ours(path):
        raise ValueError(f"{key}={path} exists and is not {what}: compbench overwrites only its own "
                         f"files; pass another {key}=FILE or remove it")
    check_creatable(key, path.parent, shown=path, fix=fix)


def is_json_with(path: Path, keys: set[str]) -> bool:
    """Whether `path` holds a JSON object with at least these top-level keys (a file compbench wrote)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and keys <= data.keys()
