"""The GPU check's sections (scripts/gpu_check.sh runs them and writes the report): compbench's GPU
path proved on the first GPU lent, in one call, within `ESTIMATE_S` (6 minutes, printed first) by
its own estimate, so that a rerun fits in a 15-minute lease. `--cpu` runs the same sections on the
CPU with a small model (a test runs it: the script cannot rot where CI has no GPU), and
tests/unit/test_gpu_check_configs.py composes every configuration here under a faked CUDA.

    python scripts/gpu_check.py --device cuda --out DIR      # on the GPU machine (gpu_check.sh)
    python scripts/gpu_check.py --device cpu --out DIR       # here: every section, on the CPU

Sections, each with a budget (`BUDGET_S`): what cannot finish inside it is skipped and the report
says so; report.md is rewritten after every section (a time-out leaves what finished):
1. versions, and which collectives gloo runs on tensors of the device (two daemon processes, every
   wait bounded; a failed or hung probe is a row);
2. the GPU tier (`pytest -m gpu tests/gpu -rs`): on a GPU a skipped or uncollected test fails it;
3. every compressor, memory, communicator, scheduler and synchronization mode N steps of a small CNN
   on the threaded engine (tests/threaded_engine.py, engine=torch) on the device, against the same
   run on the CPU: the same bytes per step and parameters within `PARAM_TOLERANCE` (max |delta|),
   except the rows of `DEVICE_DRAWS` (compared on statistics); each row records which kernels ran;
4. real jobs: two processes sharing the device over gloo (comm=ring: its hops as a collective where
   gloo has no point-to-point for CUDA tensors), one worker over NCCL (gloo on the CPU), and the
   step's split: no step's phases above the step, the steps' sum within the host's wall clock;
5. a trimmed `compbench bench` on the device;
6. ResNet-50's gradients (25.6M parameters) at ratio 1e-3, one worker: every method's step, and the
   bytes of the step's real gradients (captured when backward ends, before compression) through the
   method's compressor on the device against the CPU; the targets (dragonn's compress + decompress
   within 5x one device copy of the gradients + 30 us, its step within 1.10x compressor=none's).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing
import queue
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.threaded_engine

# Each section's budget on a GPU (seconds): their sum is the estimate printed first. The device
# tool's lease is 15 minutes, a start costs 1-2: 2 + 6 (this) + a rerun's 6 fit, with
# gpu_check.sh's hard bound (390 s) just above the estimate.
BUDGET_S = {1: 20, 2: 80, 3: 100, 4: 50, 5: 40, 6: 70}
ESTIMATE_S = sum(BUDGET_S.values())  # 360 s
# Section 3's parameters on the GPU against the CPU after `STEPS` steps (TF32 off for the check):
# the same arithmetic in another order of float sums (cuDNN's convolutions, atomics in scatter-add);
# a sign or a top-k selection that flips on a near tie moves one entry by about lr x its value.
PARAM_TOLERANCE = 1e-3
STEPS = 3
# Rows whose random draws come from the device's generator, so that their bytes (and parameters)
# differ from the CPU's by design: compared on statistics, the bytes (kept elements) of all steps
# within `DRAW_TOLERANCE` of the CPU's; their max |delta| is recorded, not gated.
DEVICE_DRAWS = {
    "compressor=graddrop": "the threshold's sample: a generator on the tensor's device",
    "sync=sparta": "the Bernoulli masks: drawn on the parameters' device (as ExoGym draws them)",
    "sync=sparta_diloco": "SPARTA's masks, as sync=sparta",
    "compressor=atomo": "the atoms kept: probabilities from an SVD whose rounding is the device's",
}
# Stochastic rounding that shares the counter-based stream only where a kernel runs on both devices
# (the CUDA kernel and the compiled CPU one); with a twin on either side, its draws are the device's.
KERNEL_STREAMS = ("compressor=qsgd", "compressor=terngrad")
DRAW_TOLERANCE = 0.25
# A row or section left out at its deadline says this (the report's verdict lists where).
SPENT = "SKIPPED: the section's budget is spent"
# A real job's steps summed (CUDA events on a GPU) against the host's wall clock of its training
# (`train_s`, rounded to 1 ms in results.json)
SPLIT_TOLERANCE = 0.05
DATA = ["dataset=synthetic", "dataset.image_size=8", "dataset.train_size=256", "dataset.test_size=64",
        "progress=false", "optim.lr_schedule=constant", "batch_size=32", "max_steps=3", "eval_points=1",
        "checkpoint=false"]
# engine=torch everywhere: the default engine (Horovod) is absent on the lent machine, and with
# device=cuda its CUDA check (engines/device.py) would refuse every configuration.
ENGINE = "engine=torch"
COMMON = ["model=mlp", "model.hidden=[32]", *DATA]
# Section 3's model: real layers (two convolutions, pooling, two linear layers) on 8x8 images.
CNN = ["model=cnn", "model.width=8", "model.hidden=32", *DATA]
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
    """The report's markdown, each section with its budget, its time and whether it passed; written
    to `path` after every section."""

    def __init__(self, path: Path, device: str) -> None:
        self.path, self.device = path, device
        self.parts: list[str] = []
        self.failed: list[str] = []
        self.skipped: list[str] = []
        self.started = time.monotonic()
        self.write()

    def section(self, number: int, title: str, fn: Callable[[float], str]) -> None:
        """Run `fn(deadline)` (a time.monotonic() it must not pass) unless the whole check's budget
        is spent; its text, or its traceback, goes into the report, which is written at once."""
        budget = BUDGET_S[number]
        start = time.monotonic()
        label = f"{number}. {title}"
        if start - self.started > ESTIMATE_S + 30:  # far behind the estimate: leave room for the rest
            self.skipped.append(label)
            self.parts.append(f"## {label}: SKIPPED (the check's {ESTIMATE_S} s are spent)\n")
            self.write()
            return
        try:
            body, ok = fn(start + budget), True
        except Exception:  # noqa: BLE001 - the report says what failed; the next section runs
            body, ok = "```\n" + traceback.format_exc()[-3000:] + "```", False
        took = time.monotonic() - start
        status = "ok" if ok and "FAILED" not in body else "FAILED"
        if status != "ok":
            self.failed.append(label)
        if SPENT in body:
            self.skipped.append(label)
        over = f", over its {budget} s budget" if took > budget else ""
        self.parts.append(f"## {label}: {status} ({took:.0f} s of {budget}{over})\n\n{body}\n")
        print(self.parts[-1], flush=True)
        self.write()

    def text(self) -> str:
        verdict = "all sections passed" if not self.failed else f"FAILED: {', '.join(self.failed)}"
        if self.skipped:
            verdict += f"; some rows or sections SKIPPED at their deadline: {', '.join(self.skipped)}"
        clock = f"device {self.device}; {estimate()}; {time.monotonic() - self.started:.0f} s so far"
        return "\n".join(["# GPU check", "", verdict, "", clock, "", *self.parts])

    def write(self) -> None:
        self.path.write_text(self.text())


def estimate() -> str:
    """The check's own estimate, section by section."""
    parts = ", ".join(f"section {k} {v} s" for k, v in BUDGET_S.items())
    return f"estimate {ESTIMATE_S} s on a GPU ({parts})"


