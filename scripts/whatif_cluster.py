"""The what-if model measured: step times on emulated clusters (`compbench cluster`) for the report.

    python scripts/whatif_cluster.py                  # the grid below (root; hours on 2 cores)
    python scripts/whatif_cluster.py --nodes 2 --gbps 1 --workers 2,4 --compressors dgc --comms hierarchical
    python scripts/whatif_cluster.py --groups 4 --comms ps,hierarchical   # MergeComp's 4 fused groups

Every row is a real job: `horovodrun -np N -H n1:N/K,...` inside a K-node cluster whose node links
carry G Gbit/s each way, training model=profiled (ResNet-50's 161 gradients, 25.6M elements, a
backward that sleeps 100 ms split by layer: N workers on 2 cores measure communication and
compression, not a fight over compute) for `--steps` steps, without overlap (scheduler.overlap=false:
the report's model assumes none); one collective per tensor (scheduler=layerwise), or with
`--groups G` MergeComp's G fused groups (scheduler=mergecomp), which takes the per-collective
waiting of blocking communicators (ps, hierarchical) out. The step time is the median after the warm-up steps
(results.json). Rows go to outputs/whatif_cluster/rows.csv as they finish (a row already there is
not run again), one run folder each.

Then (and alone with `--fit`) the node-aware model of `compbench.comm.cost_model` is fitted to
the rows' communication times twice: on every row, and on the 2-node rows only, which then predict
the 4-node rows they never saw. A row's predicted step is its measured compute, compression,
decoding, optimizer and other time plus the model's communication; model.md has the table, fit.json
the fit on every row (`compbench report DIR --fit outputs/whatif_cluster/fit.json`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from compbench.cluster import nodes
from compbench.cluster.nodes import Cluster
from compbench.comm import cost_model

OUT = Path("outputs/whatif_cluster")
FIELDS = ["nodes", "gbps", "workers", "compressor", "comm", "groups", "step_ms", "compute_ms", "compress_ms",
          "decompress_ms", "optimizer_ms", "comm_ms", "other_ms", "bytes_sent_per_step",
          "bytes_dense_per_step", "bytes_allreduce_per_step", "compressed_calls_per_step",
          "dense_calls_per_step", "run_dir"]
WORKLOAD = ["model=profiled", "model.backward_ms=100", "dataset=synthetic", "dataset.image_size=8",
            "dataset.train_size=4096", "batch_size=8", "epochs=1", "eval=false", "checkpoint=false",
            "progress=false", "optim.lr_schedule=constant", "scheduler.overlap=false", "ratio=0.001"]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def scheduler_overrides(groups: int) -> list[str]:
    """0: one collective per tensor (layer-wise); G > 0: MergeComp's G fused groups."""
    return ["scheduler=mergecomp", f"scheduler.groups={groups}"] if groups else ["scheduler=layerwise"]


