"""Shared test helpers: run the real CLI in a subprocess and read what a run wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from tests import warm_cli

# Small, fast, BatchNorm-free runs: an MLP on synthetic 3x8x8 data.
TINY = ["model=mlp", "model.hidden=[32]", "dataset=synthetic", "dataset.image_size=8",
        "dataset.train_size=256", "dataset.test_size=64", "progress=false", "optim.lr_schedule=constant"]


def compbench(*args: str, cwd: Path | None = None, timeout: float = 300,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """`compbench ARGS` as a process of its own: a child of the warm CLI server (tests.warm_cli), or a
    fresh interpreter where the test sets environment variables (`env`: the server's imports have
    read the environment it started in)."""
    if env is None:
        return warm_cli.run(list(args), cwd, timeout)
    return subprocess.run([sys.executable, "-m", "compbench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def train(tmp: Path, *overrides: str, name: str = "run") -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp / name
    proc = compbench("train", *overrides, f"output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def params(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def event_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return set(acc.Tags()["scalars"])


def encode_statistics(comp, x: torch.Tensor, trials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error (float64) of `trials` decoded encodes of x, one step apart
    (fresh randomness each time): the unbiasedness tests compare mean to x within k standard errors."""
    total = torch.zeros_like(x, dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for i in range(trials):
        comp.begin_step(i, 0.0)
        payload, ctx = comp.compress(x.clone(), "t")
        d = comp.decompress(payload, ctx).double()
        total += d
        total_sq += d * d
    mean = total / trials
    return mean, ((total_sq / trials - mean * mean).clamp_min(0) / trials).sqrt()


def default_sigint() -> None:
    """preexec_fn for a child that must answer Ctrl-C: a suite started in the background
    (`make test &`) runs with SIGINT ignored, and a child would inherit that (Python then installs
    no KeyboardInterrupt handler); the tests must not depend on how the suite was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_compbench(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    """`compbench ARGS` in the background, in its own process group (a terminal's Ctrl-C reaches the
    whole group: os.killpg(proc.pid, SIGINT)), with a default SIGINT."""
    return subprocess.Popen([sys.executable, "-m", "compbench", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_sigint, env={**os.environ, **(env or {})})


def catches_sigint(pid: int) -> bool:
    """Whether process `pid` has installed a SIGINT handler yet (Python does so at start-up)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def sync_step(sync, optimizer: torch.optim.Optimizer, step: int, model: torch.nn.Module, x: torch.Tensor,
              y: torch.Tensor) -> None:
    """One classification step through a synchronizer in the trainer's order (compbench.train.loop)."""
    sync.begin_step(step, 0.0)
    optimizer.zero_grad()
    sync.before_backward()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    sync.synchronize()
    optimizer.step()
    sync.after_step()