def left(deadline: float) -> float:
    """Seconds until `deadline` (time.monotonic())."""
    return deadline - time.monotonic()


# -- 1. versions and gloo's collectives --------------------------------------------------------------


def versions(device: torch.device, deadline: float) -> str:
    lines = [f"- torch {torch.__version__} (CUDA {torch.version.cuda}), Python {sys.version.split()[0]}"]
    if device.type == "cuda":
        import cupy

        props = torch.cuda.get_device_properties(device)
        lines.append(f"- {props.name}, {props.total_memory / 2**30:.0f} GiB, CuPy {cupy.__version__}")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, timeout=10).stdout.strip()
    lines.append(f"- compbench {commit or '(no git)'}; CPU kernels: {_cpu_kernels()}")
    lines.append("")
    lines.append(f"gloo on {device.type} tensors (two processes): {_gloo_collectives(device, deadline)}")
    return "\n".join(lines)


def _cpu_kernels() -> str:
    from compbench.kernels import cpu

    return cpu.status()


# The probe's collectives. Point-to-point is probed on host tensors only: gloo's send/recv takes no
# CUDA tensors, and compbench never asks it to (the ring hop takes an all-to-all for CUDA over gloo,
# engines/torch_dist.py `shift`), so a CUDA probe would only risk a rank left waiting.
PROBES = ("all_reduce", "broadcast", "all_gather", "all_to_all", "send/recv (host tensors)")


