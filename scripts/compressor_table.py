"""Train digits with 2 workers for every compressor x valid communicator x engine; print a table.

    python scripts/compressor_table.py                       # everything (~2 h on 2 cores)
    python scripts/compressor_table.py --engines torch --epochs 2    # does everything train on torch?
    python scripts/compressor_table.py --engines horovod --compressors dgc,dragonn --extra ratio=1e-3
    # Fashion-MNIST (the README's table; see there for its time): each compressor on its usual
    # communicator (allreduce where accepted, else allgather), 2 seeds, the claims suite's setting
    python scripts/compressor_table.py --engines horovod --usual --seeds 2 --epochs 3 \
        --extra model=cnn dataset=fashion_mnist batch_size=64

Each compressor runs with its recipe (its `Capabilities.recipe`, what `compbench train` applies
by default: residual error feedback with momentum 0 and lr 0.3 for the biased sparsifiers and
sign compressors, dgc's momentum correction for dgc, signum's lr 1e-3, none for the unbiased
ones and for those that keep their own state). Communicators are those of the compression
pipeline (allreduce, allgather, ps, ring) that `compbench train` accepts for the pair: the same
config check as the CLI. Finished runs are reused (delete outputs/compressor_table to start
over). The table (final accuracy, bytes per step, effective compression ratio) is written to
outputs/compressor_table/table-ENGINES-EPOCHSep.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from compbench.catalog import registry
from compbench.compose import config

COMPRESSION_COMMS = ("allreduce", "allgather", "ps", "ring")
OUT = Path("outputs/compressor_table")


def recipe(compressor: str, comm: str) -> list[str]:
    """The recipe `compbench train` applies to this pair (each compressor's `Capabilities.recipe`,
    compbench.compose.compat.recipe), spelled out as overrides so the table's runs say what they used."""
    cfg = config.compose([f"compressor={compressor}", f"comm={comm}"])
    return [f"{k}={v}" for k, v in cfg.recipe.items()]


def valid_comms(compressor: str, engine: str) -> list[str]:
    """The communicators `compbench train` accepts for this compressor on this engine."""
    ok = []
    for comm in COMPRESSION_COMMS:
        overrides = [f"compressor={compressor}", f"comm={comm}", f"engine={engine}"]
        try:
            config.check(config.compose(overrides))
        except ValueError:
            continue
        ok.append(comm)
    return ok


def run(engine: str, compressor: str, comm: str, extra: list[str], epochs: int, seed: int = 0) -> dict:
    seeded = [f"s{seed}"] if seed else []  # seed 0 keeps the tag of the runs made before --seeds
    tag = "-".join([compressor, comm, f"{epochs}ep", *[e.replace("=", "") for e in extra], *seeded])
    out = OUT / engine / tag
    results = out / "results.json"
    if not (results.exists() and json.loads(results.read_text())["summary"]["status"] == "completed"):
        cmd = [sys.executable, "-m", "compbench", "train", f"compressor={compressor}", f"comm={comm}",
               *recipe(compressor, comm), f"engine={engine}", "engine.np=2", f"epochs={epochs}",
               "progress=false", "checkpoint=false", f"output_dir={out}", f"seed={seed}", *extra]
        print(" ".join(cmd[3:]), flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"status": "failed", "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(results.read_text())["summary"]


def _combine(runs: list[dict]) -> dict:
    """One row from the seeds' summaries: mean accuracy, half its range, mean bytes and ratio."""
    failed = [s for s in runs if s.get("status") != "completed"]
    if failed:
        return failed[0]
    accs = [s["final_acc1"] for s in runs]
    n = len(runs)
    return {"status": "completed", "final_acc1": sum(accs) / n, "spread": (max(accs) - min(accs)) / 2,
            "seeds": n, "bytes_sent_per_step": sum(s["bytes_sent_per_step"] for s in runs) / n,
            "ratio_effective": sum(s["ratio_effective"] for s in runs) / n}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engines", default="horovod,torch")
    p.add_argument("--compressors", default=",".join(registry.options("compressor")))
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--extra", nargs="*", default=[], help="more overrides, e.g. ratio=1e-3")
    p.add_argument("--usual", action="store_true",
                   help="one communicator per compressor: allreduce where accepted, else allgather")
    p.add_argument("--seeds", type=int, default=1, help="seeds per run; the table gives mean +- half range")
    args = p.parse_args()
    rows = []
    for engine in args.engines.split(","):
        for compressor in args.compressors.split(","):
            comms = valid_comms(compressor, engine)
            if args.usual:
                comms = [c for c in ("allreduce", "allgather") if c in comms][:1]
            for comm in comms:
                runs = [run(engine, compressor, comm, args.extra, args.epochs, seed)
                        for seed in range(args.seeds)]
                rows.append((engine, compressor, comm, " ".join(recipe(compressor, comm)), _combine(runs)))
    base = {e: s.get("final_acc1") for e, c, m, _, s in rows if c == "none" and m == "allreduce"}
    lines = ["| engine | compressor | comm | memory, optimizer | final acc1 (%) | vs fp32 | bytes/step "
             "| effective ratio |", "|---|---|---|---|---|---|---|---|"]
    for engine, compressor, comm, memory, s in rows:
        if s.get("status") != "completed":
            lines.append(f"| {engine} | {compressor} | {comm} | {memory} | failed: {s.get('error')} | | | |")
            continue
        delta = f"{s['final_acc1'] - base[engine]:+.2f}" if base.get(engine) is not None else ""
        acc = f"{s['final_acc1']:.2f}" + (f" +- {s['spread']:.2f}" if s["seeds"] > 1 else "")
        lines.append(f"| {engine} | {compressor} | {comm} | {memory} | {acc} | {delta} | "
                     f"{s['bytes_sent_per_step']:,.0f} | {s['ratio_effective']:.1f} |")
    table = "\n".join(lines)
    OUT.mkdir(parents=True, exist_ok=True)
    name = "-".join(["table", *args.engines.split(","), f"{args.epochs}ep", *args.extra,
                     *(["usual"] if args.usual else []), *([f"{args.seeds}seeds"] if args.seeds > 1 else [])])
    (OUT / f"{name}.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
