"""Every documented command runs as written: each `compbench` command of README.md and docs/**/*.md is
read from its code block and checked in-process, up to where it would start work (nothing trains,
measures or is written).

Which lines are commands: the shell lines (a trailing `\\` joins the next one) of the ```bash, ```sh
and unlabelled code blocks whose first word, after `VAR=value` assignments, is `compbench`,
`horovodrun` or `torchrun`, and `eval "$(compbench ...)"`. ```text blocks are transcripts (a command
and what it printed) and are left out, as is every other language.

What each subcommand must do:
- train: its flags parse; its overrides compose and pass the config check (compbench.compose.config),
  every job of a sweep (-m) too, and a launcher plugin's settings theirs; without a warning.
- bench, plan: the overrides compose and pass the subcommand's checks, up to where it measures.
- claims, race: the flags pass the subcommand's checks, and its first run passes the config check.
- cluster: the flags pass its checks; `cluster run -- COMMAND`: the command too.
- horovodrun, torchrun (and `cluster run` of them): the `compbench train` they start passes the check
  as their worker does (the launcher's engine set).
- gen, list, completion: run (they only print); report, clean, launch: their arguments parse.

What cannot be checked here, by rule:
- a placeholder (a `...` word, a word in capitals such as RUN_DIR, DIR, DATE/TIME or HOST, a `<name>`,
  a path under `~/`): the overrides compose only (a `...` word is left out);
- what this machine lacks: root with ip and tc (net.emulate_*, engine.elastic=true, nice below 0,
  bench's shaped links), a CUDA GPU (device=cuda), the data of a data set that is not installed
  (Fashion-MNIST, the Shakespeare corpus): compose only; a tracking server (`mlflow.uri=http...`) is
  not asked whether it answers; a launcher plugin's program (SLURM's sbatch) is not looked for;
- a tutorial's own plugin: a command naming an option compbench does not have, on a page that writes
  it (`conf/GROUP/NAME.yaml`), is left out;
- a command whose comment says `refused` must be refused by the check.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from compbench.base.args import ArgumentParser
from compbench.catalog import registry
from compbench.compose import config

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted(ROOT.joinpath("docs").rglob("*.md"))]
SHELL_BLOCKS = ("bash", "sh", "shell", "")
# A placeholder the reader fills in: `...`, RUN_DIR, DIR, DATE/TIME, HOST:29400, <dir>, ~/texts.
PLACEHOLDER = re.compile(r"\.\.\.|(?<![A-Za-z0-9_])[A-Z][A-Z_]{2,}(?![a-z0-9_])|<[a-z_]+>|(^|=)~/")
ROOT_KEYS = ("net.emulate_", "engine.elastic=true")
# Warnings about this machine, not about the command: more workers than its cores, fewer GPUs, no CuPy.
MACHINE_WARNINGS = re.compile(r"workers share \d+ cores|^device=auto: \d+ GPUs? for|^device=cuda without "
                              r"CuPy")


@dataclass
class Command:
    """One documented command: its words (comment and `VAR=value` prefix removed), where it is."""

    words: list[str]
    comment: str
    where: list[str] = field(default_factory=list)
    pages: set[Path] = field(default_factory=set)

    @property
    def text(self) -> str:
        return " ".join(self.words)


def _split_comment(line: str) -> tuple[str, str]:
    """The shell line and its `# comment` (a `#` that starts a word outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:].strip()
    return line, ""


def _shell_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, line with its continuations joined) of the page's shell code blocks."""
    out: list[tuple[int, str]] = []
    language: str | None = None
    pending, start = "", 0
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            language = stripped[3:].strip() if language is None else None
            pending = ""
            continue
        if language not in SHELL_BLOCKS:
            continue
        if not pending:
            start = number
        pending += (" " if pending else "") + stripped
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        out.append((start, pending))
        pending = ""
    return out


