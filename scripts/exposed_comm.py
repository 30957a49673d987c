"""Where the race's exposed communication beyond the wire time comes from (run on an idle machine,
root): `python scripts/exposed_comm.py [--out DIR]`.

The text race's check "exposed communication per exchange <= its wire time + 2 ms" missed by 2-5 ms
for DeMo, 1-bit Adam and SparseLoCo, whose exchanges are small (tens of kB: a few ms of wire). Three
measurements tell the candidates apart:

1. The same training (the text race's DeMo, 1-bit Adam after its warm-up) on the shaped 100 Mbit/s
   link, at 1 Gbit/s and on no shaped link at all: what the step waits for without a link is not the
   link's; of it, the wait for the last rank to get to the exchange (summary `comm_skew_ms`; the
   exposed time less that wait step by step: `comm_exposed_less_skew_ms`); and of the communication
   phase, the CPU work on this machine's cores (`comm_cpu_ms`).
2. A gloo allgather of DeMo's payload between two processes on the shaped link and on an unshaped
   loopback, after a compute phase (a matmul loop of about the model's compute, whose time varies as
   a real one does) and back to back, each rank
   stamping when it enters the collective (CLOCK_MONOTONIC, shared by the processes of one machine):
   rank 0's wait split into the time it waited for rank 1 to arrive (skew) and the rest (gloo and
   the wire), and the same allgather back to back after a barrier (no skew at all).
3. 1-bit Adam's two collectives alone (comm=ps: an all_to_all_single, then an all_gather, its
   152,340 bytes a step split evenly between them) between two processes on an unshaped loopback
   after the compute phase, each rank stamping its entry into each: rank 0's wait at each less the
   other rank's lateness there, gloo's own cost of the pattern without compbench's packing.
4. DeMo's exchange part by part, between two processes on an unshaped loopback after the compute
   phase: its real payload (the text race's GPT through chunk_dct: 104 tensors, 59,904 bytes) framed,
   the gloo all_gather started and waited for, both ranks' frames cut back into tensors, as
   TorchEngine's same-layout gather does them (engines.wire), each part's wall time and the
   process's CPU time (every thread's: gloo's own are in the wait's).

Prints the tables and writes DIR/exposed_comm.json (default outputs/exposed-comm).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compbench.network.netem import ShapedNamespace

# Every probe's compute phase before an exchange: about compute_ms of matmuls a step, the same work
# on both ranks (rank 0's calibration; each rank's own would differ), the machine's own variation.
COMPUTE = r"""
a = torch.randn(256, 256)
t = time.perf_counter()
for _ in range(20):
    a @ a
reps = torch.tensor([max(1, int(compute_ms / ((time.perf_counter() - t) * 1e3 / 20)))])
dist.broadcast(reps, 0)
reps = int(reps)
def compute():
    for _ in range(reps):
        a @ a
