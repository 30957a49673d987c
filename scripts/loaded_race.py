"""Does a loaded machine fool the race? Runs a race beside busy loops and compares it with the same
race on the machine as it was (root, as every race):

    python scripts/loaded_race.py --out DIR [--loops N] [--idle RACE_DIR] -- RACE_ARGS...

DIR/idle: the race as given (or, with `--idle`, the finished runs of an earlier race with the same
methods, links and seeds, copied: the race then only writes its report); DIR/loaded: the same race
while N processes (default: one per core) spin at the default priority. Then DIR/compare.md: per
method and link, the decomposed time to target (tokens to the target x the step time; a loaded
run's step is its estimate of an unloaded one) in both, mean +- half the range over the seeds, and
whether the two intervals overlap, and whether the times at the step's first and third quartiles
(the spread the race states for a step) overlap; the wall-clock time to target beside it; how many
loaded runs the race flagged; and the verdict per link (the methods in the order they reached the
target) in both. Exit 1 when a verdict differs.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

Key = tuple[str, str]  # (method, link as the race writes it)


def race(out: Path, args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "compbench", "race", *args, "--out", str(out)], check=True)


def runs(folder: Path) -> dict[Key, list[dict[str, str]]]:
    by: dict[Key, list[dict[str, str]]] = defaultdict(list)
    with open(folder / "race.csv") as f:
        for row in csv.DictReader(f):
            delay = float(row["one-way delay (ms)"] or 0)
            link = f"{float(row['link (Mbit/s)']):g}" + (f":{delay:g}" if delay else "")
            by[(row["method"], link)].append(row)
    return by


def spread(rows: list[dict[str, str]], column: str) -> tuple[float, float] | None:
    """(mean, half the range) over the runs that reached the target."""
    values = [float(r[column]) for r in rows if r["reached"] == "True" and r[column]]
    return (statistics.fmean(values), (max(values) - min(values)) / 2) if values else None


def quartiles(rows: list[dict[str, str]]) -> tuple[float, float] | None:
    """The decomposed time to target at the runs' first and third quartiles of the step time (its
    tokens to the target are the curve's, which the load does not change), over the runs that
    reached the target: the spread the race states for a step."""
    done = [r for r in rows if r["reached"] == "True" and r["time to target (s)"]]
    if not done:
        return None
    at = [[float(r["time to target (s)"]) * float(r[q]) / float(r["step ms"]) for r in done]
          for q in ("step ms q1", "step ms q3")]
    return statistics.fmean(at[0]), statistics.fmean(at[1])


def verdicts(by: dict[Key, list[dict[str, str]]]) -> dict[str, list[str]]:
    """Per link, the methods that reached the target in every seed, fastest first."""
    times: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for (method, link), rows in by.items():
        t = spread(rows, "time to target (s)")
        if t is not None and all(r["reached"] == "True" for r in rows):
            times[link].append((t[0], method))
    return {link: [m for _, m in sorted(ts)] for link, ts in times.items()}


def _fmt(s: tuple[float, float] | None) -> str:
    return "not reached" if s is None else f"{s[0]:.1f} +- {s[1]:.1f}"


def compare(idle: Path, loaded: Path) -> tuple[str, bool]:
    a, b = runs(idle), runs(loaded)
    rows, overlap, overlap_steps = [], 0, 0
    for key in sorted(a):
        ta, tb = spread(a[key], "time to target (s)"), spread(b.get(key, []), "time to target (s)")
        ratio, within, within_steps = "-", "-", "-"
        qa, qb = quartiles(a[key]), quartiles(b.get(key, []))
        if ta is not None and tb is not None and qa is not None and qb is not None:
            inside = abs(ta[0] - tb[0]) <= ta[1] + tb[1]
            inside_steps = qa[0] <= qb[1] and qb[0] <= qa[1]
            overlap += inside
            overlap_steps += inside_steps
            ratio, within = f"{tb[0] / ta[0]:.2f}", "yes" if inside else "NO"
            within_steps = "yes" if inside_steps else "NO"
        wall = "wall-clock to target (s)"
        wa, wb = spread(a[key], wall), spread(b.get(key, []), wall)
        flagged = sum(r["loaded"] == "True" for r in b.get(key, []))
        rows.append((*key, _fmt(ta), _fmt(tb), ratio, within, within_steps, _fmt(wa), _fmt(wb),
                     f"{flagged}/{len(b.get(key, []))}"))
    va, vb = verdicts(a), verdicts(b)
    same = va == vb
    lines = ["# A loaded race against the same race on the idle machine", "",
             tabulate(rows, headers=("method", "link", "time to target idle (s)", "loaded (s)",
                                     "loaded / idle", "within the seeds' spread",
                                     "within the steps' q1-q3", "wall-clock idle (s)",
                                     "wall-clock loaded (s)", "loaded runs flagged"),
                      tablefmt="github", disable_numparse=True), "",
             f"{overlap} of {len(rows)} decomposed times to target within the two races' spread over the "
             f"seeds (mean +- half the range); {overlap_steps} of {len(rows)} where the times at the step's "
             "first and third quartiles overlap.",
             "",
             tabulate([(link, " < ".join(va.get(link, [])) or "-", " < ".join(vb.get(link, [])) or "-",
                        "same" if va.get(link) == vb.get(link) else "DIFFERENT")
                       for link in sorted(set(va) | set(vb))],
                      headers=("link", "verdict idle (first to the target first)", "verdict loaded", ""),
                      tablefmt="github", disable_numparse=True), ""]
    return "\n".join(lines), same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--loops", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--idle", type=Path, default=None,
                    help="an earlier race whose runs stand for the idle one")
    ap.add_argument("race_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    race_args = [a for a in args.race_args if a != "--"]
    idle, loaded = args.out / "idle", args.out / "loaded"
    if args.idle is not None:
        for run in (args.idle / "runs").iterdir():
            copy = idle / "runs" / run.name
            if run.is_dir() and not copy.exists():
                shutil.copytree(run, copy)
                # the race knows a finished run by its overrides, its folder among them
                overrides = copy / ".hydra" / "overrides.yaml"
                overrides.write_text(overrides.read_text().replace(f"output_dir={run}", f"output_dir={copy}"))
    race(idle, race_args)  # with --idle: every run is there, only the report is written
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.loops)]
    try:
        race(loaded, race_args)
    finally:
        for p in spinners:
            p.kill()
    text, same = compare(idle, loaded)
    (args.out / "compare.md").write_text(text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
