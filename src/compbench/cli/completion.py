"""Shell completion: `eval "$(compbench completion bash)"` (zsh: after `autoload -U +X bashcompinit &&
bashcompinit`). The shell function asks `compbench _complete WORD...` (the command line's words
after `compbench`, the last one the word being completed) for candidates, read from the registry:
subcommands; for train, the config groups (`compressor=`), their options (`compressor=dgc`), the
settings of the option picked on the line or by default (`compressor.ratio=`), the top-level
settings (`max_steps=`) and the flags; for the other subcommands, their flags.

Hydra's own completion (`-sc install=bash`) belongs to its app runner, which compbench does not use
(it composes configs with Hydra's compose API): this is its equivalent for compbench's commands.
"""

from __future__ import annotations

from compbench.catalog import registry

BASH = """# compbench completion (bash; zsh: autoload -U +X bashcompinit && bashcompinit first)
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
_compbench_complete() {
    local IFS=$'\\n'
    COMPREPLY=($(compbench _complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
}
complete -o nospace -o default -F _compbench_complete compbench
"""

SUBCOMMANDS = ("train", "list", "launch", "bench", "gen", "plan", "report", "claims", "race", "cluster",
               "clean", "completion")
FLAGS = {"train": ("-m", "--cfg", "--info", "--help"),
         "claims": ("--suite", "--quick", "--out", "--only", "--seeds"),
         "race": ("--suite", "--quick", "--out", "--only", "--links", "--seeds", "--workers", "--per-node",
                  "--memory-gb", "--params"),
         "report": ("--fit", "--per-node", "--latency-us"), "completion": ("bash", "zsh")}


def script(shell: str) -> str:
    if shell not in ("bash", "zsh"):
        raise ValueError(f"compbench completion {shell}: use bash (or zsh, through bashcompinit)")
    return BASH


def candidates(words: list[str]) -> list[str]:
    """Completions of the last of `words` (the words after `compbench`)."""
    if len(words) <= 1:
        return [c for c in SUBCOMMANDS if c.startswith(words[0] if words else "")]
    command, current = words[0], words[-1]
    if command != "train":
        return [f for f in FLAGS.get(command, ()) if f.startswith(current)]
    return [c for c in _train(words[1:-1], current) if c.startswith(current)]


def _train(before: list[str], current: str) -> list[str]:
    from compbench.compose.config import PLUGIN_GROUPS

    key, eq, _ = current.partition("=")
    if eq and key in PLUGIN_GROUPS:  # compressor=dg -> compressor=dgc
        return [f"{key}={o}" for o in registry.options(key)]
    group, dot, _ = key.partition(".")
    if dot and not eq and group in PLUGIN_GROUPS:  # compressor.ra -> compressor.ratio=
        option = _picked(group, before)
        return [] if option is None else [f"{group}.{k}=" for k in registry.option_config(group, option)
                                          if k != "_target_"]
    top = [k for k in registry.train_config() if k != "defaults"]
    return [*(f"{g}=" for g in PLUGIN_GROUPS), *(f"{g}." for g in PLUGIN_GROUPS),
            *(f"{k}=" for k in top), *FLAGS["train"]]


def _picked(group: str, before: list[str]) -> str | None:
    """The option of `group` named on the line, else the default of conf/train.yaml."""
    for word in reversed(before):
        key, eq, value = word.partition("=")
        if eq and key.lstrip("+~") == group:
            return value if value in registry.options(group) else None
    defaults = registry.train_config().get("defaults", [])
    for entry in defaults:
        if isinstance(entry, dict) and group in entry:
            return entry[group]
    return None