"""

PROBE = r"""
import os, statistics, sys, time
import torch, torch.distributed as dist
rank, nbytes, steps = int(os.environ["RANK"]), int(sys.argv[1]), int(sys.argv[2])
compute_ms = float(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29577", rank=rank, world_size=2)
payload = torch.zeros(nbytes // 8, dtype=torch.float64)  # float64: the entry times to the microsecond
""" + COMPUTE + r"""
rows = []
for step in range(steps):
    compute()
    enter = time.monotonic()
    out = [torch.empty_like(payload) for _ in range(2)]
    payload[0] = enter  # each rank's entry time travels in its payload
    dist.all_gather(out, payload)
    done = time.monotonic()
    rows.append((done - enter, float(out[1][0]) - enter))
back = []
for step in range(steps):
    dist.barrier()
    t = time.monotonic()
    dist.all_gather([torch.empty_like(payload) for _ in range(2)], payload)
    back.append(time.monotonic() - t)
if rank == 0:
    waits = [w for w, _ in rows[5:]]
    late = [max(0.0, s) for _, s in rows[5:]]  # how long after rank 0 rank 1 arrived
    rest = [w - s for w, s in zip(waits, late)]
    print(statistics.median(waits) * 1e3, statistics.mean(waits) * 1e3, statistics.mean(late) * 1e3,
          statistics.median(rest) * 1e3, statistics.median(back[5:]) * 1e3)
dist.destroy_process_group()
"""


PARTS = r"""
import os, statistics, sys, time
import torch, torch.distributed as dist
from compbench.compose import config
from compbench.engines import wire
from compbench.race.suites import TEXT
from compbench.seam.build import build_compressor_and_selection, build_model
rank, steps, compute_ms = int(os.environ["RANK"]), int(sys.argv[1]), float(sys.argv[2])
torch.set_num_threads(1)
torch.manual_seed(rank)
cfg = config.check(config.compose([*TEXT.base, *TEXT.methods["demo"], f"output_dir={sys.argv[3]}"]))
model, (comp, selection) = build_model(cfg), build_compressor_and_selection(cfg)
payload = [t for name, p in model.named_parameters() if selection.compresses(p, 1)
           for t in comp.compress(torch.randn_like(p), name)[0]]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29578", rank=rank, world_size=2)
""" + COMPUTE + r"""
parts = {"frame": [], "all_gather started": [], "waited for": [], "both frames cut": []}
def timed(part, fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    parts[part].append(((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3))
    return out
for step in range(steps):
    compute()
    blob = timed("frame", lambda: wire.frame(payload, header=False))
    out = blob.new_empty(2 * blob.numel())
    rows = [out[r * blob.numel() : (r + 1) * blob.numel()] for r in range(2)]
    work = timed("all_gather started", lambda: dist.all_gather(rows, blob, async_op=True))
    timed("waited for", work.wait)
    timed("both frames cut", lambda: [wire.unframe(row, payload, False) for row in rows])
if rank == 0:
    print(len(payload), blob.numel())
    for part, rows in parts.items():
        print(part, statistics.median(w for w, _ in rows[5:]), statistics.median(c for _, c in rows[5:]))
dist.destroy_process_group()
"""


TWO = r"""
import os, statistics, sys, time
import torch, torch.distributed as dist
rank, nbytes, steps = int(os.environ["RANK"]), int(sys.argv[1]), int(sys.argv[2])
compute_ms = float(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29579", rank=rank, world_size=2)
half = nbytes // 2 // 16 * 2  # float64 elements (the entry times to the microsecond), split in 2
""" + COMPUTE + r"""
rows = []
for step in range(steps):
    compute()
    send, out = torch.zeros(half), torch.empty(half)
    enter = time.monotonic()
    send[0] = send[half // 2] = enter  # the first element of each rank's split
    dist.all_to_all_single(out, send)
    first = time.monotonic()
    payload = torch.zeros(half)
    payload[0] = first
    gathered = [torch.empty_like(payload) for _ in range(2)]
    dist.all_gather(gathered, payload)
    done = time.monotonic()
    peer = 1 - rank
    rows.append((first - enter, float(out[peer * (half // 2)]) - enter, done - first,
                 float(gathered[peer][0]) - first))
if rank == 0:
    r = rows[5:]
    for i in (0, 2):
        late = [max(0.0, row[i + 1]) for row in r]
        print(statistics.median(row[i] for row in r) * 1e3, statistics.median(late) * 1e3,
              statistics.median(row[i] - max(0.0, row[i + 1]) for row in r) * 1e3)
dist.destroy_process_group()
"""


def train(out: Path, overrides: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "compbench", "train", *overrides, f"output_dir={out}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-1500:])
    return json.loads((out / "results.json").read_text())["summary"]


def trainings(tmp: Path) -> list[dict]:
    from compbench.race.suites import TEXT

    rows = []
    for method, steps in (("demo", 60), ("onebit-adam", 120)):  # 1-bit Adam compresses after 40 steps
        keys = [*TEXT.base, *TEXT.methods[method], f"max_steps={steps}", "eval=false"]
        for link, extra in (("1 Gbit/s", ["net.emulate_gbps=1"]), ("100 Mbit/s", ["net.emulate_gbps=0.1"]),
                            ("none", [])):
            s = train(tmp / f"{method}-{link.split()[0]}", [*keys, *extra])
            exposed = max(0.0, s["comm_exposed_ms"] - (s.get("decompress_ms") or 0.0))
            gbps = float(extra[0].split("=")[1]) if extra else None
            wire = s["bytes_sent_per_step"] * 8 / (gbps * 1e9) * 1e3 if gbps else 0.0
            waiting = s.get("comm_skew_ms") or 0.0
            less = s.get("comm_exposed_less_skew_ms")  # step by step (the medians' difference keeps the wait)
            less = None if less is None else less - wire
            rows.append({"method": method, "link": link, "exposed ms": exposed, "wire ms": wire,
                         "beyond the wire ms": exposed - wire, "waiting for the last rank ms": waiting,
                         "beyond the wire and the wait ms": exposed - wire - waiting,
                         "beyond the wire and the wait, step by step ms": less,
                         "comm ms": s["comm_ms"], "of it CPU work ms": s.get("comm_cpu_ms"),
                         "compute ms": s["compute_ms"], "bytes/step": s["bytes_sent_per_step"]})
    return rows


def two_ranks(code: str, args: list[object], gbps: float | None = None, env: dict | None = None) -> str:
    """Rank 0's output of `code` run as two processes (RANK 0 and 1) in a namespace of their own,
    its loopback shaped to `gbps` (None: unshaped)."""
    with ShapedNamespace(gbps) as ns:
        procs = [subprocess.Popen([*ns.prefix, sys.executable, "-c", code, *map(str, args)],
                                  env={**os.environ, **(env or {}), "RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        outs = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(outs[0][1][-1500:] + outs[1][1][-1500:])
    return outs[0][0]


def probe(nbytes: int, steps: int, compute_ms: float, mbps: float | None) -> dict:
    # the race's 100 Mbit/s per worker is 2 x on the loopback; None: a loopback of its own, unshaped
    out = two_ranks(PROBE, [nbytes, steps, compute_ms], mbps * 2 / 1e3 if mbps else None)
    median, mean, late, rest, back = map(float, out.split())
    return {"link": f"{mbps:g} Mbit/s" if mbps else "none", "payload bytes": nbytes, "compute ms": compute_ms,
            "wire ms": nbytes * 8 / (mbps * 1e6) * 1e3 if mbps else 0.0,
            "wait median ms": median, "wait mean ms": mean, "rank 1 later by (mean) ms": late,
            "wait less skew ms": rest, "back to back ms": back}


def two_collectives(nbytes: int, steps: int, compute_ms: float) -> list[dict]:
    rows = []
    lines = two_ranks(TWO, [nbytes, steps, compute_ms]).splitlines()
    for name, line in zip(("all_to_all_single", "all_gather"), lines, strict=True):
        wall, late, rest = map(float, line.split())
        rows.append({"collective": name, "bytes": nbytes // 2, "compute ms": compute_ms,
                     "rank 0's wait (median) ms": wall, "the other rank later by (median) ms": late,
                     "wait less the lateness (median) ms": rest})
    return rows


def exchange_parts(steps: int, compute_ms: float, tmp: Path, src: str | None = None) -> list[dict]:
    """The part-by-part probe (PARTS) with this checkout's compbench, or another's `src` folder."""
    lines = two_ranks(PARTS, [steps, compute_ms, tmp / "parts"],
                      env={"PYTHONPATH": src} if src else None).splitlines()
    tensors, nbytes = map(int, lines[0].split())
    rows = []
    for line in lines[1:]:
        part, wall, cpu = line.rsplit(" ", 2)
        rows.append({"compbench": src or "this checkout", "part": part, "tensors": tensors, "bytes": nbytes,
                     "wall ms (median)": float(wall),
                     "process CPU ms (median)": float(cpu)})
    return rows


def main() -> int:
    from tabulate import tabulate

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/exposed-comm")
    parser.add_argument("--compare-src", metavar="DIR",
                        help="another checkout's src/ (an earlier commit's worktree): the part-by-part "
                             "probe runs with it too, alternating with this checkout's, twice each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compbench-exposed-") as tmp:
        runs = trainings(Path(tmp))
        sources = [None, args.compare_src] * 2 if args.compare_src else [None]
        parts = [row for src in sources for row in exchange_parts(120, 150.0, Path(tmp), src)]
        two = [row for ms in (0.0, 150.0) for row in two_collectives(152340, 120, ms)]
    print(tabulate(runs, headers="keys", tablefmt="github", floatfmt=".2f"), "\n", flush=True)
    print(tabulate(parts, headers="keys", tablefmt="github", floatfmt=".3f"), "\n", flush=True)
    print(tabulate(two, headers="keys", tablefmt="github", floatfmt=".2f"), "\n", flush=True)
    probes = [probe(59904, 120, ms, mbps) for mbps in (100.0, None) for ms in (0.0, 150.0)]
    print(tabulate(probes, headers="keys", tablefmt="github", floatfmt=".2f"), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"trainings": runs, "parts": parts, "two collectives": two, "probes": probes}
    (out / "exposed_comm.json").write_text(json.dumps(record, indent=1))
    print(f"exposed comm: {out / 'exposed_comm.json'}; median of the probe's rank-0 waits: "
          f"{statistics.median(p['wait median ms'] for p in probes):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
