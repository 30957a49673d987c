"""The GPU check's sections (scripts/gpu_check.sh runs them and writes the report): compbench's GPU
path proved on the first GPU lent, in one call of at most 7 minutes, so that a second try fits in a
15-minute lease. `--cpu` runs the same sections on the CPU with a small model (a test runs it: the
script cannot rot where CI has no GPU).

    python scripts/gpu_check.py --device cuda --out DIR      # on the GPU machine (gpu_check.sh)
    python scripts/gpu_check.py --device cpu --out DIR       # here: every section, on the CPU

Sections, each timed, each failure written down and the next section run:
1. versions, and which collectives gloo runs on tensors of the device (two processes);
2. the GPU tier (`pytest -m gpu tests/gpu`);
3. every compressor, memory, communicator, scheduler and synchronization mode a few steps on the
   threaded engine (tests/threaded_engine.py) on the device, against the same run on the CPU: the
   same bytes per step, losses within `LOSS_TOLERANCE` (float sums in another order);
4. real jobs: two processes sharing the device over gloo (comm=ring: its hops as a collective where
   gloo has no point-to-point for CUDA tensors), one worker over NCCL (gloo on the CPU), and the
   step's split adding up (`SPLIT_TOLERANCE`) with no step's remainder below 0;
5. a trimmed `compbench bench` on the device;
6. ResNet-50's gradients (25.6M parameters) at ratio 1e-3, one worker: every method's step, its
   bytes against the CPU's on the same gradients, and the targets (dragonn's compress + decompress
   within 5x one device copy of the gradients + 30 us, its step within 1.10x compressor=none's).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.threaded_engine

# The threaded runs' losses on the GPU against the CPU's: the same arithmetic in another order of
# float sums (cuBLAS, atomics in scatter-add) over 3 steps of a small MLP.
LOSS_TOLERANCE = 1e-3
# |compute + compress + comm + decompress + optimizer + other - step| / step of a real job's medians
SPLIT_TOLERANCE = 0.05
DATA = ["dataset=synthetic", "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64",
        "progress=false", "optim.lr_schedule=constant", "batch_size=32", "max_steps=3", "eval_points=1",
        "checkpoint=false"]
COMMON = ["model=mlp", "model.hidden=[32]", *DATA]
# One run of each component (the device-placement test's list: tests/unit/test_device_placement.py).
METHODS = [
    *([f"compressor={c}", "comm=allgather"] for c in ("topk", "dgc", "dragonn", "randk", "graddrop", "qsgd",
                                                      "terngrad", "onebit", "signsgd", "signum", "tbq",
                                                      "atomo", "natural", "rms_sign", "chunk_dct")),
    ["compressor=fp16", "comm=allreduce"],
    ["compressor=powersgd", "comm=allreduce", "compressor.start_iter=2"],
    ["compressor=topk", "comm=allgather", "memory=residual"],
    ["compressor=dragonn", "comm=allgather", "memory=residual"],
    ["compressor=dgc", "comm=allgather", "memory=dgc"],
    ["compressor=efsignsgd", "comm=ps"], ["compressor=fp16", "comm=ring"],
    ["compressor=topk", "comm=allgather", "scheduler=mergecomp"],
    ["compressor=fp16", "comm=ring", "scheduler=secopa", "scheduler.gbps=0.001"],
    ["compressor=topk", "comm=allgather", "optim=adamw"],
    *([f"sync={s}", "optim=adamw", "sync.inner_steps=2"] for s in ("diloco", "noloco", "sparta_diloco")),
    ["sync=sparta", "optim=adamw"], ["sync=demo", "optim=sgd"],
    ["sync=onebit_adam", "optim=adamw", "sync.freeze_step=1"],
    ["sync=onebit_lamb", "optim=adamw", "sync.freeze_step=2"],
    ["experiment=sparseloco", "sync.inner_steps=2"],
    ["precision=bf16", "compressor=topk", "comm=allgather"],
]
# Section 6's methods: (label, overrides); ratio 1e-3 where a compressor has one.
RESNET_METHODS = [
    ("none", ["compressor=none", "comm=allreduce"]),
    ("fp16", ["compressor=fp16", "comm=allreduce"]),
    ("dragonn", ["compressor=dragonn", "ratio=1e-3", "comm=allgather"]),
    ("dragonn+residual", ["compressor=dragonn", "ratio=1e-3", "comm=allgather", "memory=residual"]),
    ("dgc+dgc", ["compressor=dgc", "ratio=1e-3", "comm=allgather", "memory=dgc"]),
    ("topk+residual", ["compressor=topk", "ratio=1e-3", "comm=allgather", "memory=residual"]),
    ("randk", ["compressor=randk", "ratio=1e-3", "comm=allgather"]),
    ("graddrop", ["compressor=graddrop", "ratio=1e-3", "comm=allgather"]),
    ("qsgd", ["compressor=qsgd", "comm=allgather"]),
    ("terngrad", ["compressor=terngrad", "comm=allgather"]),
    ("onebit+residual", ["compressor=onebit", "comm=allgather", "memory=residual"]),
    ("efsignsgd", ["compressor=efsignsgd", "comm=allgather"]),
    ("signum", ["compressor=signum", "comm=allgather"]),
    ("tbq", ["compressor=tbq", "comm=allgather"]),
    ("powersgd", ["compressor=powersgd", "comm=allreduce", "compressor.start_iter=2"]),
    ("atomo", ["compressor=atomo", "comm=allgather"]),
]
# The model of section 6: ResNet-50 on ImageNet-sized synthetic images on a GPU; on the CPU a
# ResNet-18 on small images, so that `--cpu` stays a smoke run.
SCALE = {"cuda": ["model=resnet50", "dataset.image_size=224", "batch_size=32", "dataset.train_size=512"],
         "cpu": ["model=resnet20", "dataset.image_size=16", "batch_size=8", "dataset.train_size=128"]}


class Report:
    """The report's markdown, each section with its time and whether it passed."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.failed: list[str] = []

    def section(self, title: str, fn: Callable[[], str]) -> None:
        start = time.perf_counter()
        try:
            body, ok = fn(), True
        except Exception:  # noqa: BLE001 - the report says what failed; the next section runs
            body, ok = "```\n" + traceback.format_exc()[-3000:] + "```", False
        status = "ok" if ok and "FAILED" not in body else "FAILED"
        if status != "ok":
            self.failed.append(title)
        self.parts.append(f"## {title}: {status} ({time.perf_counter() - start:.0f} s)\n\n{body}\n")
        print(self.parts[-1], flush=True)

    def text(self) -> str:
        verdict = "all sections passed" if not self.failed else f"FAILED: {', '.join(self.failed)}"
        return "\n".join(["# GPU check", "", verdict, "", *self.parts])


