"""Does the unloaded estimate of a step hold at a load? A loaded race run ranks methods by it
(`step_unloaded_ms`: its communication's wall time plus the CPU time of the rest over its compute
threads, compbench.records.stats.StepStats.unloaded_ms); this measures it against the wall clock of the
same run on the idle machine, per method family and load, for compbench.race.to_target.VALIDATED:

    python scripts/validate_unloaded.py [--out DIR] [--methods M,...] [--loads 0,1,2] [--steps N]
                                        [--repeats R] [--link MBPS] [--nice N]

Each method (one a family, the races' recipes: ddp-adamw per-step, the text race's; diloco periodic,
the text race's with the eager update; fsdp sharded, the sharded race's) trains `--steps` steps
without evaluation (`compbench train ... max_steps=N eval=false`), `--repeats` times, idle (0) and
beside 1 and 2 busy loops per core (`--loads`: child processes spinning at the default priority,
which this script starts before a load's runs and kills after them: on success, on a failed run, on
Ctrl-C and on SIGTERM; each also dies with this script, PR_SET_PDEATHSIG). Its workers run as a
race's do: at `--nice` (default -20 as root, as the race: first on the cores; else the default
priority) on a shaped link of `--link` Mbit/s where root (default 1000; none without root).

DIR/validation.md: per load (rows) and method family (columns), the estimate's median step at that
load over the same method's wall-clock median step idle (mean over the family's runs; in brackets
their range and the wall clock's own ratio, what the load did to it), and which (family, load) the
estimate is within compbench.race.to_target.ESTIMATE_TOLERANCE of 1; then the lines to paste into
VALIDATED. DIR/validation.csv: one row per run. A finished run (DIR/loadL/METHOD-rK/results.json) is
kept: running it again resumes.

About 10-15 minutes on a 2-core machine with the defaults (3 methods x 3 loads x 2 repeats of 95
steps: 18 runs of 20-45 s each, the loaded ones longer). A smoke test, one run of 12 steps idle,
about 10 s: `python scripts/validate_unloaded.py --out /tmp/validate --methods ddp-adamw --loads 0
--steps 12 --repeats 1`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from tabulate import tabulate

from compbench.race.suites import SHARDED, TEXT, Race
from compbench.race.to_target import ESTIMATE_TOLERANCE, FAMILIES, family, others_per_core

# one method a family: (its race, its name there)
METHODS: dict[str, tuple[Race, str]] = {"ddp-adamw": (TEXT, "ddp-adamw"), "diloco": (TEXT, "diloco"),
                                        "fsdp": (SHARDED, "fsdp")}
# A busy loop that dies with its parent (PR_SET_PDEATHSIG = 1, SIGKILL = 9) and never outlives a parent
# that died before the call (its parent's pid, argv[1], no longer its parent).
LOOP = ("import ctypes, os, sys\n"
        "ctypes.CDLL(None).prctl(1, 9)\n"
        "if os.getppid() != int(sys.argv[1]):\n"
        "    sys.exit(0)\n"
        "while True:\n"
        "    pass\n")


@contextmanager
def busy_loops(count: int, code: str = LOOP) -> Iterator[list[subprocess.Popen]]:
    """`count` busy loops for the block's length, killed when it ends however it ends."""
    loops: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            loops.append(subprocess.Popen([sys.executable, "-c", code, str(os.getpid())]))
        yield loops
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"validate_unloaded: busy loop {p.pid} did not end after SIGKILL", file=sys.stderr)


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM or SIGHUP: unwind (the busy loops' `finally` kills them), exit 128 + the signal."""
    raise SystemExit(128 + signum)


def overrides(method: str, steps: int, seed: int, link_mbps: float | None, nice: int | None) -> list[str]:
    race, name = METHODS[method]
    keys = [*race.base, *race.methods[name], f"max_steps={steps}", "eval=false", f"seed={seed}"]
    if link_mbps is not None:
        keys.append(f"net.emulate_gbps={link_mbps / 1e3:g}")
    if nice is not None:
        keys.append(f"nice={nice}")
    return keys


def train(run_dir: Path, keys: list[str], timeout_s: float) -> dict:
    """The run's results.json (a finished one is kept); raises where the run failed."""
    results = run_dir / "results.json"
    if results.exists():
        data = json.loads(results.read_text())
        if (data.get("summary") or {}).get("status") == "completed":
            print(f"  {run_dir}: finished before, kept", flush=True)
            return data
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"  {run_dir}: compbench train {' '.join(keys)}", flush=True)
    proc = subprocess.run([sys.executable, "-m", "compbench", "train", *keys, f"output_dir={run_dir}"],
                          timeout=timeout_s, check=False)
    if proc.returncode != 0 or not results.exists():
        raise RuntimeError(f"{run_dir}: compbench train exited {proc.returncode}")
    return json.loads(results.read_text())


