"""`compbench bench mode=e2e`: end-to-end step time of compbench's compressors against what users
would otherwise run, one table (also `python scripts/bench_e2e.py`, the same with flags).

    compbench bench mode=e2e                      # the matrix below, shaped 1 Gbit/s and unshaped
    compbench bench mode=e2e e2e.rows=[ddp_fp32,dragonn] e2e.steps=20
    compbench bench mode=e2e e2e.repeat=3         # the whole matrix 3 times, interleaved: median

2 workers, MLP 4096 -> 4096 -> 10 (16.8M parameters) on synthetic 4x32x32 inputs (4096 features),
batch 32 per worker; every row is a real `compbench train` run (same trainer, data and optimizer),
its step time the median from results.json (first steps skipped). Shaped rows run the workers in a
network namespace whose loopback carries 2 x `e2e.gbps` Gbit/s (net.emulate_gbps, needs root).
Rows: compbench none (torch and horovod engines), dragonn and dgc at ratio 1e-3 over allgather
(each with its usual memory) and dgc with memory=none (its encode alone), DDP fp32 and PowerSGD
rank 1 (sync=ddp), Horovod's DistributedOptimizer with and without fp16 (sync=horovod_optimizer),
and, outside compbench, a plain DDP and a plain Horovod training script (same model, optimizer,
batch, synthetic data and flush_denormal, started by compbench's launcher): the harness's own cost;
and a compute-only step (one process, one thread: forward, backward, a plain SGD step),
which dragonn's step is measured against. A second table puts every phase of the compbench rows next
to its floor (compbench.records.floors: the memory passes it must make at this machine's read pass, the wire
time at the shaped link); each row's non-finite check (`time/check_ms`, its median: on_nonfinite=raise,
folded into the compressors' compiled first pass, compbench.codec.finite); then the step-time targets,
checked (`e2e_table`, per link: the check <= 0.5 ms, dragonn <= 1.5x compute-only, dgc <= 1.15x
dragonn: the hot path at its floor on the CPU). The tables, the machine's
load before and after, and every run directory go to `output` (default
outputs/bench_e2e/DATE-TIME/: table.md, results.json). Timings on a shared machine are noisy:
compare the ratios of one table, measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compbench.base.values import require_int
from compbench.bench import e2e_table
from compbench.compose.checks import check_creatable
from compbench.network.netem import can_shape, check_rate
from compbench.records.results import WARMUP_STEPS

MODEL = ["model=mlp", "model.hidden=[4096]", "dataset=synthetic", "dataset.channels=4",
         "dataset.image_size=32", "batch_size=32", "engine.np=2", "eval=false", "checkpoint=false",
         "progress=false", "optim.lr_schedule=constant", "epochs=1"]
# (key, label, overrides)
ROWS = [
    ("none_torch", "compbench none (torch)", ["engine=torch", "compressor=none", "comm=allreduce"]),
    ("none_horovod", "compbench none (horovod)", ["engine=horovod", "compressor=none", "comm=allreduce"]),
    ("dragonn", "compbench dragonn 1e-3 allgather", ["engine=torch", "compressor=dragonn", "ratio=1e-3",
                                                     "comm=allgather", "memory=none"]),
    ("dgc", "compbench dgc 1e-3 allgather", ["engine=torch", "compressor=dgc", "ratio=1e-3", "comm=allgather",
                                             "memory=dgc"]),
    ("dgc_encode", "compbench dgc 1e-3 allgather, memory=none",
     ["engine=torch", "compressor=dgc", "ratio=1e-3", "comm=allgather", "memory=none"]),
    ("ddp_fp32", "DDP fp32", ["engine=torch", "sync=ddp", "sync.hook=allreduce"]),
    ("ddp_powersgd", "DDP PowerSGD rank 1", ["engine=torch", "sync=ddp", "sync.hook=powersgd",
                                             "sync.powersgd_rank=1"]),
    ("ddp_topk", "DDP top-k hook 1e-3", ["engine=torch", "sync=ddp", "sync.hook=topk",
                                         "sync.topk_ratio=1e-3"]),
    ("hvd", "Horovod DistributedOptimizer", ["engine=horovod", "sync=horovod_optimizer"]),
    ("hvd_fp16", "Horovod DistributedOptimizer fp16", ["engine=horovod", "sync=horovod_optimizer",
                                                       "sync.compression=fp16"]),
    ("plain_ddp", "plain DDP fp32 script (no compbench)", []),
    ("plain_hvd", "plain Horovod DO script (no compbench)", []),
    ("compute", "compute only (one process, plain SGD)", []),
]
PLAIN = {"plain_ddp": "torch", "plain_hvd": "horovod", "compute": "compute"}


def plain_worker(kind: str, out: Path, steps: int) -> None:
    """One rank of the plain training script: what a user writes without compbench."""
    import torch
    import torch.nn.functional as F

    from compbench.data.synthetic import synthetic
    from compbench.models.mlp import mlp

    torch.set_num_threads(int(os.environ.get("COMPBENCH_THREADS", "1")))
    torch.manual_seed(0)
    model = mlp(num_classes=10, image_size=32, in_chans=4, hidden=[4096])
    # the optimizer of conf/optim/sgd.yaml (fused): the rows then differ only by the harness
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, fused=True)
    rank = 0
    if kind == "compute":  # the compute-only step: forward, backward, a plain SGD step
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    elif kind == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=os.environ["COMPBENCH_INIT_METHOD"],
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        import horovod.torch as hvd

        hvd.init()
        rank = hvd.rank()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # compbench's data (dataset=synthetic: learnable, so that the model reaches the same denormal
    # range as in compbench's rows) and its default flush_denormal=true
    torch.set_flush_denormal(True)
    train, _ = synthetic(num_classes=10, image_size=32, channels=4)
    batches = [train[(2 * i + rank) * 32 : (2 * i + rank + 1) * 32] for i in range(len(train) // 64)]
    times = []
    for i in range(steps):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        skip = min(WARMUP_STEPS, len(times) - 1)  # as compbench's summary: first steps include warm-up costs
        out.mkdir(parents=True, exist_ok=True)
        sent = 0 if kind == "compute" else 4 * sum(p.numel() for p in model.parameters())
        (out / "results.json").write_text(json.dumps({"summary": {
            "status": "completed", "steps": steps, "step_ms": statistics.median(times[skip:]),
            "bytes_sent_per_step": sent}}))
    if kind == "torch":
        dist.barrier()
        dist.destroy_process_group()
    elif kind == "horovod":
        hvd.shutdown()


def run_plain(key: str, out: Path, steps: int, gbps: float | None) -> dict:
    from compbench.launch.processes import run_processes
    from compbench.network.netem import shaped

    argv = [sys.executable, "-m", "compbench.bench.e2e", "--plain-worker", PLAIN[key], "--out", str(out),
            "--steps", str(steps)]
    if PLAIN[key] == "compute":  # one process with one worker's thread, no link
        code, message = run_processes(argv, "torch", 1, threads=1)
    else:
        with shaped(gbps, 2) as ns:
            code, message = run_processes(argv, PLAIN[key], 2, netns=ns)
    if code:
        return {"status": "failed", "error": message}
    return json.loads((out / "results.json").read_text())["summary"]


def run_train(out: Path, overrides: list[str], timeout: float) -> dict:
    """One `compbench train`; returns its summary (or {'status': 'failed', 'error': ...})."""
    cmd = [sys.executable, "-m", "compbench", "train", *overrides, f"output_dir={out}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout:.0f} s"}
    try:
        results = json.loads((out / "results.json").read_text())
        return {**results["summary"], "floors": results.get("floors")}
    except (OSError, ValueError, KeyError):
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {"status": "failed", "error": lines[-1] if lines else f"exit code {proc.returncode}"}


ROW_KEYS = tuple(k for k, _, _ in ROWS)
LINKS = ("shaped", "unshaped")


def _names(value: Any) -> list[str]:
    """A list setting, also when given as one bare name (e2e.rows=dragonn)."""
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def check(e2e: Mapping[str, Any], output: str | None, outputs_root: str) -> dict[str, Any]:
    """`compbench bench mode=e2e`'s settings (the `e2e` group, `output`) as a checked spec for `run`;
    ValueError names the key and the fix. A shaped link needs root and iproute2: checked here too."""
    rows = _names(e2e.get("rows"))
    unknown = [r for r in rows if r not in ROW_KEYS]
    if not rows or unknown:
        raise ValueError(f"e2e.rows={rows} {'has unknown ' + str(unknown) if unknown else 'is empty'}; "
                         f"choose from: {', '.join(ROW_KEYS)}")
    links = _names(e2e.get("links"))
    if not links or any(x not in LINKS for x in links) or len(set(links)) < len(links):
        raise ValueError(f"e2e.links={links}; use [shaped], [unshaped] or [shaped,unshaped]")
    gbps = check_rate("e2e.gbps", e2e.get("gbps"))
    require_int("e2e.steps", e2e.get("steps"), WARMUP_STEPS + 1)  # the median skips the first 5
    require_int("e2e.repeat", e2e.get("repeat"), 1)
    timeout = e2e.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"e2e.timeout={timeout} must be seconds > 0, e.g. 600")
    # Now, not after the matrix ran: a folder that cannot be made, or one holding another matrix's runs.
    if output:
        out = Path(output)
        check_creatable("output", out)
        if out.is_dir() and any(out.iterdir()):
            raise ValueError(f"output={out} exists and is not an empty folder; pass a new output=DIR")
    else:
        check_creatable("outputs_root", Path(outputs_root))
        out = Path(outputs_root) / "bench_e2e" / time.strftime("%Y-%m-%d-%H%M%S")
    if "shaped" in links and not can_shape():
        raise ValueError("e2e.links=[shaped] needs root and iproute2 (a network namespace per run); run as "
                         "root or pass e2e.links=[unshaped]")
    ordered = [x for x in LINKS if x in links]
    return {"rows": rows, "links": ordered, "gbps": gbps, "steps": int(e2e["steps"]),
            "repeat": int(e2e["repeat"]), "timeout": float(timeout), "out": out}


def run(rows: list[str], links: list[str], gbps: float, steps: int, repeat: int, timeout: float,
        out: Path) -> int:
    """Run the matrix `repeat` times, interleaved, print and write the tables; 0 if any row ran."""
    chosen = [r for r in ROWS if r[0] in rows]
    common = [*MODEL, f"max_steps={steps}", f"dataset.train_size={64 * (steps + 1)}"]
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    step_ms: dict[tuple[str, str], list[float]] = {}
    summaries: dict[str, dict] = {}
    for rep in range(repeat):
        for link in links:
            net = [f"net.emulate_gbps={gbps:g}"] if link == "shaped" else []
            for key, label, overrides in chosen:
                name = f"{link}-{key}-{rep}"
                t0 = time.perf_counter()
                if key in PLAIN:
                    summary = run_plain(key, out / name, steps, gbps if net else None)
                else:
                    summary = run_train(out / name, [*common, *overrides, *net], timeout)
                summaries[name] = summary
                ms = summary.get("step_ms") if summary.get("status") == "completed" else None
                if ms is not None:
                    step_ms.setdefault((link, key), []).append(ms)
                shown = f"{ms:.1f} ms/step" if ms is not None else f"FAILED: {summary.get('error')}"
                took = time.perf_counter() - t0
                print(f"[{rep + 1}/{repeat}] {link:8s} {label:36s} {shown}  ({took:.0f} s)", flush=True)
    load_after = os.getloadavg()
    runs = e2e_table.Runs(chosen, links, repeat, step_ms, summaries)
    text = e2e_table.report(runs, gbps, steps, load_before, load_after)
    (out / "table.md").write_text(text + "\n")
    record = {"step_ms": {f"{link}/{key}": v for (link, key), v in step_ms.items()}, "runs": summaries,
              "load_before": load_before, "load_after": load_after,
              "settings": {"rows": rows, "links": links, "gbps": gbps, "steps": steps, "repeat": repeat,
                           "timeout": timeout}}
    (out / "results.json").write_text(json.dumps(record, indent=2, default=str))
    print("\n" + text + f"\n\nwritten: {out / 'table.md'}")
    return 0 if step_ms else 1


if __name__ == "__main__":  # one rank of a plain row (`run_plain` starts it)
    ap = argparse.ArgumentParser()
    ap.add_argument("--plain-worker", choices=["torch", "horovod", "compute"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, required=True)
    args = ap.parse_args()
    plain_worker(args.plain_worker, args.out, args.steps)