def _words(line: str) -> tuple[list[str], str] | None:
    """The command's words (from `compbench`, `horovodrun` or `torchrun`) and its comment, or None for a
    line that is not a compbench command."""
    code, comment = _split_comment(line)
    try:
        words = shlex.split(code)
    except ValueError:  # unbalanced quotes: a command the shell cannot run, if it is one
        words = code.split()
        comment = "# the shell cannot split it (unbalanced quotes)"
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words[:1] == ["eval"] and len(words) == 2 and words[1].startswith("$(compbench "):
        words = shlex.split(words[1][2:-1])
    if words[:1] == ["torchrun"] or words[:1] == ["horovodrun"]:
        return (words, comment) if "compbench" in words else None
    return (words, comment) if len(words) > 1 and words[0] == "compbench" else None


def documented_commands() -> list[Command]:
    """Every documented command once (the same text on several pages is one command)."""
    found: dict[str, Command] = {}
    for page in PAGES:
        for number, line in _shell_lines(page):
            parsed = _words(line)
            if parsed is None:
                continue
            words, comment = parsed
            command = found.setdefault(" ".join(words), Command(words, comment))
            command.where.append(f"{page.relative_to(ROOT)}:{number}")
            command.pages.add(page)
    return list(found.values())


COMMANDS = documented_commands()


class Stop(Exception):
    """Raised where a subcommand would start its work: everything before it passed."""

    def __init__(self, value: Any = None) -> None:
        super().__init__()
        self.value = value


# -- what this machine has ---------------------------------------------------------------------------

def _can_shape() -> bool:
    from compbench.network.netem import can_shape

    return can_shape()


def _gpu() -> bool:
    from compbench.engines.device import visible_gpus

    return visible_gpus() > 0


_DATA: dict[str, bool] = {}


def _data_here(dataset: str) -> bool:
    """Whether data set `dataset`'s data is installed here: its check passes at its default settings."""
    if dataset not in _DATA:
        cfg = config.compose([f"dataset={dataset}"])
        try:
            config._check_dataset(cfg)
            _DATA[dataset] = True
        except ValueError:
            _DATA[dataset] = False
    return _DATA[dataset]


def _lacking(cfg: Any, overrides: list[str]) -> str | None:
    """What of this machine the run needs and it lacks (None: nothing, it can be checked)."""
    root = any(o.startswith(ROOT_KEYS) for o in overrides) or bool(cfg.engine.get("elastic"))
    nice = cfg.get("nice")
    if (root or (nice is not None and int(nice) < 0)) and not _can_shape():
        return "root with ip and tc"
    if cfg.device == "cuda" and not _gpu():
        return "a CUDA GPU"
    if not _data_here(cfg.choices["dataset"]):
        return f"dataset={cfg.choices['dataset']}'s data"
    return None


def _placeholders(words: list[str]) -> bool:
    return any(PLACEHOLDER.search(w) for w in words)


# -- the checks ------------------------------------------------------------------------------------

def check_train_job(overrides: list[str], notes: list[str]) -> None:
    """One run's overrides: compose, then the config check unless a placeholder or this machine's lack
    stops it (said in `notes`); a warning fails it."""
    given = [o for o in overrides if o != "..."]
    cfg = config.compose(given)
    if _placeholders(overrides):
        notes.append(f"composed only (a placeholder): {' '.join(overrides)}")
        return
    lacking = _lacking(cfg, given)
    if lacking is not None:
        notes.append(f"composed only (this machine lacks {lacking}): {' '.join(overrides)}")
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.check(cfg)
    said = [str(w.message) for w in caught if not MACHINE_WARNINGS.search(str(w.message))]
    assert not said, f"compbench train {' '.join(overrides)} warns: {said}"


