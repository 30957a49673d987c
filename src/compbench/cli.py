"""`compbench SUBCOMMAND [overrides]`: parse, compose the config once, hand plain objects on.

  compbench train [-m] [--cfg] key=value ...   train (one run, or a multirun sweep with -m)
  compbench list [GROUP]                        options of every config group, with parameters
  compbench launch -np N [--engine E] SCRIPT    run a script of yours as N ranks (wrap_compress_optimizer)
  compbench bench key=value ...                 encode/decode micro-benchmark of compressors
  compbench plan key=value ...                  SeCoPa compression plan for a model and cluster
  compbench report DIR [--fit F] [--per-node L] tables, plots and what-if scaling of a run or sweep
  compbench claims [--quick] [key=value ...]    published findings re-run as experiments, with a verdict each
  compbench cluster up|down|status|run          K emulated machines (namespaces, shaped links, sshd)
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from compbench.errors import INTERRUPTED_EXIT, report_user_error
from compbench.run import train

_COMMANDS = ("train", "list", "launch", "bench", "plan", "report", "claims", "cluster")
_USAGE = ("usage: compbench {train,list,launch,bench,plan,report,claims,cluster} [-m] [--cfg] "
          "[key=value ...]  (compbench --help)")
# Subcommands with their own argument handling: module with `main(argv) -> int`.
_DELEGATED = {"launch": "compbench.cli:launch", "bench": "compbench.bench.main:main",
              "plan": "compbench.plan.main:main", "report": "compbench.report.main:main",
              "claims": "compbench.claims.runner:main", "cluster": "compbench.cluster.main:main"}


# The exit status of a process a closed pipe stopped (128 + SIGPIPE), as `yes | head` reports it.
_BROKEN_PIPE_EXIT = 141


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; Ctrl-C and a closed output pipe end it with one line at most."""
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe cannot be caught
        return code
    except KeyboardInterrupt:
        # Workers, when running, were stopped by the launcher (it reports them itself).
        print("error: interrupted by Ctrl-C; stopped", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        # `compbench list | head`: the reader left. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _BROKEN_PIPE_EXIT


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="compbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=_COMMANDS)
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="sweep every combination of a,b,c values")
    parser.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    parser.add_argument("overrides", nargs="*",
                        help="Hydra overrides, e.g. compressor=dgc ratio=1e-3 engine.np=2")
    if argv and argv[0] in _DELEGATED:
        import importlib

        module, _, func = _DELEGATED[argv[0]].partition(":")
        with report_user_error():
            return getattr(importlib.import_module(module), func)(argv[1:])
    if not argv or argv[0] not in (*_COMMANDS, "-h", "--help"):
        print(f"error: unknown command {argv[0]!r}; {_USAGE}" if argv else _USAGE, file=sys.stderr)
        return 2
    args = parser.parse_intermixed_args(argv)  # `train -m a=1,2` puts the flag between positionals
    warnings.formatwarning = lambda msg, cat, *_: f"warning: {msg}\n"
    with report_user_error():
        if args.command == "list":
            return list_options(args.overrides)
        overrides, sweep_dir = hydra_dirs(args.overrides, args.multirun)
        if args.multirun:
            from compbench.sweep import run_sweep

            code = run_sweep(overrides, sweep_dir)
        else:
            code = train(overrides, print_cfg=args.cfg)
    from compbench.launch import external_engine

    if external_engine() is not None and not args.cfg:
        from compbench.worker import exit_now

        exit_now(code)  # a finished worker of horovodrun/torchrun: skip finalization (see exit_now)
    return code


def hydra_dirs(overrides: list[str], multirun: bool) -> tuple[list[str], str | None]:
    """Honour Hydra's folder overrides: `hydra.run.dir=D` is `output_dir=D`, `hydra.sweep.dir=D`
    the sweep's folder (-m). compbench composes with Hydra's compose API (no @hydra.main), so any
    other `hydra.*` setting would be silently ignored: it is refused."""
    rest, run_dir, sweep_dir = [], None, None
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "hydra.run.dir" and not multirun:
            run_dir = value
        elif key == "hydra.sweep.dir" and multirun:
            sweep_dir = value
        elif key.lstrip("+~").startswith(("hydra.", "hydra/")):
            where = "hydra.sweep.dir=DIR with -m" if multirun else "output_dir=DIR (or hydra.run.dir=DIR)"
            raise ValueError(f"{key} is not used by compbench (it composes configs without Hydra's app "
                             f"runner); for the output folder pass {where}")
        else:
            rest.append(o)
    if run_dir is not None:
        given = [o.partition("=")[2] for o in rest if o.partition("=")[0] == "output_dir"]
        if given and given[-1] != run_dir:
            raise ValueError(f"hydra.run.dir={run_dir} and output_dir={given[-1]} differ; pass one of them")
        rest.append(f"output_dir={run_dir}")
    return rest, sweep_dir


def launch(argv: list[str]) -> int:
    """`compbench launch -np N [--engine horovod|torch] script.py [args]`."""
    from compbench.launch import run_processes

    parser = argparse.ArgumentParser(prog="compbench launch")
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


def list_options(groups: list[str]) -> int:
    from compbench import registry
    from compbench.config import GROUPS

    for group in groups or GROUPS:
        group = group.removesuffix("s") if group.removesuffix("s") in GROUPS else group  # "compressors" too
        if group not in GROUPS:
            raise ValueError(f"unknown group {group}; choose one of: {', '.join(GROUPS)}")
        print(f"{group}:")
        for name in registry.options(group):
            path = registry.conf_dir() / group / f"{name}.yaml"
            first = path.read_text().splitlines()[0]
            about = first.lstrip("# ").strip() if first.startswith("#") else ""
            params = {k: v for k, v in registry.option_config(group, name).items()
                      if k not in ("_target_", "name")}
            shown = ", ".join(f"{k}={v}" for k, v in params.items() if "${" not in str(v))
            print(f"  {name:<12} {about}")
            if shown:
                print(f"  {'':<12} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
