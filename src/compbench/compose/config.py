"""Compose the config once (Hydra compose API) and check it before anything is written.

Every user mistake found here is a ValueError whose one-line message names the fix; the CLI prints
it and exits with code 2 before any output directory exists.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf, open_dict

from compbench.base.settings import RunSettings
from compbench.base.values import is_number
from compbench.catalog import registry
from compbench.codec.base import check_ratio
from compbench.compose.checks import check_settings
from compbench.compose.sharded import check_fits, check_sharding

if TYPE_CHECKING:
    from compbench.comm.base import CommTraits
    from compbench.sync import SyncTraits

GROUPS = ("model", "dataset", "compressor", "memory", "comm", "scheduler", "sync", "sharding", "engine",
          "optim", "net", "fault")
# The config groups a plugin's conf folder may add options to (compbench.plugins).
PLUGIN_GROUPS = (*GROUPS, "experiment")


def search_path() -> list[str]:
    """The Hydra override that appends the plugins' conf folders to the search path (none without
    plugins). Appended: compbench's own configs come first, and an option of the same name is
    refused by the registry before Hydra could pick one."""
    registry.check_sources(PLUGIN_GROUPS)
    extra = [path for _, path in registry.conf_sources()[1:]]
    if not extra:
        return []
    quoted = ",".join("'file://" + str(p).replace("\\", "\\\\").replace("'", "\\'") + "'" for p in extra)
    return [f"hydra.searchpath=[{quoted}]"]


# Options that moved to another group, with their settings: the old spelling is refused with the
# new one (a synchronization mode is not a communicator).
MOVED_OPTIONS = {("comm", "ddp"): "sync", ("comm", "horovod_optimizer"): "sync"}
# Settings of sync=demo that became its pipeline's (compressor=chunk_dct, memory=residual).
MOVED_KEYS = {"sync.compression_decay": "memory.beta", "sync.compression_topk": "compressor.topk",
              "sync.compression_chunk": "compressor.chunk"}


def moved(override: str) -> str | None:
    """The one-line refusal of an old spelling (`comm=ddp`, `comm.hook=...`), or None."""
    key, _, value = override.lstrip("+~").partition("=")
    if key in MOVED_KEYS:
        return (f"{key} is {MOVED_KEYS[key]} now (sync=demo sends through compressor=chunk_dct and "
                f"memory=residual); pass {MOVED_KEYS[key]}={value}")
    group, dot, setting = key.partition(".")
    for (old, option), new in MOVED_OPTIONS.items():
        if group != old:
            continue
        if not dot and value == option:
            return f"{old}={option} is a synchronization mode now: pass {new}={option}"
        if dot and setting in registry.option_config(new, option) and setting != "_target_":
            return f"{key} is a setting of {new}={option} now: pass {new}={option} {new}.{setting}={value}"
    return None


def _check_group_choices(overrides: list[str]) -> None:
    for o in overrides:
        hint = moved(o)
        if hint:
            raise ValueError(hint)
        key, sep, value = o.lstrip("+~").partition("=")
        if sep and key in GROUPS and value not in registry.options(key):
            raise ValueError(f"unknown {key}={value}; choose one of: {', '.join(registry.options(key))}")


def _not_a_setting(hydra_message: str, overrides: list[str]) -> str | None:
    """Hydra's "Could not override 'memory.beta'." as what it means: the group's option in force has no
    such key; name the options that have it (a compressor's recipe picks its memory only after the
    overrides are read, so `compressor=topk memory.beta=0.9` needs `memory=residual` named)."""
    match = re.fullmatch(r"Could not override '([^']+)'\..*", hydra_message)
    group, _, setting = match.group(1).partition(".") if match else ("", "", "")
    if group not in GROUPS or not setting or "." in setting:
        return None
    named = [o.partition("=")[2] for o in overrides if o.startswith(f"{group}=")]
    option = named[-1] if named else _default_option(group)
    having = [o for o in registry.options(group) if setting in registry.option_config(group, o)]
    fix = f"name one that has it: {group}={having[0]} {group}.{setting}=..." if having else \
        f"no {group} option has it; drop it"
    return f"{group}.{setting} is not a setting of {group}={option}; {fix}"


def _default_option(group: str) -> str:
    """The option conf/train.yaml's defaults list picks for `group`."""
    for entry in registry.train_config().get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return str(entry[group])
    return "null"