def check_train(argv: list[str], notes: list[str]) -> None:
    from compbench.cli.commands import _hydra_flags, _train_parser, hydra_dirs
    from compbench.cli.sweep import plan_jobs
    from compbench.cli.sweep_launcher import chosen, prepare

    args = _train_parser().parse_intermixed_args(_hydra_flags(argv))
    if args.help is not None:
        return  # `--help [GROUP]`: the group is one of the parser's choices
    overrides, _, launcher = hydra_dirs(args.overrides, args.multirun)
    if args.multirun:
        from compbench.cli import launcher_settings

        needs = launcher_settings.NEEDS.get(chosen(launcher))
        if needs is not None and shutil.which(needs[0]) is None:
            notes.append(f"{needs[0]} not looked for")
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(launcher_settings, "NEEDS", {})
                prepare(launcher)
        else:
            prepare(launcher)
        jobs = plan_jobs([o for o in overrides if o != "..."])
        assert len({tuple(j) for j in jobs}) == len(jobs), f"the sweep has identical jobs: {jobs}"
    else:
        jobs = [overrides]
    seen: set[tuple[str, ...]] = set()
    for job in jobs:  # jobs that differ only by their seed are checked once
        unseeded = tuple(o for o in job if not o.startswith("seed="))
        if unseeded not in seen:
            seen.add(unseeded)
            check_train_job(job, notes)


def _flag(words: list[str], *names: str) -> str | None:
    """The value of the first of flags `names` (`--flag V` or `--flag=V`) among a launcher's words."""
    for i, word in enumerate(words):
        key, eq, value = word.partition("=")
        if key in names:
            return value if eq else words[i + 1]
    return None


def check_launched(words: list[str], notes: list[str], mp: pytest.MonkeyPatch) -> None:
    """`horovodrun ... compbench train ...` or `torchrun ... -m compbench train ...`: the check of rank 0,
    with the job's layout in the environment as the launcher sets it."""
    at = words.index("compbench")
    outer, inner = words[:at], words[at + 1:]
    if words[0] == "horovodrun":
        size = int(_flag(outer, "-np") or 1)
        hosts = _flag(outer, "-H")
        local = int(hosts.split(",")[0].partition(":")[2] or 1) if hosts else size
        for key, value in (("HOROVOD_RANK", 0), ("HOROVOD_SIZE", size), ("HOROVOD_LOCAL_SIZE", local)):
            mp.setenv(key, str(value))
    else:
        nodes = int((_flag(outer, "--nnodes") or "1").rpartition(":")[2])
        local = int(_flag(outer, "--nproc-per-node", "--nproc_per_node") or 1)
        for key, value in (("RANK", 0), ("WORLD_SIZE", nodes * local), ("LOCAL_WORLD_SIZE", local)):
            mp.setenv(key, str(value))
    assert inner[:1] == ["train"], f"{words[0]} starts `compbench {' '.join(inner)}`, not compbench train"
    check_train(inner[1:], notes)