# -- 1. versions and gloo's collectives --------------------------------------------------------------


def versions(device: torch.device) -> str:
    lines = [f"- torch {torch.__version__} (CUDA {torch.version.cuda}), Python {sys.version.split()[0]}"]
    if device.type == "cuda":
        import cupy

        props = torch.cuda.get_device_properties(device)
        lines.append(f"- {props.name}, {props.total_memory / 2**30:.0f} GiB, CuPy {cupy.__version__}")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    lines.append(f"- compbench {commit or '(no git)'}; CPU kernels: {_cpu_kernels()}")
    lines.append("")
    lines.append("gloo on " + device.type + " tensors (two processes): " + _gloo_collectives(device))
    return "\n".join(lines)


def _cpu_kernels() -> str:
    from compbench.kernels import cpu

    return cpu.status()


def _gloo_collectives(device: torch.device) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ctx = torch.multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_gloo_rank, args=(r, f"file://{tmp}/store", str(device), out))
                 for r in (0, 1)]
        for p in procs:
            p.start()
        found = out.get(timeout=120)
        for p in procs:
            p.join(timeout=60)
    return ", ".join(f"{op} {'yes' if ok else 'no'}" for op, ok in found.items())


def _gloo_rank(rank: int, init: str, device: str, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    t = torch.ones(4, device=device)
    ops = {"all_reduce": lambda: dist.all_reduce(t.clone()),
           "broadcast": lambda: dist.broadcast(t.clone(), 0),
           "all_gather": lambda: dist.all_gather([torch.empty_like(t) for _ in range(2)], t),
           "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(t), t),
           "send/recv": lambda: dist.send(t, 1) if rank == 0 else dist.recv(torch.empty_like(t), 0)}
    found = {}
    for name, op in ops.items():
        try:
            op()
            found[name] = True
        except (RuntimeError, ValueError):
            found[name] = False
        dist.barrier()  # a failed op on one rank must not leave the other waiting inside the next
    if rank == 0:
        out.put(found)
    dist.destroy_process_group()


# -- 2. the GPU tier ----------------------------------------------------------------------------------


def gpu_tier(timeout: float) -> str:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p",
                           "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    ok = proc.returncode in (0, 5)  # 5: nothing collected (no CUDA: every test skipped at collection)
    return ("" if ok else "FAILED\n") + f"```\n{tail}\n```"


# -- 3. every method on the threaded engine, device against CPU ---------------------------------------


def threaded_methods(device: torch.device) -> str:
    rows, bad = ["| run | bytes/step (device) | CPU | max loss difference |", "|---|---|---|---|"], 0
    for run in METHODS:
        try:
            got = _threaded(run, device)
            want = _threaded(run, torch.device("cpu")) if device.type != "cpu" else got
        except Exception as e:  # noqa: BLE001 - one row's failure, in its row
            bad += 1
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(f"| {' '.join(run)} | FAILED: {why} | | |")
            continue
        same = got["bytes"] == want["bytes"]
        diff = max((abs(a - b) for a, b in zip(got["loss"], want["loss"], strict=True)), default=0.0)
        ok = same and diff <= LOSS_TOLERANCE and all(math.isfinite(x) for x in got["loss"])
        bad += not ok
        rows.append(f"| {' '.join(run)} | {got['bytes']} | {want['bytes']}{'' if same else ' FAILED'} | "
                    f"{diff:.2e}{'' if diff <= LOSS_TOLERANCE else ' FAILED'} |")
    head = f"{len(METHODS) - bad} of {len(METHODS)} runs as on the CPU (2 thread ranks, 3 steps each)"
    return head + "\n\n" + "\n".join(rows)


def _threaded(run: list[str], device: torch.device) -> dict:
    from tests.threaded_engine import ThreadWorld

    from compbench.compose import config
    from compbench.train.loop import Trainer

    cfg = config.check(config.compose([*COMMON, *run, f"device={device.type}", "engine.np=2"]))
    with tempfile.TemporaryDirectory() as tmp:
        def rank(engine):
            trainer = Trainer(cfg, engine, Path(tmp))
            trainer.fit()
            return trainer.recorder.history if trainer.recorder else None

        history = ThreadWorld(2, device=device).run(rank, name=cfg.choices["engine"])[0]
    return {"bytes": [int(b) for b in history["comm/bytes_sent"]], "loss": list(history["train/loss"])}


# -- 4. real jobs ----------------------------------------------------------------------------------


def _scalars(run_dir: Path, tag: str) -> list[float]:
    """A run's TensorBoard series `tag`, one value a step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return [e.value for e in EventAccumulator(str(run_dir / "tb")).Reload().Scalars(tag)]


def real_jobs(device: torch.device) -> str:
    jobs = {"2 processes sharing the device over gloo (comm=ring)":
            ["engine=torch", "engine.np=2", "compressor=fp16", "comm=ring", f"device={device.type}"],
            "2 processes, top-k over allgather":
            ["engine=torch", "engine.np=2", "compressor=topk", "ratio=0.01", "comm=allgather",
             "memory=residual", f"device={device.type}"],
            "1 worker over " + ("NCCL" if device.type == "cuda" else "gloo"):
            ["engine=torch", "engine.np=1", f"device={device.type}",
             f"engine.backend={'nccl' if device.type == 'cuda' else 'gloo'}"]}
    rows = ["| job | status | step ms | split sum ms | split off by |", "|---|---|---|---|---|"]
    for label, overrides in jobs.items():
        run_dir = Path(tempfile.mkdtemp(prefix="gpu-check-job-"))  # not $OUT: only the report comes back
        proc = subprocess.run([sys.executable, "-m", "compbench", "train", *COMMON, "max_steps=12",
                               "eval_points=2", *overrides, f"output_dir={run_dir}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1][:160]
            rows.append(f"| {label} | FAILED: {last} | | | |")
            continue
        s = json.loads((run_dir / "results.json").read_text())["summary"]
        parts = sum(s[f"{p}_ms"] for p in ("compute", "compress", "comm", "decompress", "optimizer", "other"))
        off = abs(parts - s["step_ms"]) / s["step_ms"]
        # every step's own remainder (time/other_ms) >= 0: no phase timed twice. The summary's other_ms,
        # the step's median less the phases' medians, can dip below 0 by noise alone over 12 steps.
        nested = min(_scalars(run_dir, "time/other_ms")) >= 0
        rows.append(f"| {label} | ok | {s['step_ms']:.2f} | {parts:.2f} | {100 * off:.1f}%"
                    f"{'' if off <= SPLIT_TOLERANCE and nested else ' FAILED'} |")
    return "\n".join(rows)


# -- 5. the micro-benchmark ---------------------------------------------------------------------------


def bench(device: torch.device, out: Path, cpu: bool) -> str:
    sizes = "[1048576]" if cpu else "[1048576,25000000]"
    compressors = "[none,topk,dgc,dragonn,qsgd,onebit]"
    proc = subprocess.run([sys.executable, "-m", "compbench", "bench", f"device={device.type}",
                           f"sizes={sizes}", f"compressors={compressors}", "repeats=7",
                           f"output={out / 'bench.json'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
    return ("" if proc.returncode == 0 else "FAILED\n") + f"```\n{tail}\n```"


# -- 6. ResNet-50's gradients: every method's step and bytes, the targets ----------------------------


def resnet_methods(device: torch.device) -> str:
    from tests.threaded_engine import ThreadWorld

    from compbench.compose import config

    scale = SCALE[device.type]
    steps = 8 if device.type == "cuda" else 3
    rows = ["| method | step ms | compress + decompress ms | bytes/step | CPU bytes, same gradients |",
            "|---|---|---|---|---|"]
    measured: dict[str, dict] = {}
    for label, overrides in RESNET_METHODS:
        cfg = config.check(config.compose([*DATA, *scale, *overrides, f"max_steps={steps}", "eval=false",
                                           "dataset.test_size=32", f"device={device.type}", "engine.np=1"]))
        with tempfile.TemporaryDirectory() as tmp:
            history, cpu_bytes = ThreadWorld(1, device=device).run(partial(_one_worker, cfg, Path(tmp)),
                                                                    name="torch")[0]
        skip = min(3, steps - 1)
        step = _median(history["time/step_ms"][skip:])
        codec = _median([a + b for a, b in zip(history["time/compress_ms"][skip:],
                                                history["time/decompress_ms"][skip:], strict=True)])
        sent = int(history["comm/bytes_sent"][-1])
        measured[label] = {"step": step, "codec": codec}
        same = cpu_bytes is None or cpu_bytes[0] == cpu_bytes[1]
        rows.append(f"| {label} | {step:.2f} | {codec:.3f} | {sent} | "
                    f"{'-' if cpu_bytes is None else cpu_bytes[1]}{'' if same else ' FAILED'} |")
    copy_ms = _device_copy_ms(sum(p for p in _param_counts(scale)), device)
    targets = []
    if "dragonn" in measured and "none" in measured:
        codec_bound = 5 * copy_ms + 0.030
        step_ratio = measured["dragonn"]["step"] / measured["none"]["step"]
        targets = [f"- dragonn's compress + decompress {measured['dragonn']['codec']:.3f} ms against 5 x one "
                   f"device copy of the gradients ({copy_ms:.3f} ms) + 30 us = {codec_bound:.3f} ms: "
                   f"{'met' if measured['dragonn']['codec'] <= codec_bound else 'missed'}",
                   f"- dragonn's step {step_ratio:.3f}x compressor=none's (target <= 1.10x): "
                   f"{'met' if step_ratio <= 1.10 else 'missed'}"]
    model = scale[0].split("=")[1]
    return (f"{model}, one worker, {steps} steps per method (the median after the first {min(3, steps - 1)});"
            " bytes of the last step\n\n" + "\n".join(rows) + "\n\nTargets (recorded, not gated):\n"
            + "\n".join(targets))


def _one_worker(cfg, run_dir: Path, engine) -> tuple[dict, tuple[int, int] | None]:
    """Train one worker; its recorder's history and its last gradients' bytes on the device and CPU."""
    from compbench.train.loop import Trainer

    trainer = Trainer(cfg, engine, run_dir)
    trainer.fit()
    assert trainer.recorder is not None
    grads = [(n, p.grad.detach().clone()) for n, p in trainer.model.named_parameters() if p.grad is not None]
    return trainer.recorder.history, _bytes_on_cpu(trainer, grads)


def _bytes_on_cpu(trainer, grads) -> tuple[int, int] | None:
    """(wire bytes of this step's gradients through the run's compressor on its device, the same on
    the CPU): both compress the same tensors, so a compressor's bytes must agree."""
    import copy

    pipeline = trainer.pipeline
    # ATOMO keeps atoms with probabilities from an SVD, whose rounding differs between devices: its
    # atom count, and so its bytes, may differ by design (it stays unbiased on either).
    if pipeline is None or trainer.device.type == "cpu" or pipeline.compressor.name == "atomo":
        return None
    totals = []
    for where in (trainer.device, torch.device("cpu")):
        comp = copy.deepcopy(pipeline.compressor)
        comp.begin_step(trainer.step, 1.0)
        total = 0
        for name, g in grads:
            payload, _ = comp.compress(g.to(where), name)
            total += sum(t.numel() * t.element_size() for t in payload)
        totals.append(total)
    return totals[0], totals[1]


def _param_counts(scale: list[str]) -> list[int]:
    from compbench.compose import config
    from compbench.seam.build import build_model

    cfg = config.compose([*DATA, *scale])
    with torch.device("meta"):
        return [p.numel() for p in build_model(cfg).parameters()]


def _device_copy_ms(numel: int, device: torch.device) -> float:
    x = torch.empty(numel, device=device)
    y = torch.empty_like(x)
    times = []
    for _ in range(10):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        y.copy_(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return _median(times[2:])


def _median(values: list[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    cpu = device.type == "cpu"
    report = Report()
    report.section("1. versions and gloo's collectives", lambda: versions(device))
    report.section("2. GPU tier (pytest -m gpu)", lambda: gpu_tier(timeout=100 if cpu else 150))
    report.section("3. every method on the threaded engine, against the CPU",
                   lambda: threaded_methods(device))
    report.section("4. real jobs and the step's split", lambda: real_jobs(device))
    report.section("5. compbench bench", lambda: bench(device, args.out, cpu))
    report.section("6. ResNet-50's gradients: every method", lambda: resnet_methods(device))
    (args.out / "report.md").write_text(report.text())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