def model_alias(override: str) -> list[str]:
    """`model=ARCH` where ARCH is the timm or torchvision name of a compbench model (its file's `arch`,
    vit_base_patch16_224 for vit_b16) as `model=` that model, and any other model timm knows as
    `model=timm model.arch=ARCH`: the names users know from timm work."""
    key, sep, value = override.partition("=")
    if key != "model" or not sep or value in registry.options("model"):
        return [override]
    arch = {registry.option_config("model", o).get("arch"): o for o in registry.options("model")}
    if value in arch:
        return [f"model={arch[value]}"]
    # compbench.models first: it makes torchvision importable before timm imports it (only for a name
    # no compbench model has)
    from compbench.models.timm_models import is_timm_name

    return ["model=timm", f"model.arch={value}"] if is_timm_name(value) else [override]


def home_expanded(override: str) -> str:
    """`key=~/texts` with the home folder written out (and quoted: Hydra's grammar reads `~` only as
    the deletion of a key, and its lexer refuses it in a value; the shell does not expand it after
    `key.with.dots=`): a path setting (dataset.root, output_dir, resume, ...) says what it means."""
    key, sep, value = override.partition("=")
    if not sep or not (value == "~" or value.startswith("~/")):
        return override
    home = os.path.expanduser(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"{key}='{home}'"


def compose(overrides: list[str], config_name: str = "train", keep_hydra: bool = False) -> DictConfig:
    """The config `config_name` with `overrides` (and, for train, the compressor's recipe), with
    `choices` (the option each group took). `keep_hydra` keeps Hydra's own node (`--cfg hydra`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    searched = search_path()
    overrides = [alias for o in overrides for alias in model_alias(home_expanded(o))]

    def compose_with(extra: list[str]) -> DictConfig:
        try:
            with initialize_config_dir(version_base=None, config_dir=str(registry.conf_dir())):
                return hydra_compose(config_name=config_name, overrides=[*overrides, *extra, *searched],
                                     return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(_not_a_setting(first, overrides) or
                             f"{first} (settings are listed by `compbench train --cfg`)") from None
        except YAMLError as e:  # a plugin's (or an edited) conf file that is not YAML
            where, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
            raise ValueError(f"{where.name if where else 'a conf file'} is not a readable YAML config "
                             f"({problem or type(e).__name__}); fix it or remove it") from None

    _check_group_choices(overrides)
    # The mode's recipe picks groups first, so that the user's keys of them (memory.beta under
    # sync=demo) exist when Hydra composes.
    cfg = compose_with(_mode_groups(overrides) if config_name == "train" else [])
    applied = _recipe_to_apply(cfg, overrides) if config_name == "train" else {}
    if applied:
        cfg = compose_with([f"{k}={v}" for k, v in applied.items()])
    # Keep which option each group took (reports and hparams use it); drop the rest of Hydra's node.
    picked = {g: cfg.hydra.runtime.choices[g] for g in GROUPS if g in cfg.hydra.runtime.choices}
    with open_dict(cfg):
        if not keep_hydra:
            del cfg["hydra"]
        cfg.choices = picked
        if config_name == "train":
            cfg.recipe = applied
    return cfg


def _user_keys(overrides: list[str]) -> set[str]:
    """The keys a user set: on the command line, or in the experiment file it names."""
    user = {o.lstrip("+~").partition("=")[0] for o in overrides}
    experiment = next((o.partition("=")[2] for o in overrides if o.startswith("experiment=")), None)
    return user | _experiment_keys(experiment) if experiment else user


def _mode_groups(overrides: list[str]) -> list[str]:
    """The group choices of the synchronization mode's recipe the user did not set, as overrides;
    the mode read from the command line or the experiment file (before anything is composed)."""
    mode = next((o.partition("=")[2] for o in overrides if o.startswith("sync=")), None)
    experiment = next((o.partition("=")[2] for o in overrides if o.startswith("experiment=")), None)
    if mode is None and experiment:
        for entry in registry.option_config("experiment", experiment).get("defaults", []):
            if isinstance(entry, dict) and "override /sync" in entry:
                mode = entry["override /sync"]
    recipe = registry.declared("sync", mode or "step").recipe
    user = _user_keys(overrides)
    return [f"{k}={v}" for k, v in recipe.items() if k in GROUPS and k not in user]


# Recipe keys that another key sets in other units: the user's choice of either replaces the recipe's
# (optim.warmup_epochs=0.1 on the command line replaces 1-bit Adam's optim.warmup_steps=300).
SAME_SETTING = {"optim.warmup_steps": {"optim.warmup_epochs"}}


def _recipe_to_apply(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """The synchronization mode's recipe, then the compressor's (compbench.compose.compat.recipe; of the
    compressor and communicator the mode's recipe picks), less every key the user set: on the
    command line, or in the experiment file (its keys and its `override /GROUP` defaults)."""
    from compbench.compose import compat

    choices = dict(cfg.hydra.runtime.choices)
    user = _user_keys(overrides)
    sync_traits = registry.declared("sync", choices["sync"])
    # a setting of a group whose option the recipe picks belongs to that option, not to another one
    # the user picked instead (sync=demo memory=none drops memory.beta; sync=onebit_adam optim=adamw
    # keeps optim.weight_decay=0); a setting of a group the recipe does not pick applies to whichever
    # option the user took
    def other_option(key: str) -> bool:
        group = key.partition(".")[0]
        picked = sync_traits.recipe.get(group)
        return picked is not None and group in user - {key} and choices[group] != picked

    applied = {k: v for k, v in sync_traits.recipe.items()
               if k not in user and not other_option(k) and not SAME_SETTING.get(k, set()) & user}
    choices.update({k: v for k, v in applied.items() if k in GROUPS})
    caps = registry.declared("compressor", choices["compressor"])
    comm_traits = registry.declared("comm", choices["comm"])
    wanted = compat.recipe(caps, comm_traits, choices["optim"], sync_traits)
    return applied | {k: v for k, v in wanted.items() if k not in user and k not in applied}


def recipe_sources(cfg: DictConfig) -> str:
    """Whose recipe `cfg.recipe` came from, for the start-up line."""
    mode = registry.declared("sync", cfg.choices["sync"])
    owners = [f"sync={cfg.choices['sync']}"] if any(k in cfg.recipe for k in mode.recipe) else []
    if any(k not in mode.recipe for k in cfg.recipe):
        owners.append(f"compressor={cfg.choices['compressor']}")
    return " and ".join(owners)


def _experiment_keys(name: str) -> set[str]:
    node = registry.option_config("experiment", name)
    keys = {k for k in node if k not in ("defaults", "sweep", "jobs")}
    for entry in node.get("defaults", []):
        for key in entry if isinstance(entry, dict) else []:
            keys.add(key.removeprefix("override ").strip("/ "))
    return keys


def check(cfg: DictConfig) -> DictConfig:
    """Validate and normalize a composed train config; returns it (ratio shorthand applied)."""
    with open_dict(cfg):  # `output_dir=3` names a folder "3": text for every reader of the config
        for key in RunSettings.path_keys():
            if is_number(cfg.get(key)):
                cfg[key] = str(cfg[key])
    check_settings(cfg)  # values, types, output folder (compbench.compose.checks)
    picked = cfg.choices
    with open_dict(cfg):
        if cfg.ratio is not None:
            check_ratio(cfg.ratio, "ratio")
            if "ratio" in cfg.compressor:
                cfg.compressor.ratio = float(cfg.ratio)
            else:
                warnings.warn(f"ratio={cfg.ratio} is ignored: compressor={picked['compressor']} has no ratio",
                              stacklevel=1)
        if "ratio" in cfg.compressor:
            check_ratio(cfg.compressor.ratio, f"compressor={picked['compressor']}")
    np = cfg.engine.get("np", 1)  # an integer >= 1 (compbench.compose.checks)
    net = cfg.net
    # `is not None`: a falsy value (0, false, [], '') is a setting to refuse, not an absent one
    keys = ("emulate_gbps", "emulate_rank_gbps", "emulate_latency_us", "emulate_rank_latency_us")
    if any(net.get(k) is not None for k in keys):
        from compbench.network.netem import check as check_shaped_link

        rank_gbps = _plain(net.get("emulate_rank_gbps"))
        rank_latency = _plain(net.get("emulate_rank_latency_us"))
        check_shaped_link(net.get("emulate_gbps"), net.get("emulate_latency_us"),  # root, ip, tc
                          rank_gbps, np, rank_latency)
        if rank_gbps is not None and cfg.engine.get("elastic"):
            raise ValueError("net.emulate_rank_gbps with engine.elastic=true: an elastic job's workers share "
                             "one namespace (a host address each), not a link each; use net.emulate_gbps, or "
                             "a cluster of your own rates (compbench cluster run --gbps 1,0.1 ...)")
        from compbench.network import delay

        impairment = delay.from_config(net)
        delay.check(impairment)
        from compbench.network.netem import check_job_links

        check_job_links(net.get("emulate_gbps"), rank_gbps, np, impairment)
        shaped = net.get("emulate_gbps") is not None or rank_gbps is not None
        if (impairment.jitter_us or impairment.loss) and not shaped:
            raise ValueError("net.emulate_jitter_us and net.emulate_loss need a shaped link: set "
                             "net.emulate_gbps (and net.emulate_latency_us for jitter)")
        if cfg.engine.get("elastic") and impairment.line:
            raise ValueError("net.emulate_latency_us with engine.elastic=true needs the kernel's netem: the "
                             "delay line runs between links of their own, and an elastic job's workers share "
                             "one namespace; drop net.emulate_latency_us (or run where netem is)")

    # Building the light components validates their parameters (e.g. qsgd levels < 1); the built
    # compressor's capabilities may follow them (randk's `scale` makes it unbiased).
    from compbench.compose import compat
    from compbench.compressors import SELECTION_KEYS
    from compbench.seam.build import build_compressor_and_selection, build_memory, build_model

    # Keys a component does not take (`+comm.foo=1`): refused here, not by a worker's TypeError.
    for group, drop, passed in (("model", (), ()), ("dataset", (), ()), ("compressor", SELECTION_KEYS, ()),
                                ("memory", (), ("world_size",)),
                                ("comm", (), ("engine", "compressor", "stats")),
                                ("scheduler", (), ()),
                                ("sync", (), ("pipeline", "scheduler", "engine", "stats")),
                                ("sharding", (), ()),
                                ("engine", ("np",), ("placement",)), ("fault", (), ())):
        registry.check_settings(cfg[group], f"{group}={picked[group]}", drop=drop, passed=passed,
                                declared=tuple(registry.option_config(group, picked[group])))
    compressor, _ = build_compressor_and_selection(cfg)
    comm_cls = registry.locate(cfg.comm._target_)
    comm_cls.check_options(**{k: v for k, v in registry.plain(cfg.comm).items() if k != "_target_"})
    sync_cls = registry.locate(cfg.sync._target_)
    sync_cls.check_options(**{k: v for k, v in registry.plain(cfg.sync).items() if k != "_target_"})
    memory = build_memory(cfg, np)
    compat.check(picked, compressor.caps, memory.traits, comm_cls.traits,
                 registry.locate(cfg.scheduler._target_).traits, registry.plain(cfg.optim),
                 sync_cls.sync_traits, registry.option_config("optim", picked["optim"]))
    _check_one_machine(picked, comm_cls.traits)
    sharding = check_sharding(cfg, sync_cls.sync_traits)
    per_epoch = _per_epoch(cfg, int(np))  # the data's size read once: the fault, warm-up and resume checks
    _check_elastic(cfg, sync_cls.sync_traits, comm_cls.traits, per_epoch)
    registry.build(cfg.scheduler)  # e.g. scheduler.groups=foo stops here, before any output exists
    _check_dataset(cfg)
    if cfg.model.get("pretrained"):
        model = build_model(cfg)  # loads the file: a missing or mismatched one fails here, not in a worker
    else:  # the model's own checks (model=gpt's heads, dropout, ...) here, not in a worker; nothing allocated
        import torch

        try:
            with torch.device("meta"):
                model = build_model(cfg)
        except (RuntimeError, TypeError, IndexError) as e:  # torch's own refusal of a shape (a width of -1)
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ValueError(f"model={picked['model']} cannot be built with these settings ({first}); check "
                             "its model.* settings (`compbench train --cfg job`)") from None
        _check_model_takes_data(cfg, model)
    sync_cls.check_model(model, **{k: v for k, v in registry.plain(cfg.sync).items() if k != "_target_"})
    if not cfg.model.get("pretrained"):  # a built model's memory is already taken
        check_fits(cfg, model, sharding)
    _check_muon_has_matrices(cfg, model)
    _check_rounds_fit(cfg, sync_cls.sync_traits)
    _check_delay_fits(cfg, sync_cls.sync_traits, per_epoch)
    _check_workers_fit(cfg, sync_cls.sync_traits, int(np))
    _check_per_worker(cfg, sync_cls.sync_traits, int(np), compressor.caps.combine, sharding.on)
    _check_independent_learners(cfg, sync_cls.sync_traits, picked["sync"])
    _check_checkpoints(cfg, sync_cls.sync_traits, picked["sync"])
    from compbench.train.checkpoint import check_resume

    # last: the checkpoint's run is compared with this one as normalized above
    check_resume(cfg, model, per_epoch)
    return cfg


def _check_rounds_fit(cfg: DictConfig, sync: SyncTraits) -> None:
    """A periodic mode whose round is longer than the run would never exchange all it holds."""
    steps = cfg.get("max_steps")
    for key in (sync.period_key, *sync.period_keys) if sync.period_key else ():
        if steps is not None and cfg.sync[key] > steps:
            raise ValueError(f"sync.{key}={cfg.sync[key]} is more than max_steps={steps}: the run would end "
                             f"before its first round does; pass sync.{key}={steps} or "
                             f"max_steps={cfg.sync[key]}")


def _check_delay_fits(cfg: DictConfig, sync: SyncTraits, per_epoch: int | None) -> None:
    """A mode that applies each outer step `delay_key` rounds late applies none in a run of no more
    rounds than that (a delay of 0 is the plain mode, and a run shorter than one round is the plain
    mode's question: their own checks apply)."""
    run = _run_steps(cfg, per_epoch)
    if not (sync.delay_key and sync.period_key and run):
        return
    key, delay, period = sync.delay_key, cfg.sync[sync.delay_key], cfg.sync[sync.period_key]
    rounds = run[0] // period
    if 0 < rounds <= delay:
        late, has = (f"{n} round{'s' if n > 1 else ''}" for n in (delay, rounds))
        raise ValueError(f"sync.{key}={delay} applies each outer step {late} late and the run has {has} of "
                         f"sync.{sync.period_key}={period} ({run[1]}): no outer step would be applied; pass "
                         f"sync.{key}={rounds - 1} or less, or a longer run")


def _check_workers_fit(cfg: DictConfig, sync: SyncTraits, np: int) -> None:
    """Settings that count workers (`SyncTraits.at_most_workers`) against engine.np (under an external
    launcher the mode checks them against the world it joins)."""
    from compbench.launch.processes import external_engine

    for key in sync.at_most_workers:
        value = cfg.sync.get(key)
        if value is not None and external_engine() is None and value > np:
            raise ValueError(f"sync.{key}={value} is more than engine.np={np} workers; pass sync.{key}<={np} "
                             f"(or sync.{key}=null: every worker)")
    for key in sync.divides_workers:
        value = cfg.sync[key]
        if external_engine() is None and np % value:
            raise ValueError(f"sync.{key}={value} does not divide engine.np={np} workers; pass a divisor "
                             f"of {np} (e.g. sync.{key}=1)")


def _check_checkpoints(cfg: DictConfig, sync: SyncTraits, name: str) -> None:
    """A mode that cannot save its state (`SyncTraits.checkpoints` false) writes and resumes none."""
    if sync.checkpoints:
        return
    for key, value, off in (("checkpoint", cfg.get("checkpoint"), False),
                            ("checkpoint_every_steps", cfg.get("checkpoint_every_steps"), 0),
                            ("resume", cfg.get("resume"), None)):
        if value not in (off, None):
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ValueError(f"{key}={shown}: sync={name} does not save its state; pass "
                             f"{key}={'null' if off is None else str(off).lower()}")


def _check_independent_learners(cfg: DictConfig, sync: SyncTraits, name: str) -> None:
    """A mode whose learners train at their own pace (`SyncTraits.learners_independent`) takes no
    setting that makes them meet mid-run in a collective: on_nonfinite=skip (an allreduce every
    step) and checkpoint_every_steps (a checkpoint gathers every rank's state)."""
    if not sync.learners_independent:
        return
    if cfg.get("on_nonfinite") == "skip":
        raise ValueError(f"on_nonfinite=skip: sync={name}'s learners train at their own pace, and skipping "
                         "a step needs every rank's agreement each step; pass on_nonfinite=raise or "
                         "on_nonfinite=ignore")
    if cfg.get("checkpoint_every_steps"):
        raise ValueError(f"checkpoint_every_steps={cfg.checkpoint_every_steps}: sync={name}'s learners train "
                         "at their own pace, and a checkpoint mid-epoch would make the fast ones wait for "
                         "the slowest; pass checkpoint_every_steps=0 (checkpoints at epoch ends)")


def _check_per_worker(cfg: DictConfig, sync: SyncTraits, np: int, combine: str, sharded: bool) -> None:
    """A set `SyncTraits.per_worker_key` (workers training unequal steps per round) against the job."""
    from compbench.launch.processes import external_engine
    from compbench.sync.per_worker_steps import check_job

    if sync.per_worker_key is not None:
        check_job(cfg.sync.get(sync.per_worker_key), np if external_engine() is None else None, combine,
                  cfg.choices["compressor"], sharded, bool(cfg.engine.get("elastic")), cfg.on_nonfinite)


def _check_one_machine(picked: dict[str, str], comm: CommTraits) -> None:
    from compbench.launch.processes import external_engine

    if comm.between_machines and external_engine() is None and picked["compressor"] != "none":
        raise ValueError(f"comm={picked['comm']} compresses only between machines and compbench's launcher "
                         f"runs every worker on this one, so compressor={picked['compressor']} would not be "
                         "used; use comm=allgather here, or start across machines (compbench cluster run, "
                         "horovodrun -H, torchrun --nnodes)")


# Square image sides tried when the data's do not fit a model, for the refusal's fix.
_IMAGE_SIDES = (32, 64, 75, 128, 224, 299)


def _check_model_takes_data(cfg: DictConfig, model: Any) -> None:
    """An image classifier (built on the meta device) takes a batch of the data set's images and
    answers one score per class of the data: one meta forward, nothing allocated. Too small an image,
    another number of channels or of classes would otherwise fail inside a worker's first step."""
    import torch

    data = cfg.dataset
    if data.get("image_size") is None or data.get("num_classes") is None:
        return  # token ids (text) or a data set that declares no image shape
    side, channels, classes = int(data.image_size), int(data.get("channels", 3)), int(data.num_classes)

    def scores(s: int) -> Any:
        with torch.device("meta"), torch.no_grad():
            return model(torch.empty(2, channels, s, s))

    arch = cfg.model.get("arch")
    name = f"model={cfg.choices['model']}" + (f" (model.arch={arch})" if arch else "")
    try:
        out = scores(side)
    except (RuntimeError, AssertionError, ValueError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        fits = next((s for s in _IMAGE_SIDES if s > side and _takes(scores, s)), None)
        sides = ", ".join(map(str, _IMAGE_SIDES))
        fix = (f"pass dataset.image_size={fits} (the smallest of {sides} it takes)" if fits is not None
               else "pass a larger dataset.image_size, or check model.in_chans and model.image_size")
        raise ValueError(f"{name} does not take the data's {channels}x{side}x{side} images ({first}); "
                         f"{fix}") from None
    out = out[0] if isinstance(out, tuple) else out  # the main head's (inception_v3's aux outputs)
    if out.shape[-1] != classes:
        raise ValueError(f"{name} answers {out.shape[-1]} classes and dataset={cfg.choices['dataset']} has "
                         f"{classes}; drop model.num_classes (it follows the data set)")


def _takes(scores: Any, side: int) -> bool:
    try:
        scores(side)
    except (RuntimeError, AssertionError, ValueError, IndexError):
        return False
    return True


def _check_muon_has_matrices(cfg: DictConfig, model: Any) -> None:
    """optim=muon steps the hidden weight matrices; a model without one would train on AdamW alone."""
    from compbench.optim.muon import matrices

    if cfg.optim.get("name") == "muon" and not matrices(model):
        raise ValueError(f"optim=muon steps hidden nn.Linear matrices and model={cfg.choices['model']} has "
                         "none (convolutions, embeddings and the output layer stay on AdamW), so every "
                         "parameter would take AdamW; use optim=adamw")


def _warn_long_warmup(cfg: DictConfig, per_epoch: int | None, run_steps: tuple[int, str] | None) -> None:
    """A warm-up that outlasts the run is legal and does nothing useful (the learning rate never
    reaches its setting): a warning, once, naming the keys."""
    optim = cfg.optim
    if run_steps is None:
        return
    if optim.get("warmup_steps"):
        warm, key = int(optim.warmup_steps), f"optim.warmup_steps={optim.warmup_steps}"
    elif optim.get("warmup_epochs"):
        if per_epoch is None:
            return
        warm = int(optim.warmup_epochs * per_epoch)
        key = f"optim.warmup_epochs={optim.warmup_epochs}"
    else:
        return
    if warm > run_steps[0]:
        warnings.warn(f"{key} warms up over {warm} steps and the run ends at step {run_steps[0]} "
                      f"({run_steps[1]}): the learning rate never reaches optim.lr", stacklevel=1)


def _per_epoch(cfg: DictConfig, np: int) -> int | None:
    """Full batches per epoch on each of `np` workers, None where the data's size is only known to
    the workers (ImageNet)."""
    size_of = importlib.import_module(cfg.dataset._target_.rsplit(".", 1)[0]).train_size_of
    n = size_of(**registry.plain(cfg.dataset))
    return None if n is None else n // np // cfg.batch_size


def _run_steps(cfg: DictConfig, per_epoch: int | None) -> tuple[int, str] | None:
    """How many steps the run takes and what bounds it (`max_steps=N`, or `epochs=E` of the data's
    `per_epoch` full batches), None where the data's size is only known to the workers (ImageNet)."""
    steps = cfg.get("max_steps")
    if per_epoch is not None:
        if steps is None or cfg.epochs * per_epoch < steps:
            return cfg.epochs * per_epoch, f"epochs={cfg.epochs} of {per_epoch} steps"
    return (steps, f"max_steps={steps}") if steps is not None else None


def _check_elastic(cfg: DictConfig, sync: SyncTraits, comm: CommTraits, per_epoch: int | None) -> None:
    """engine.elastic and the fault group, against the job (`per_epoch`: its data's full batches per
    epoch and worker) and what its parts declare."""
    from compbench.launch.processes import external_engine
    from compbench.network.netem import can_shape

    elastic = bool(cfg.engine.get("elastic"))
    np = int(cfg.engine.get("np", 1))
    external = external_engine() is not None
    faults = registry.build(cfg.fault)
    run_steps = _run_steps(cfg, per_epoch)
    faults.check(np, elastic, run_steps, cfg.choices["engine"])
    _warn_long_warmup(cfg, per_epoch, run_steps)
    if faults.rejoins and external:
        raise ValueError("fault.rejoin_after_s/_steps: under horovodrun or torchrun you start the worker "
                         "that joins (your host discovery script, another torchrun agent); drop the setting")
    if not elastic:
        if int(cfg.engine.get("min_np", 1)) != 1:
            raise ValueError(f"engine.min_np={cfg.engine.min_np} is the fewest workers an elastic job goes "
                             "on with, and this job is not elastic (a failed worker stops it); add "
                             "engine.elastic=true or drop engine.min_np")
        return
    picked = cfg.choices
    if not sync.elastic:
        raise ValueError(f"sync={picked['sync']} keeps state its engine fixed at start and cannot change its "
                         "number of workers; use sync=step (compbench's pipeline) with engine.elastic=true")
    if not comm.elastic:
        raise ValueError(f"comm={picked['comm']} keeps per-rank state cut for the workers it started with; "
                         "use comm=allgather or comm=allreduce with engine.elastic=true")
    if external and not cfg.output_dir:
        raise ValueError("engine.elastic=true under horovodrun or torchrun: pass output_dir=DIR (a worker "
                         "that joins later must find the run's folder without asking the others)")
    min_np = int(cfg.engine.min_np)
    if not external and min_np > np:
        raise ValueError(f"engine.min_np={min_np} is more than engine.np={np}; pass engine.min_np<={np}")
    if not external and not can_shape():
        raise ValueError("engine.elastic=true on one machine gives each worker its own address in a private "
                         "network namespace (Horovod Elastic and TorchElastic tell workers apart by host), "
                         "which needs root; run as root, or start across machines (compbench cluster run -- "
                         "horovodrun or torchrun ...)")


def _check_dataset(cfg: DictConfig) -> None:
    check_root = importlib.import_module(cfg.dataset._target_.rsplit(".", 1)[0]).check_root
    # The hook names what it needs (root, num_classes, name, ...): those keys of the dataset's config.
    kwargs: dict[str, Any] = {k: cfg.dataset.get(k) for k in inspect.signature(check_root).parameters
                              if k in cfg.dataset or k == "root"}
    check_root(**kwargs)


def _plain(value: Any) -> Any:
    """A list setting as Python (a ListConfig as a list); anything else as it is, for its check."""
    return OmegaConf.to_object(value) if OmegaConf.is_config(value) else value


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)