def _stop_after_parse(mp: pytest.MonkeyPatch) -> None:
    """compbench's argument parsers stop (Stop, with the namespace) once their arguments parsed."""
    def parse(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        raise Stop(argparse.ArgumentParser.parse_args(self, args, namespace))
    mp.setattr(ArgumentParser, "parse_args", parse)


class Answer:
    """A tracking server's connection, as the config check opens and closes it."""

    def close(self) -> None:
        pass


def _stop(*args: Any, **kwargs: Any) -> None:
    raise Stop()


def _stop_at_first_job(jobs: list[tuple[Path, list[str]]], scratch: Path) -> None:
    """claims' and race's matrix check: stop with the first job's overrides."""
    raise Stop(jobs[0][1])


def _until_stop(main: Any, argv: list[str]) -> Any:
    try:
        main(argv)
    except Stop as stop:
        return stop.value
    raise AssertionError("the subcommand went past the point where it starts work")


def check_command(command: Command, mp: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> list[str]:
    """The checks of the module's docstring for one command; what could not be checked, as notes."""
    words, notes = command.words, []
    if words[0] in ("horovodrun", "torchrun"):
        check_launched(words, notes, mp)
        return notes
    sub, argv = words[1], words[2:]
    if any(re.match(r"\+?mlflow\.uri=https?://", w) for w in argv):  # the server is not asked
        import socket

        notes.append("the tracking server was not asked")
        mp.setattr(socket, "create_connection", lambda *args, **kwargs: Answer())
    if sub == "train":
        check_train(argv, notes)
    elif sub in ("claims", "race"):
        import compbench.claims.runner
        import compbench.race.main

        module = compbench.claims.runner if sub == "claims" else compbench.race.main
        mp.setattr(module, "check_jobs", _stop_at_first_job)
        check_train_job(_until_stop(module.main, argv), notes)
    elif sub == "bench":
        from compbench.bench import e2e
        from compbench.bench import main as bench

        cfg = config.compose(argv, config_name="bench")
        if cfg.mode == "e2e" and "shaped" in cfg.e2e.links and not _can_shape():
            notes.append("composed only (this machine lacks root with ip and tc)")
            return notes
        mp.setattr(bench, "measure", _stop)
        mp.setattr(e2e, "run", _stop)
        _until_stop(bench.main, argv)
    elif sub == "plan":
        from compbench.plan import main as plan

        mp.setattr(plan, "fit_primitives", _stop)
        mp.setattr(plan, "_probe_engine", _stop)
        _until_stop(plan.main, argv)
    elif sub == "cluster":
        from compbench.cluster import main as cluster

        args = cluster._parser().parse_args(argv)
        mp.setattr(cluster, "has_tun", lambda: True)
        mp.setattr(cluster.nodes, "check_machine", _stop)
        _until_stop(cluster.main, argv)
        if args.action == "run":
            inner = args.command[1:] if args.command[:1] == ["--"] else args.command
            assert inner, "compbench cluster run needs a command after --"
            check_launched(inner, notes, mp)
    elif sub in ("gen", "list", "completion"):
        from compbench.cli.commands import run_command

        mp.setattr(warnings, "formatwarning", warnings.formatwarning)  # the CLI sets its own: undone after
        assert run_command(words[1:]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out
    elif sub in ("report", "clean", "launch"):
        import importlib

        from compbench.cli.commands import _DELEGATED

        module, _, func = _DELEGATED[sub].partition(":")
        _stop_after_parse(mp)
        _until_stop(getattr(importlib.import_module(module), func), argv)
    else:
        raise AssertionError(f"compbench {sub} is not a subcommand")
    return notes


def _tutorial_option(command: Command) -> str | None:
    """An option the command names that compbench does not have and its page writes (a tutorial)."""
    for word in command.words:
        group, sep, option = word.partition("=")
        if sep and group in config.GROUPS and option not in registry.options(group):
            if any(f"conf/{group}/{option}.yaml" in p.read_text() for p in command.pages):
                return f"{group}={option}"
    return None


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where[0] for c in COMMANDS])
def test_documented_command_runs_as_written(command, monkeypatch, capsys, tmp_path):
    plugin = _tutorial_option(command)
    if plugin is not None:
        pytest.skip(f"{plugin} is the option its tutorial writes")
    monkeypatch.chdir(tmp_path)  # relative output folders land here, if anything wrote one
    assert not command.comment.startswith("# the shell cannot split it"), command.comment
    if "refused" in command.comment:
        with pytest.raises(ValueError):
            check_command(command, monkeypatch, capsys)
        return
    try:
        notes = check_command(command, monkeypatch, capsys)
    except ValueError as e:
        pytest.fail(f"{' and '.join(command.where)}: `{command.text}` fails: {e}")
    print("\n".join(notes))  # what was not checked here, and why (pytest -rP shows it)


def test_the_commands_are_found():
    """The extraction finds the pages' commands: the README's first, a launcher's, a continued line's."""
    texts = {c.text for c in COMMANDS}
    assert "compbench train compressor=fp16" in texts
    assert any(t.startswith("torchrun ") for t in texts)
    assert any("optim.clip_grad_norm=1.0 batch_size=8" in t for t in texts)  # joined after its `\`
    assert len(COMMANDS) > 100