def _gloo_collectives(device: torch.device, deadline: float) -> str:
    """Which of `PROBES` gloo runs on `device` tensors: two daemon processes (a hung rank dies with
    this one), each operation under the process group's timeout, every wait here bounded by
    `deadline`; a probe that does not answer is a FAILED row, not a hang."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = ctx.Queue()
        op_timeout = max(2.0, min(10.0, left(deadline) / 3))
        procs = [ctx.Process(target=_gloo_rank, args=(r, f"file://{tmp}/store", str(device), op_timeout, out),
                             daemon=True) for r in (0, 1)]
        for p in procs:
            p.start()
        try:
            found = out.get(timeout=max(1.0, left(deadline) - 1))
        except queue.Empty:
            found = None
        finally:
            for p in procs:
                p.join(timeout=max(0.5, min(3.0, left(deadline))))
                if p.is_alive():
                    p.kill()
    if found is None:
        return f"FAILED: the probe did not answer within the section's budget (op timeout {op_timeout:.0f} s)"
    return ", ".join(f"{op} {'yes' if ok else 'no'}" for op, ok in found.items())


def _gloo_rank(rank: int, init: str, device: str, op_timeout: float, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                            timeout=timedelta(seconds=op_timeout))
    t = torch.ones(4, device=device)
    host = torch.ones(4)
    ops = {"all_reduce": lambda: dist.all_reduce(t.clone()),
           "broadcast": lambda: dist.broadcast(t.clone(), 0),
           "all_gather": lambda: dist.all_gather([torch.empty_like(t) for _ in range(2)], t),
           "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(t), t),
           PROBES[-1]: lambda: dist.send(host, 1) if rank == 0 else dist.recv(torch.empty_like(host), 0)}
    found = {}
    for name, op in ops.items():
        try:
            op()
            # a failed op on one rank must not leave the other waiting inside the next: the barrier
            # is inside the try (a barrier that times out marks the op failed, not the probe dead)
            dist.barrier()
            found[name] = True
        except (RuntimeError, ValueError, NotImplementedError):
            found[name] = False
    if rank == 0:
        out.put(found)
    try:
        dist.destroy_process_group()
    except RuntimeError:
        pass


# -- 2. the GPU tier ----------------------------------------------------------------------------------


def gpu_tier(device: torch.device, deadline: float) -> str:
    """`pytest -m gpu tests/gpu -rs`. Without CUDA every test skips (exit 5 or skips: fine); on a GPU
    a skip (CuPy missing, the CPU kernels not built) or nothing collected fails the section: a tier
    that did not run proves nothing."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "tests/gpu", "-p",
                           "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True,
                          timeout=max(5.0, left(deadline)))
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    counts = _pytest_counts(lines[-1] if lines else "")
    skip_lines = [line for line in lines if line.startswith("SKIPPED")]
    if device.type == "cuda":
        ok = proc.returncode == 0 and counts.get("passed", 0) > 0 and not counts.get("skipped", 0)
    else:
        ok = proc.returncode in (0, 5)  # 5: nothing collected (no CUDA: every test skipped at collection)
    summary = (f"passed {counts.get('passed', 0)}, failed {counts.get('failed', 0)}, skipped "
               f"{counts.get('skipped', 0)}, exit {proc.returncode}")
    shown = lines[-12:]
    tail = "\n".join([*[line for line in skip_lines[:8] if line not in shown], *shown])
    return ("" if ok else "FAILED\n") + summary + f"\n```\n{tail}\n```"


