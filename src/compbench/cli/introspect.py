"""What `compbench train --cfg/--info/--help` and `compbench list` print: the composed config, how it
was composed (search path, defaults list, groups) and the options of each config group.

compbench composes with Hydra's compose API (no @hydra.main), so these mirror Hydra's own flags:
`--cfg job|hydra|all` (bare `--cfg`: job), `--info [all|config|defaults|searchpath]` and a help
page per config group (`compbench train --help GROUP`).
"""

from __future__ import annotations

from collections.abc import Iterator

from omegaconf import OmegaConf, open_dict

from compbench.catalog import registry
from compbench.compose import config

CFG_PARTS = ("job", "hydra", "all")
INFO_PARTS = ("all", "config", "defaults", "searchpath")


def cfg_text(overrides: list[str], part: str) -> str:
    """`--cfg PART`: the checked job config (job), Hydra's own node (hydra), or both (all)."""
    cfg = config.compose(overrides, keep_hydra=part != "job")
    hydra = None
    if part != "job":
        with open_dict(cfg):
            hydra = cfg.pop("hydra")
    text = config.to_yaml(config.check(cfg)) if part in ("job", "all") else ""
    return text + (OmegaConf.to_yaml({"hydra": hydra}) if hydra is not None else "")


def print_info(overrides: list[str], part: str) -> None:
    """`--info PART`: Hydra's search path, the defaults list (with where each choice came from),
    the config groups, and (config, all) the composed config."""
    import hydra

    cfg = config.compose(overrides, keep_hydra=True)
    with open_dict(cfg):
        node = cfg.pop("hydra")
    if part in ("all", "searchpath"):
        print(f"Config search path (Hydra {hydra.__version__} compose API, config train.yaml):")
        plugins = {str(path): origin for origin, path in registry.conf_sources()[1:]}
        for source in node.runtime.config_sources:
            if source.schema != "structured":
                provider = f"plugin ({plugins[source.path]})" if source.path in plugins else source.provider
                print(f"  {provider:<6} {source.schema}://{source.path}")
    if part in ("all", "defaults"):
        print("Defaults list (GROUP=OPTION to choose another; `compbench train --help GROUP` lists them):")
        given = {o.lstrip("+~").partition("=")[0] for o in overrides}
        for group in (*config.GROUPS, "experiment"):
            choice = node.runtime.choices.get(group)
            origin = ("command line" if group in given else
                      f"compressor={cfg.choices['compressor']}'s recipe" if group in cfg.recipe else
                      "default")
            print(f"  {group:<11} {choice if choice is not None else 'null':<14} ({origin})")
    if part == "all":
        print("Config groups:")
        for group in (*config.GROUPS, "experiment"):
            print(f"  {group:<11} {', '.join(registry.options(group))}")
    if part in ("all", "config"):
        print("Composed config (not yet checked; `--cfg` checks it):")
        print(config.to_yaml(cfg), end="")


def help_text(usage: str) -> str:
    """`compbench train --help`: flags, the groups with their default and options, the settings."""
    picked = config.compose([]).choices
    lines = [usage, "",
             "Train one run; with -m, every combination of the sweep's values (one job after another).",
             "",
             "flags:",
             "  -m, --multirun        sweep: a,b,c  range(START,STOP[,STEP])  choice(a,b)  glob(PATTERN)",
             "                        (a group's options, e.g. compressor=glob(*) or glob(d*,exclude=dgc));",
             "                        interval(a,b) needs a sampling sweeper and is refused",
             "  --cfg [job|hydra|all] print the checked config (bare: job), Hydra's node, or both; exit",
             "  --info [all|config|defaults|searchpath]",
             "                        how the config is composed: search path, defaults list, groups; exit",
             "  -h, --help [GROUP]    this help, or the options of one config group with their settings",
             "",
             "config groups (GROUP=OPTION):"]
    for group in config.GROUPS:
        lines.append(f"  {group:<11} {picked[group]:<14} of: {', '.join(registry.options(group))}")
    lines.append(f"  {'experiment':<11} {'null':<14} of: {', '.join(registry.options('experiment'))}")
    lines += ["", "settings (key=value; conf/train.yaml, defaults shown):"]
    text = (registry.conf_dir() / "train.yaml").read_text().splitlines()
    body = [ln for ln in text[text.index("  - optional experiment: null   # conf/experiment/NAME.yaml: "
                                          "settings and sweeps (experiment=NAME)") + 1:] if ln.strip()]
    lines += [f"  {ln}" for ln in body]
    lines += ["", "a group's own settings: GROUP.KEY=VALUE (e.g. compressor.ratio=0.01, engine.np=2); "
              "`compbench train --help GROUP` lists them"]
    return "\n".join(lines)


def group_help(group: str) -> str:
    """`compbench train --help GROUP`: the group's default option and every option's settings."""
    default = config.compose([]).choices.get(group, "null")
    return f"{group} (default {default}; choose with {group}=OPTION, set with {group}.KEY=VALUE):\n" + \
        options_text([group]).split("\n", 1)[1]


def options_text(groups: list[str]) -> str:
    return "\n".join(option_lines(groups))


def option_lines(groups: list[str]) -> Iterator[str]:
    """`compbench list [GROUP ...]`: each group's options, their one-line description and settings;
    a plugin's option is marked with its origin ([package DIST] or [COMPBENCH_CONF_PATH]). Every
    group is checked before the first line; the lines come as each option file is read, so a reader
    that stops early (`compbench list | head`) closes the pipe on a writer still writing."""
    registry.check_sources(config.PLUGIN_GROUPS)  # a plugin that shadows an option: refused here too
    picked = []
    for group in groups or config.GROUPS:
        if group.removesuffix("s") in config.GROUPS:  # "compressors" too
            group = group.removesuffix("s")
        if group not in config.GROUPS:
            raise ValueError(f"unknown group {group}; choose one of: {', '.join(config.GROUPS)}")
        picked.append(group)
    for group in picked:
        yield f"{group}:"
        for name, (origin, path) in sorted(registry.option_paths(group).items()):
            first = (path.read_text().splitlines() or [""])[0]
            about = first.lstrip("# ").strip() if first.startswith("#") else ""
            if origin != "compbench":  # a plugin's option: say whose it is
                about = f"[{origin}] {about}".strip()
            params = {k: v for k, v in registry.option_config(group, name).items()
                      if k not in ("_target_", "name")}
            shown = ", ".join(f"{k}={v}" for k, v in params.items() if "${" not in str(v))
            yield f"  {name:<12} {about}"
            if shown:
                yield f"  {'':<12} {shown}"
