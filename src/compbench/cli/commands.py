"""`compbench SUBCOMMAND [overrides]`: parse, compose the config once, hand plain objects on.

  compbench train [-m] [--cfg [job|hydra|all]] [--info] [--help [GROUP]] key=value ...
                                                train (one run, or a multirun sweep with -m: a,b
                                                range(1,4) choice(a,b) glob(*)); `compbench train
                                                --help` for the flags, `--help GROUP` for a group
  compbench list [GROUP]                        options of every config group, with parameters
  compbench launch -np N [--engine E] SCRIPT    run a script of yours as N ranks (wrap_compress_optimizer)
  compbench bench key=value ...                 encode/decode micro-benchmark of compressors
  compbench gen SPEC [--target torch|cpu|cuda]  the code generated from a CompLL spec (compll/specs/)
  compbench plan key=value ...                  SeCoPa compression plan for a model and cluster
  compbench report DIR [--fit F] [--per-node L] tables, plots and what-if scaling of a run or sweep
  compbench claims [--suite NAME] [--quick]     published findings re-run as experiments, with a verdict each
  compbench race [--suite NAME] [--quick]       which method reaches a target first over which link
  compbench cluster up|down|status|run          K emulated machines (namespaces, shaped links, sshd)
  compbench clean                               remove what killed runs left (namespaces, /tmp folders)
  compbench completion bash                     shell completion: eval "$(compbench completion bash)"
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from compbench.base.args import ArgumentParser
from compbench.base.errors import report_user_error
from compbench.cli.run import train

_COMMANDS = ("train", "list", "launch", "bench", "gen", "plan", "report", "claims", "race", "cluster",
             "clean", "completion", "_complete")
_USAGE = ("usage: compbench {train,list,launch,bench,gen,plan,report,claims,race,cluster,clean,completion} "
          "[-m] [--cfg] [key=value ...]  (compbench --help)")
# Subcommands with their own argument handling: module with `main(argv) -> int`.
_DELEGATED = {"launch": "compbench.cli.commands:launch", "bench": "compbench.bench.main:main",
              "gen": "compbench.compll.main:main",
              "plan": "compbench.plan.main:main", "report": "compbench.report.main:main",
              "claims": "compbench.claims.runner:main", "race": "compbench.race.main:main",
              "cluster": "compbench.cluster.main:main", "clean": "compbench.cli.clean:main"}


def run_command(argv: list[str]) -> int:
    """`compbench ARGV`: its exit code (compbench.cli.main.main guards it against Ctrl-C and closed pipes)."""
    if argv and argv[0] in _DELEGATED:
        import importlib

        module, _, func = _DELEGATED[argv[0]].partition(":")
        with report_user_error():
            return getattr(importlib.import_module(module), func)(argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        parser = argparse.ArgumentParser(prog="compbench", description=__doc__,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.print_help()
        return 0
    if not argv or argv[0] not in _COMMANDS:
        print(f"error: unknown command {argv[0]!r}; {_USAGE}" if argv else _USAGE, file=sys.stderr)
        return 2
    warnings.formatwarning = lambda msg, cat, *_: f"warning: {msg}\n"
    if argv[0] == "_complete":  # the shell's question: candidates, one a line, never an error
        from compbench.cli.completion import candidates

        try:
            print("\n".join(candidates(argv[1:] or [""])))
        except Exception:  # noqa: BLE001 - a completion that fails offers nothing
            pass
        return 0
    with report_user_error():
        if argv[0] == "completion":
            from compbench.cli.completion import script

            print(script(argv[1] if len(argv) > 1 else "bash"), end="")
            return 0
        if argv[0] == "list":
            parser = ArgumentParser(prog="compbench list", description="options of every config group")
            parser.add_argument("groups", nargs="*", help="config groups (default: all)")
            from compbench.cli.introspect import option_lines

            for line in option_lines(parser.parse_args(argv[1:]).groups):
                print(line)
            return 0
        args = _train_parser().parse_intermixed_args(_hydra_flags(argv[1:]))  # `-m` may sit between
        if args.help is not None or args.cfg or args.info:
            return _describe(args)
        overrides, sweep_dir, launcher = hydra_dirs(args.overrides, args.multirun)
        if args.multirun:
            from compbench.cli.sweep import run_sweep

            code = run_sweep(overrides, sweep_dir, launcher)
        else:
            code = train(overrides)
    from compbench.launch.processes import external_engine

    if external_engine() is not None:
        from compbench.train.worker import exit_now

        exit_now(code)  # a finished worker of horovodrun/torchrun: skip finalization (see exit_now)
    return code


_TRAIN_USAGE = ("usage: compbench train [-m] [--cfg [job|hydra|all]] "
                "[--info [all|config|defaults|searchpath]] [--help [GROUP]] [key=value ...]")


def _train_parser() -> ArgumentParser:
    from compbench.cli.introspect import CFG_PARTS, INFO_PARTS

    parser = ArgumentParser(prog="compbench train", usage=_TRAIN_USAGE.removeprefix("usage: "),
                            add_help=False)
    parser.add_argument("-m", "--multirun", action="store_true")
    parser.add_argument("--cfg", choices=CFG_PARTS)
    parser.add_argument("--info", choices=INFO_PARTS)
    parser.add_argument("--help", choices=_help_topics())
    parser.add_argument("overrides", nargs="*")
    return parser


def _help_topics() -> tuple[str, ...]:
    from compbench.compose.config import GROUPS

    return ("", *GROUPS)


def _hydra_flags(argv: list[str]) -> list[str]:
    """Hydra's flags with their optional word joined to them, so that argparse never takes an
    override for it: `--cfg` (job) / `--cfg hydra`, `-c all`, `--info` (all) / `--info defaults`,
    `--help` / `-h` / `--help GROUP` / `GROUP --help`."""
    from compbench.cli.introspect import CFG_PARTS, INFO_PARTS

    flags = {"--cfg": ("--cfg", CFG_PARTS, "job"), "-c": ("--cfg", CFG_PARTS, "job"),
             "--info": ("--info", INFO_PARTS, "all"), "--help": ("--help", _help_topics(), ""),
             "-h": ("--help", _help_topics(), "")}
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = flags.get(argv[i])
        if flag is None:
            out.append(argv[i])
            i += 1
            continue
        name, words, bare = flag
        word = argv[i + 1] if i + 1 < len(argv) else None
        if word in words and word:
            out.append(f"{name}={word}")
            i += 2
            continue
        if name == "--help" and out and out[-1] in words:  # `compbench train compressor --help`
            bare = out.pop()
        out.append(f"{name}={bare}")
        i += 1
    return out


def _describe(args: argparse.Namespace) -> int:
    """--help [GROUP], --info, --cfg: print and exit (nothing runs, nothing is written)."""
    from compbench.cli import introspect

    if args.help is not None:
        print(introspect.group_help(args.help) if args.help else introspect.help_text(_TRAIN_USAGE))
        return 0
    overrides, _, _ = hydra_dirs(args.overrides, args.multirun)
    if args.info:
        introspect.print_info(overrides, args.info)
        return 0
    if not args.multirun:
        print(introspect.cfg_text(overrides, args.cfg), end="")
        return 0
    from compbench.cli.sweep import plan_jobs

    jobs = plan_jobs(overrides)
    texts = [introspect.cfg_text(job, args.cfg) for job in jobs]  # every job checked before any is shown
    for i, (job, text) in enumerate(zip(jobs, texts, strict=True)):
        print(f"# job {i + 1}/{len(jobs)}: {' '.join(job)}\n{text}", end="")
    return 0


def hydra_dirs(overrides: list[str], multirun: bool) -> tuple[list[str], str | None, list[str]]:
    """Honour Hydra's folder and launcher overrides: `hydra.run.dir=D` is `output_dir=D`,
    `hydra.sweep.dir=D` the sweep's folder (-m), `hydra/launcher=NAME` and `hydra.launcher.KEY=V` the
    sweep's launcher plugin (-m; compbench.cli.sweep_launcher). compbench composes with Hydra's compose
    API (no @hydra.main), so any other `hydra.*` setting would be silently ignored: it is refused.
    Returns the other overrides, the sweep's folder and the launcher overrides."""
    from compbench.cli.sweep_launcher import is_launcher_override

    rest, run_dir, sweep_dir, launcher = [], None, None, []
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "hydra.run.dir" and not multirun:
            run_dir = value
        elif key == "hydra.sweep.dir" and multirun:
            sweep_dir = value
        elif is_launcher_override(o) and multirun:
            launcher.append(o)
        elif key.lstrip("+~").startswith(("hydra.", "hydra/")):
            where = "hydra.sweep.dir=DIR with -m" if multirun else "output_dir=DIR (or hydra.run.dir=DIR)"
            also = "" if multirun else "; a launcher (hydra/launcher=NAME) runs the jobs of a sweep (-m)"
            raise ValueError(f"{key} is not used by compbench (it composes configs without Hydra's app "
                             f"runner); for the output folder pass {where}{also}")
        else:
            rest.append(o)
    if run_dir is not None:
        given = [o.partition("=")[2] for o in rest if o.partition("=")[0] == "output_dir"]
        if given and given[-1] != run_dir:
            raise ValueError(f"hydra.run.dir={run_dir} and output_dir={given[-1]} differ; pass one of them")
        rest.append(f"output_dir={run_dir}")
    return rest, sweep_dir, launcher


def launch(argv: list[str]) -> int:
    """`compbench launch -np N [--engine horovod|torch] script.py [args]`."""
    from compbench.launch.processes import run_processes

    parser = ArgumentParser(prog="compbench launch")
    parser.add_argument("-np", type=int, default=2)
    parser.add_argument("--engine", choices=["horovod", "torch"], default="horovod")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.np < 1:
        raise ValueError(f"-np {args.np} must be >= 1")
    if not Path(args.script).is_file():
        raise ValueError(f"script {args.script} does not exist")
    code, message = run_processes([sys.executable, args.script, *args.args], args.engine, args.np)
    if code:
        print(f"error: {message}", file=sys.stderr)
    return code