def _pytest_counts(last: str) -> dict[str, int]:
    """{'passed': 3, 'skipped': 2, ...} of pytest's last line (`3 passed, 2 skipped in 1.2s`)."""
    counts: dict[str, int] = {}
    for part in last.replace("=", " ").split(","):
        words = part.split()
        if len(words) >= 2 and words[0].isdigit():
            counts[words[1]] = int(words[0])
    return counts


# -- 3. every method on the threaded engine, device against CPU ---------------------------------------


def threaded_config(run: list[str], device: str) -> list[str]:
    """Section 3's overrides of one row."""
    return [*CNN, ENGINE, *run, f"max_steps={STEPS}", f"device={device}", "engine.np=2"]


def device_draws(run: list[str], kernels_on_both: bool) -> str | None:
    """Why this row's random draws are the device's (so compared on statistics), None if shared."""
    why = next((DEVICE_DRAWS[o] for o in run if o in DEVICE_DRAWS), None)
    if why is None and not kernels_on_both and any(o in KERNEL_STREAMS for o in run):
        why = "stochastic rounding: the counter-based stream needs a kernel on both devices"
    return why


def threaded_methods(device: torch.device, deadline: float) -> str:
    from compbench.engines.device import cupy_importable
    from compbench.kernels import cpu

    kernels_on_both = device.type == "cpu" or (cupy_importable() and cpu.status().startswith("compiled"))
    rows = ["| run | kernels (device) | bytes/step (device) | CPU | params max abs delta | compared |",
            "|---|---|---|---|---|---|"]
    bad = done = 0
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    # TF32 off: the check compares compbench's arithmetic, not TF32's 10-bit mantissas
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for run in METHODS:
            label = " ".join(run)
            if left(deadline) < 2:
                rows.append(f"| {label} | {SPENT} | | | | |")
                continue
            try:
                got = _threaded(run, device)
                want = _threaded(run, torch.device("cpu")) if device.type != "cpu" else got
            except Exception as e:  # noqa: BLE001 - one row's failure, in its row
                bad += 1
                why = f"{type(e).__name__}: {(str(e).splitlines() or ['?'])[0][:120]}"
                rows.append(f"| {label} | | FAILED: {why} | | | |")
                continue
            done += 1
            ok, cells = _compare_row(got, want, device_draws(run, kernels_on_both))
            bad += not ok
            rows.append(f"| {label} | {_kernels(got['kernels'])} | {cells} |")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    head = (f"{done - bad} of {len(METHODS)} runs as on the CPU (2 thread ranks, {STEPS} steps of a CNN each;"
            " "
            f"parameters within {PARAM_TOLERANCE:g}, device-specific draws: bytes within "
            f"{100 * DRAW_TOLERANCE:.0f}%)")
    return head + "\n\n" + "\n".join(rows)


def _compare_row(got: dict, want: dict, draws: str | None) -> tuple[bool, str]:
    """(row passed, its cells from the device's bytes on): exact bytes and parameters within
    PARAM_TOLERANCE, or for device-specific draws the total bytes within DRAW_TOLERANCE."""
    delta = max((float((a - b).abs().max()) for a, b in zip(got["params"], want["params"], strict=True)
                 if a.numel()), default=0.0)
    finite = all(math.isfinite(x) for x in got["loss"]) and math.isfinite(delta)
    if draws is None:
        same = got["bytes"] == want["bytes"]
        close = delta <= PARAM_TOLERANCE
        ok = same and close and finite
        return ok, (f"{got['bytes']} | {want['bytes']}{'' if same else ' FAILED'} | "
                    f"{delta:.2e}{'' if close else ' FAILED'} | bytes, parameters")
    total, cpu_total = sum(got["bytes"]), sum(want["bytes"])
    off = abs(total - cpu_total) / max(cpu_total, 1)
    ok = off <= DRAW_TOLERANCE and finite
    return ok, (f"{got['bytes']} | {want['bytes']} ({100 * off:.1f}% off{'' if ok else ' FAILED'}) | "
                f"{delta:.2e} (not gated) | statistics: {draws}")