def measure(args: argparse.Namespace, methods: list[str], loads: list[int]) -> list[dict]:
    rows = []
    cores = os.cpu_count() or 1
    for load in loads:
        print(f"validate_unloaded: {load} busy loop(s) per core ({load * cores} processes)", flush=True)
        with busy_loops(load * cores):
            for method in methods:
                for k in range(args.repeats):
                    run_dir = args.out / f"load{load}" / f"{method}-r{k}"
                    keys = overrides(method, args.steps, k, args.link, args.nice)
                    data = train(run_dir, keys, args.timeout)
                    s, env = data["summary"], data.get("environment") or {}
                    rows.append({"load": load, "method": method, "repeat": k, "family": family(data),
                                 "step_ms": s.get("step_ms"), "step_unloaded_ms": s.get("step_unloaded_ms"),
                                 "loaded": env.get("loaded", s.get("loaded")),
                                 "others_per_core": others_per_core(env), "nice": env.get("nice"),
                                 "steps": s.get("steps"), "run": str(run_dir)})
    return rows


def table(rows: list[dict]) -> tuple[str, dict[tuple[str, int], float]]:
    """validation.md's text, and the (family, load) -> ratio it measured at a load."""
    idle = {m: statistics.median(r["step_ms"] for r in rows if r["method"] == m and r["load"] == 0)
            for m in {r["method"] for r in rows if r["load"] == 0}}
    for r in rows:
        base = idle.get(r["method"])
        r["estimate_over_idle_wall"] = (r["step_unloaded_ms"] / base if base and r["step_unloaded_ms"]
                                        else None)
        r["wall_over_idle_wall"] = r["step_ms"] / base if base and r["step_ms"] else None
    families = [f for f in FAMILIES if any(r["family"] == f for r in rows)]
    loads = sorted({r["load"] for r in rows})
    measured: dict[tuple[str, int], float] = {}
    cells = []
    for load in loads:
        line = ["idle" if load == 0 else f"{load} busy loop{'' if load == 1 else 's'} per core"]
        for fam in families:
            mine = [r for r in rows if r["load"] == load and r["family"] == fam
                    and r["estimate_over_idle_wall"] is not None]
            if not mine:
                line.append("no idle run to compare with" if any(
                    r["load"] == load and r["family"] == fam for r in rows) else "-")
                continue
            est = [r["estimate_over_idle_wall"] for r in mine]
            wall = statistics.fmean(r["wall_over_idle_wall"] for r in mine)
            ratio = statistics.fmean(est)
            ok = abs(ratio - 1) <= ESTIMATE_TOLERANCE
            line.append(f"{ratio:.2f} ({min(est):.2f}-{max(est):.2f}; wall {wall:.2f}) "
                        f"{'holds' if ok else 'OFF'}")
            if load:
                measured[(fam, load)] = round(ratio, 3)
        cells.append(line)
    methods = ", ".join(f"{m} ({METHODS[m][0].name} race)" for m in dict.fromkeys(r["method"] for r in rows))
    lines = ["# The unloaded estimate against the idle wall clock", "",
             "The estimate's median step (`step_unloaded_ms`) at each load over the same method's "
             "wall-clock median step (`step_ms`) on the idle machine, the mean over the family's runs (in "
             "brackets their range, and the wall clock's own ratio at that load); it holds within "
             f"{ESTIMATE_TOLERANCE:.0%} of 1 (compbench.race.to_target.ESTIMATE_TOLERANCE). Methods: "
             f"{methods}.",
             "", tabulate(cells, headers=("load", *families), tablefmt="github", disable_numparse=True), "",
             "For compbench.race.to_target.VALIDATED:", "", "```python",
             *[f"    ({fam!r}, {load}): {ratio},"
               for (fam, load), ratio in sorted(measured.items())], "```", ""]
    return "\n".join(lines), measured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("outputs/validate_unloaded"))
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--loads", default="0,1,2", help="busy loops per core, comma-separated (0: idle, first)")
    ap.add_argument("--steps", type=int, default=95, help="steps a run (5 warm-up steps are left out)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each method at each load (seeds 0..R-1)")
    root = os.geteuid() == 0
    ap.add_argument("--link", type=float, default=1000.0 if root else None,
                    help="shaped link, Mbit/s (root only; default 1000 as root, none otherwise)")
    ap.add_argument("--nice", type=int, default=-20 if root else None,
                    help="the workers' CPU priority (default -20 as root, as the race's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    args = ap.parse_args()
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = [m for m in methods if m not in METHODS]
    loads = sorted({int(x) for x in args.loads.split(",")})
    if unknown or not methods or loads[0] < 0 or args.steps < 1 or args.repeats < 1:
        ap.error(f"--methods from {', '.join(METHODS)} ({', '.join(unknown) or 'none'} unknown), "
                 "--loads >= 0, --steps and --repeats >= 1")
    if 0 not in loads:
        ap.error("--loads must include 0: every ratio is against the idle run")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        rows = measure(args, methods, loads)
    except KeyboardInterrupt:
        print("validate_unloaded: interrupted (busy loops ended); run again to continue", file=sys.stderr)
        return 130
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"validate_unloaded: {e} (busy loops ended; finished runs kept)", file=sys.stderr)
        return 1
    text, _ = table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.md").write_text(text)
    with open(args.out / "validation.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(text)
    print(f"validate_unloaded: {args.out / 'validation.md'}, {args.out / 'validation.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
