"""Step time and exposed communication of the schedulers, side by side: one table.

    python scripts/bench_schedulers.py            # resnet50, synthetic 32x32, dgc r=1e-3, 2 workers
    python scripts/bench_schedulers.py --image-size 224 --batch-size 32 --steps 40 --rounds 2
    python scripts/bench_schedulers.py --variants layerwise,layerwise-sync,mergecomp-4 --extra engine=torch

Each variant trains `--steps` measured steps (after `--skip` warm-up steps; `groups=auto` first
spends up to `--search-steps` on its search, and is measured from the step after it chose) with
compressor=dgc, memory=dgc, comm=allgather. Per-step times come from the run's TensorBoard scalars
(rank 0): the table shows medians of `time/step_ms` and `time/comm_exposed_ms` (communication and
decoding the step waited for after back-propagation), `time/comm_ms` (time spent starting and
waiting for collectives) and the step time relative to the best fixed choice. `--rounds N` runs all
variants N times, interleaved, and pools the steps (less drift between variants on a busy machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = {
    "layerwise": ["scheduler=layerwise"],
    "layerwise-sync": ["scheduler=layerwise", "scheduler.overlap=false"],  # no overlap, for reference
    **{f"mergecomp-{g}": ["scheduler=mergecomp", f"scheduler.groups={g}"] for g in (1, 2, 4, 8, 16)},
    "mergecomp-auto": ["scheduler=mergecomp", "scheduler.groups=auto"],
}
DEFAULT = "layerwise,mergecomp-1,mergecomp-2,mergecomp-4,mergecomp-8,mergecomp-auto"
TAGS = ("time/step_ms", "time/comm_exposed_ms", "time/comm_ms", "time/compress_ms")


def scalars(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in TAGS}


def run(name: str, args: argparse.Namespace, out: Path) -> tuple[dict[str, list[float]], dict]:
    auto = name.endswith("auto")
    steps = args.skip + args.steps + (args.search_steps + 1 if auto else 0)
    overrides = [
        f"model={args.model}", "dataset=synthetic", f"dataset.image_size={args.image_size}",
        f"dataset.train_size={args.batch_size * args.np * (steps + 1)}", "dataset.test_size=64",
        "compressor=dgc", f"ratio={args.ratio}", "memory=dgc", "comm=allgather", f"engine.np={args.np}",
        f"batch_size={args.batch_size}", f"max_steps={steps}", "epochs=1", "eval=false", "checkpoint=false",
        "progress=false", f"output_dir={out}", *VARIANTS[name], *args.extra,
    ]
    if auto:
        overrides += [f"scheduler.trial_steps={args.trial_steps}",
                      f"scheduler.search_steps={args.search_steps}"]
    print("compbench train " + " ".join(overrides), flush=True)
    cmd = [sys.executable, "-m", "compbench", "train", *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if "groups=auto chose" in line:
            print("  " + line, flush=True)
    results = json.loads((out / "results.json").read_text())
    sched = results["scheduler"]
    first = (sched["search_end_step"] or steps) + 1 if auto else args.skip
    return {tag: v[first : first + args.steps] for tag, v in scalars(out).items()}, sched


def label(sched: dict) -> str:
    if sched.get("layerwise", sched["name"] == "layerwise"):
        return f"{sched['groups']} (per tensor)"
    skew = sched.get("skew", 1.0)
    return f"{sched['groups']}" + (f" skew {skew:g}" if skew != 1.0 else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--ratio", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=12, help="measured steps per variant and round")
    p.add_argument("--skip", type=int, default=3, help="warm-up steps not measured (fixed variants)")
    p.add_argument("--trial-steps", type=int, default=4)
    p.add_argument("--search-steps", type=int, default=48)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--variants", default=DEFAULT, help=f"comma-separated, from: {', '.join(VARIANTS)}")
    p.add_argument("--out", type=Path, default=Path("outputs/bench_schedulers"))
    p.add_argument("--extra", nargs="*", default=[], help="more overrides, e.g. engine=torch")
    args = p.parse_args()
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")

    pooled: dict[str, dict[str, list[float]]] = {n: {t: [] for t in TAGS} for n in names}
    chosen: dict[str, list[str]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            samples, sched = run(name, args, args.out / f"round{r}" / name)
            for tag in TAGS:
                pooled[name][tag] += samples[tag]
            chosen[name].append(label(sched))

    med = {n: {t: statistics.median(v) if v else float("nan") for t, v in pooled[n].items()} for n in names}
    fixed = [n for n in names if not n.endswith("auto")]
    best = min(fixed, key=lambda n: med[n]["time/step_ms"]) if fixed else None
    print(f"\nmodel={args.model} image_size={args.image_size} batch_size={args.batch_size} x {args.np} "
          "workers, "
          f"compressor=dgc ratio={args.ratio} memory=dgc comm=allgather {' '.join(args.extra)}; medians over "
          f"{args.steps * args.rounds} steps\n")
    print(f"| {'scheduler':<16} | {'groups':<16} | {'step ms':>8} | {'exposed comm ms':>15} | "
          f"{'comm ms':>8} | {'compress ms':>11} | {'vs best fixed':>13} |")
    print(f"|{'-' * 18}|{'-' * 18}|{'-' * 10}|{'-' * 17}|{'-' * 10}|{'-' * 13}|{'-' * 15}|")
    for n in names:
        m = med[n]
        rel = m["time/step_ms"] / med[best]["time/step_ms"] if best else float("nan")
        print(f"| {n:<16} | {', '.join(dict.fromkeys(chosen[n])):<16} | {m['time/step_ms']:>8.1f} | "
              f"{m['time/comm_exposed_ms']:>15.1f} | {m['time/comm_ms']:>8.1f} | "
              f"{m['time/compress_ms']:>11.1f} | {rel:>13.3f} |")
    if best and "mergecomp-auto" in names:
        rel = med["mergecomp-auto"]["time/step_ms"] / med[best]["time/step_ms"]
        print(f"\nauto / best fixed ({best}) = {rel:.3f}: {'within' if rel <= 1.05 else 'NOT within'} 5%")


if __name__ == "__main__":
    main()