def _kernels(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _threaded(run: list[str], device: torch.device) -> dict:
    from tests.threaded_engine import ThreadWorld

    from compbench.compose import config
    from compbench.kernels import record
    from compbench.train.loop import Trainer

    cfg = config.check(config.compose(threaded_config(run, device.type)))
    before = record.snapshot()
    with tempfile.TemporaryDirectory() as tmp:
        def rank(engine):
            trainer = Trainer(cfg, engine, Path(tmp))
            trainer.fit()
            params = [p.detach().float().cpu() for p in trainer.model.parameters()]
            return (trainer.recorder.history if trainer.recorder else None), params

        history, params = ThreadWorld(2, device=device).run(rank, name=cfg.choices["engine"])[0]
    return {"bytes": [int(b) for b in history["comm/bytes_sent"]], "loss": list(history["train/loss"]),
            "params": params, "kernels": record.since(before)}


# -- 4. real jobs ----------------------------------------------------------------------------------


def _scalars(run_dir: Path, tag: str) -> list[float]:
    """A run's TensorBoard series `tag`, one value a step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return [e.value for e in EventAccumulator(str(run_dir / "tb")).Reload().Scalars(tag)]


def real_jobs_config(device: str) -> dict[str, list[str]]:
    """Section 4's jobs: label -> overrides (beyond COMMON)."""
    return {"2 processes sharing the device over gloo (comm=ring)":
            [ENGINE, "engine.np=2", "compressor=fp16", "comm=ring", f"device={device}"],
            "2 processes, top-k over allgather":
            [ENGINE, "engine.np=2", "compressor=topk", "ratio=0.01", "comm=allgather",
             "memory=residual", f"device={device}"],
            "1 worker over " + ("NCCL" if device == "cuda" else "gloo"):
            [ENGINE, "engine.np=1", f"device={device}",
             f"engine.backend={'nccl' if device == 'cuda' else 'gloo'}"],
            # FSDP2 on the device: compbench's quantized all-gather and reduce-scatter, the memory
            # figures from the device's allocator
            "1 worker, sharding=fsdp (int8 weights, int4 gradients) over " + ("NCCL" if device == "cuda"
                                                                                else "gloo"):
            [ENGINE, "engine.np=1", f"device={device}", "sharding=fsdp", "sharding.gather=int8",
             "sharding.scatter=int4", f"engine.backend={'nccl' if device == 'cuda' else 'gloo'}"]}


JOB_STEPS = ["max_steps=12", "eval_points=2"]


def real_jobs(device: torch.device, deadline: float) -> str:
    rows = ["| job | status | step ms | steps' sum ms | host's training ms | max phases - step ms |",
            "|---|---|---|---|---|---|"]
    for label, overrides in real_jobs_config(device.type).items():
        if left(deadline) < 5:
            rows.append(f"| {label} | {SPENT} | | | | |")
            continue
        run_dir = Path(tempfile.mkdtemp(prefix="gpu-check-job-"))  # not $OUT: only the report comes back
        try:
            proc = subprocess.run([sys.executable, "-m", "compbench", "train", *COMMON, *JOB_STEPS,
                                   *overrides, f"output_dir={run_dir}"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=max(5.0, left(deadline)))
        except subprocess.TimeoutExpired:
            rows.append(f"| {label} | FAILED: not done at the section's deadline | | | | |")
            continue
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1][:160]
            rows.append(f"| {label} | FAILED: {last} | | | | |")
            continue
        rows.append(f"| {label} | {_split_cells(run_dir)} |")
    return "\n".join(rows)


def _split_cells(run_dir: Path) -> str:
    """The step's split, checked where it can fail: no step's phases (timed with CUDA events on a
    GPU) above its step (`time/other_ms` >= 0 on every step), and the steps' sum within the host's
    wall clock of the training (`train_s`, rounded to 1 ms: +2 ms)."""
    s = json.loads((run_dir / "results.json").read_text())["summary"]
    steps = _scalars(run_dir, "time/step_ms")
    over = -min(_scalars(run_dir, "time/other_ms"))  # max over steps of (phases - step)
    host_ms = 1000 * s["train_s"]
    total = sum(steps)
    nested = over <= 1e-6
    within = total <= host_ms * (1 + SPLIT_TOLERANCE) + 2.0
    return (f"ok | {s['step_ms']:.2f} | {total:.1f}{'' if within else ' FAILED'} | {host_ms:.0f} | "
            f"{over:.3f}{'' if nested else ' FAILED'}")


# -- 5. the micro-benchmark ---------------------------------------------------------------------------


def bench(device: torch.device, out: Path, deadline: float) -> str:
    sizes = "[1048576]" if device.type == "cpu" else "[1048576,25000000]"
    compressors = "[none,topk,dgc,dragonn,qsgd,onebit]"
    try:
        proc = subprocess.run([sys.executable, "-m", "compbench", "bench", f"device={device.type}",
                               f"sizes={sizes}", f"compressors={compressors}", "repeats=7",
                               f"output={out / 'bench.json'}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=max(5.0, left(deadline)))
    except subprocess.TimeoutExpired:
        return f"FAILED: not done at the section's deadline ({SPENT})"
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
    return ("" if proc.returncode == 0 else "FAILED\n") + f"```\n{tail}\n```"


# -- 6. ResNet-50's gradients: every method's step and bytes, the targets ----------------------------


def resnet_config(device: str, overrides: list[str], steps: int) -> list[str]:
    """Section 6's overrides of one method."""
    return [*DATA, *SCALE[device], ENGINE, *overrides, f"max_steps={steps}", "eval=false",
            "dataset.test_size=32", f"device={device}", "engine.np=1"]


def resnet_methods(device: torch.device, deadline: float) -> str:
    from tests.threaded_engine import ThreadWorld

    from compbench.compose import config

    steps = 8 if device.type == "cuda" else 3
    rows = ["| method | step ms | compress + decompress ms | bytes/step | captured at step | device bytes | "
            "CPU bytes, same gradients |", "|---|---|---|---|---|---|---|"]
    measured: dict[str, dict] = {}
    for label, overrides in RESNET_METHODS:
        if left(deadline) < 3:
            rows.append(f"| {label} | {SPENT} | | | | | |")
            continue
        cfg = config.check(config.compose(resnet_config(device.type, overrides, steps)))
        with tempfile.TemporaryDirectory() as tmp:
            history, capture = ThreadWorld(1, device=device).run(partial(_one_worker, cfg, Path(tmp)),
                                                                  name="torch")[0]
        skip = min(3, steps - 1)
        step = _median(history["time/step_ms"][skip:])
        codec = _median([a + b for a, b in zip(history["time/compress_ms"][skip:],
                                                history["time/decompress_ms"][skip:], strict=True)])
        sent = int(history["comm/bytes_sent"][-1])
        measured[label] = {"step": step, "codec": codec}
        rows.append(f"| {label} | {step:.2f} | {codec:.3f} | {sent} | {_capture_cells(label, capture)} |")
    copy_ms = _device_copy_ms(sum(p for p in _param_counts(SCALE[device.type])), device)
    targets = []
    if "dragonn" in measured and "none" in measured:
        codec_bound = 5 * copy_ms + 0.030
        step_ratio = measured["dragonn"]["step"] / measured["none"]["step"]
        targets = [f"- dragonn's compress + decompress {measured['dragonn']['codec']:.3f} ms against 5 x one "
                   f"device copy of the gradients ({copy_ms:.3f} ms) + 30 us = {codec_bound:.3f} ms: "
                   f"{'met' if measured['dragonn']['codec'] <= codec_bound else 'missed'}",
                   f"- dragonn's step {step_ratio:.3f}x compressor=none's (target <= 1.10x): "
                   f"{'met' if step_ratio <= 1.10 else 'missed'}"]
    model = SCALE[device.type][0].split("=")[1]
    return (f"{model}, one worker, {steps} steps per method (the median after the first {min(3, steps - 1)});"
            " "
            "bytes of the last step; the step's real gradients captured when backward ends (before "
            "memory and compression) and compressed by a fresh copy of the method's compressor on the "
            f"device and on the CPU (device-specific draws: within {100 * DRAW_TOLERANCE:.0f}%)\n\n"
            + "\n".join(rows) + "\n\nTargets (recorded, not gated):\n" + "\n".join(targets))


def _capture_cells(label: str, capture: dict | None) -> str:
    if capture is None:
        return "- | - | - (no compressor)"
    device_bytes, cpu_bytes = capture["bytes"]
    draws = next((DEVICE_DRAWS[o] for o in dict(RESNET_METHODS)[label] if o in DEVICE_DRAWS), None)
    if draws is None:
        verdict = "" if device_bytes == cpu_bytes else " FAILED"
    else:
        off = abs(device_bytes - cpu_bytes) / max(cpu_bytes, 1)
        verdict = f" ({100 * off:.1f}% off, {draws}){'' if off <= DRAW_TOLERANCE else ' FAILED'}"
    return f"{capture['step']} ({capture['tensors']} gradients) | {device_bytes} | {cpu_bytes}{verdict}"


def _one_worker(cfg, run_dir: Path, engine) -> tuple[dict, dict | None]:
    """Train one worker, capturing its last step's real gradients; its recorder's history and those
    gradients' bytes through the method's compressor on the device and on the CPU."""
    from compbench.train.loop import Trainer

    trainer = Trainer(cfg, engine, run_dir)
    pipeline = trainer.pipeline
    # A copy before any step: no state on any device yet, so both copies below start alike.
    fresh = copy.deepcopy(pipeline.compressor) if pipeline is not None else None
    captured: dict = {}
    synchronize = trainer.sync.synchronize

    def capture_then_synchronize() -> None:
        # Called when backward has ended (and the non-finite check passed), before memory,
        # compression and the write-back of the averages: `.grad` holds the step's own gradients
        # (dense; after the step they are decoded averages, sparse COO with a one-pass optimizer).
        if trainer.step == int(cfg.max_steps) - 1:
            captured["step"] = trainer.step
            captured["grads"] = [(n, p.grad.detach().clone()) for n, p in trainer.model.named_parameters()
                                 if p.grad is not None]
        synchronize()

    trainer.sync.synchronize = capture_then_synchronize  # type: ignore[method-assign]
    trainer.fit()
    assert trainer.recorder is not None
    if fresh is None or "grads" not in captured:
        return trainer.recorder.history, None
    grads = captured["grads"]
    totals = [_wire_bytes(fresh, captured["step"], grads, where)
              for where in (trainer.device, torch.device("cpu"))]
    return trainer.recorder.history, {"step": captured["step"], "tensors": len(grads), "bytes": totals}


def _wire_bytes(fresh, step: int, grads: list, where: torch.device) -> int:
    """Wire bytes of `grads` through a fresh copy of the compressor on `where`."""
    comp = copy.deepcopy(fresh)
    comp.begin_step(step, 1.0)
    total = 0
    for name, g in grads:
        payload, _ = comp.compress(g.to(where), name)
        total += sum(t.numel() * t.element_size() for t in payload)
    return total


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


def configurations(device: str) -> list[list[str]]:
    """Every configuration sections 3, 4 and 6 compose (tests/unit/test_gpu_check_configs.py checks
    them all under a faked CUDA without Horovod)."""
    return [*(threaded_config(run, device) for run in METHODS),
            *([*COMMON, *JOB_STEPS, *job] for job in real_jobs_config(device).values()),
            *(resnet_config(device, overrides, 8) for _, overrides in RESNET_METHODS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    print(f"gpu check: {estimate()}", flush=True)
    report = Report(args.out / "report.md", args.device)
    report.section(1, "versions and gloo's collectives", lambda d: versions(device, d))
    report.section(2, "GPU tier (pytest -m gpu)", lambda d: gpu_tier(device, d))
    report.section(3, "every method on the threaded engine, against the CPU",
                   lambda d: threaded_methods(device, d))
    report.section(4, "real jobs and the step's split", lambda d: real_jobs(device, d))
    report.section(5, "compbench bench", lambda d: bench(device, args.out, d))
    report.section(6, "ResNet-50's gradients: every method", lambda d: resnet_methods(device, d))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