def measure_row(cluster: Cluster, workers: int, compressor: str, comm: str, groups: int, steps: int) -> dict:
    per_node = workers // cluster.nodes
    hosts = ",".join(f"{cluster.host(i)}:{per_node}" for i in range(1, cluster.nodes + 1))
    name = f"n{workers}-{compressor}-{comm}" + (f"-g{groups}" if groups else "")
    run_dir = (OUT / f"k{cluster.nodes}-g{cluster.gbps:g}" / name).resolve()
    bin_dir = Path(sys.executable).parent
    cmd = [*cluster.exec_prefix(1), str(bin_dir / "horovodrun"), "-np", str(workers), "-H", hosts,
           str(bin_dir / "compbench"), "train", *scheduler_overrides(groups), *WORKLOAD, f"max_steps={steps}",
           f"compressor={compressor}", f"comm={comm}", f"output_dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"{compressor}/{comm} N={workers}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    summary = json.loads((run_dir / "results.json").read_text())["summary"]
    row = {"nodes": cluster.nodes, "gbps": cluster.gbps, "workers": workers, "compressor": compressor,
           "comm": comm, "groups": groups, "run_dir": str(run_dir)}
    row.update({k: summary.get(k) for k in FIELDS if k not in row})
    return row


def _key(r: dict) -> tuple:
    return int(r["nodes"]), float(r["gbps"]), int(r["workers"]), r["compressor"], r["comm"], int(r["groups"])


def _raw_rows(path: Path) -> list[dict]:
    """rows.csv as strings; rows written before the `groups` column were layer-wise (0)."""
    if not path.exists():
        return []
    with path.open() as f:
        return [{**r, "groups": r.get("groups") or "0"} for r in csv.DictReader(f)]


def _append(path: Path, row: dict) -> None:
    """Add a row; a file with older columns is rewritten with FIELDS first."""
    old = _raw_rows(path)
    header = path.read_text().splitlines()[0].split(",") if old else []
    if header != FIELDS:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            writer.writerows(old)
    with path.open("a", newline="") as f:
        csv.DictWriter(f, FIELDS).writerow(row)


def _read_rows(path: Path) -> list[dict]:
    rows = _raw_rows(path)
    for r in rows:
        for k, v in r.items():
            if k not in ("compressor", "comm", "run_dir"):
                r[k] = float(v) if v not in ("", "None") else 0.0
    return rows


def _label(r: dict) -> str:
    """The communicator as the tables show it: with MergeComp's group count when fused."""
    return r["comm"] + (f" g{r['groups']:.0f}" if r["groups"] else "")


def write_model(rows_csv: Path) -> Path:
    """Fit the model to the rows; writes model.md (fit_report) and fit.json; returns model.md."""
    report, fit_all = fit_report(_read_rows(rows_csv))
    (OUT / "fit.json").write_text(json.dumps(dataclasses.asdict(fit_all), indent=1) + "\n")
    (OUT / "model.md").write_text(report)
    return OUT / "model.md"


def fit_report(rows: list[dict]) -> tuple[str, cost_model.Fit]:
    """model.md's text: both fits' coefficients and, per row, measured and predicted step times;
    and the fit on every row."""
    shapes = [cost_model.Shape(int(r["nodes"]), int(r["workers"]), r["gbps"]) for r in rows]
    terms = [cost_model.features(r, s) for r, s in zip(rows, shapes, strict=True)]
    comm = [r["comm_ms"] for r in rows]
    two = [i for i, r in enumerate(rows) if r["nodes"] == 2]
    fits = {"all rows": cost_model.fit(terms, comm),
            "2-node rows": cost_model.fit([terms[i] for i in two], [comm[i] for i in two])}
    out = ["# What-if model against the emulated cluster", "",
           "Predicted step = the row's measured compute + compress + decompress + optimizer + other, "
           "plus the model's communication; error = (predicted - measured) / measured step.", ""]
    for name, f in fits.items():
        out.append(f"- fit on {name}: {f.ms_per_waited:.2f} ms per waited collective and peer, "
                   f"{f.ms_per_queued:.2f} ms per queued one, {f.ms_per_round:.3f} ms per round, "
                   f"link time x {f.link_factor:.3f}, machine copies {f.machine_gb_per_s:.2f} GB/s")
    out += ["", "| K | Gbit/s | N | compressor | comm | step ms | comm ms | predicted (all) | error | "
            "predicted (2-node fit) | error |", "|" + "---|" * 11]
    errors: dict[str, list[float]] = {name: [] for name in fits}
    for r, t in zip(rows, terms, strict=True):
        cells = []
        for name, f in fits.items():
            pred = r["step_ms"] - r["comm_ms"] + f.comm_ms(t)
            errors[name].append((pred - r["step_ms"]) / r["step_ms"])
            cells += [f"{pred:.0f}", f"{100 * errors[name][-1]:+.1f}%"]
        out.append(f"| {r['nodes']:.0f} | {r['gbps']:g} | {r['workers']:.0f} | {r['compressor']} | "
                   f"{_label(r)} | {r['step_ms']:.0f} | {r['comm_ms']:.0f} | " + " | ".join(cells) + " |")
    out.append("")
    unseen = [i for i, r in enumerate(rows) if r["nodes"] != 2]
    for name, which in (("all rows", range(len(rows))), ("2-node rows", unseen)):
        errs = [abs(errors[name][i]) for i in which]
        if errs:
            label = "every row" if name == "all rows" else "the 4-node rows it did not see"
            out.append(f"- fit on {name}, on {label}: largest error {100 * max(errs):.1f}%, "
                       f"{sum(e <= 0.15 for e in errs)} of {len(errs)} within 15%")
    out += ["", "By communicator: the fit on all rows, and a fit on that communicator's rows alone "
            "(its own coefficients: whether the model's form holds there):", ""]
    for label in sorted({_label(r) for r in rows}):
        mine = [i for i, r in enumerate(rows) if _label(r) == label]
        own = cost_model.fit([terms[i] for i in mine], [comm[i] for i in mine])
        own_errors = [(own.comm_ms(terms[i]) - comm[i]) / rows[i]["step_ms"] for i in mine]
        out.append(f"- {label}: {_within([errors['all rows'][i] for i in mine])}; "
                   f"fitted alone {_within(own_errors)}")
    out += ["", "Step time in ms (error of the fit on all rows):", "", *pivot(rows, errors["all rows"])]
    return "\n".join(out) + "\n", fits["all rows"]


def _within(errors: list[float]) -> str:
    worst = max(abs(e) for e in errors)
    return f"{sum(abs(e) <= 0.15 for e in errors)} of {len(errors)} within 15% (largest {100 * worst:.0f}%)"


def pivot(rows: list[dict], errors: list[float]) -> list[str]:
    """One line per cluster (K, G, N), one column per compressor/comm: measured ms (error)."""
    order = {name: i for i, name in enumerate(["allgather", "ps", "hierarchical", "none", "fp16", "dgc"])}
    cols = sorted({(_label(r), r["compressor"]) for r in rows},
                  key=lambda mc: (order.get(mc[0].split()[0], 9), mc[0], order.get(mc[1], 9), mc))
    keys = sorted({(r["nodes"], r["gbps"], r["workers"]) for r in rows})
    cell = {(r["nodes"], r["gbps"], r["workers"], _label(r), r["compressor"]):
            f"{r['step_ms']:.0f} ({100 * e:+.0f}%)" for r, e in zip(rows, errors, strict=True)}
    lines = ["| K | Gbit/s | N | " + " | ".join(f"{c} {m}" for m, c in cols) + " |",
             "|" + "---|" * (3 + len(cols))]
    for k, g, n in keys:
        row = [cell.get((k, g, n, m, c), "") for m, c in cols]
        lines.append(f"| {k:.0f} | {g:g} | {n:.0f} | " + " | ".join(row) + " |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=_ints, default=[2, 4])
    p.add_argument("--gbps", type=_floats, default=[1.0, 10.0])
    p.add_argument("--workers", type=_ints, default=[2, 4, 8])
    p.add_argument("--compressors", type=lambda s: s.split(","), default=["none", "fp16", "dgc", "dragonn"])
    p.add_argument("--comms", type=lambda s: s.split(","), default=["allgather", "ps", "hierarchical"])
    p.add_argument("--groups", type=int, default=0,
                   help="0: one collective per tensor (layer-wise); G: MergeComp's G fused groups")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fit", action="store_true", help="only fit the model to rows.csv (no runs)")
    args = p.parse_args()
    rows_csv = OUT / "rows.csv"
    if args.fit:
        print(write_model(rows_csv).read_text())
        return 0
    nodes.check_machine()
    if nodes.leftovers():
        raise SystemExit("error: a cluster is up (or left over); run `compbench cluster down` first")
    OUT.mkdir(parents=True, exist_ok=True)
    done = {_key(r) for r in _raw_rows(rows_csv)}
    for k in args.nodes:
        for gbps in args.gbps:
            todo = [(n, c, m) for n in args.workers if n >= k and n % k == 0 for c in args.compressors
                    for m in args.comms if (k, gbps, n, c, m, args.groups) not in done]
            if not todo:
                continue
            cluster = Cluster(k, gbps, owner_pid=os.getpid())
            nodes.create(cluster)
            try:
                for n, compressor, comm in todo:
                    row = measure_row(cluster, n, compressor, comm, args.groups, args.steps)
                    _append(rows_csv, row)
                    print(f"K={k} G={gbps:g} N={n} {compressor}/{comm} groups={args.groups}: "
                          f"{row['step_ms']:.1f} ms", flush=True)
            finally:
                nodes.remove()
    print(f"wrote {write_model(rows_csv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
