"""Do two source trees train the same parameters? Runs every synchronization mode for a few steps on
2 workers under each tree (`PYTHONPATH=TREE/src`) and compares the checkpoints' model tensors bit for
bit: the check a refactoring owes ("behaviour unchanged").

    python scripts/same_params.py /path/to/before /path/to/after [--only diloco,demo]

Each run: 2 workers, one thread each, `max_steps` steps then a checkpoint; prints one line per mode
(same / DIFFERENT with the largest difference) and exits 1 when any mode differs or fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# name -> overrides: every synchronization mode, the pipeline's main paths (sparse allgather with
# error feedback, a packed exchange, a fused scheduler, the parameter server) and both engines.
MODES: dict[str, list[str]] = {
    "step-topk": ["compressor=topk", "comm=allgather", "memory=residual", "ratio=0.05"],
    "step-dgc-mergecomp": ["compressor=dgc", "comm=allgather", "memory=dgc", "scheduler=mergecomp"],
    "step-qsgd-ps": ["compressor=qsgd", "comm=ps"],
    "step-powersgd-horovod": ["compressor=powersgd", "engine=horovod"],
    "ddp": ["sync=ddp", "engine=torch"],
    "horovod_optimizer": ["sync=horovod_optimizer", "engine=horovod"],
    "diloco": ["model=gpt", "dataset=shakespeare", "optim=adamw", "sync=diloco", "sync.inner_steps=3"],
    "streaming": ["model=gpt", "dataset=shakespeare", "optim=adamw", "sync=diloco", "sync.inner_steps=4",
                  "sync.fragments=2", "sync.overlap=1", "compressor=qsgd", "comm=allgather"],
    "demo": ["model=gpt", "dataset=shakespeare", "optim=sgd", "sync=demo"],
    "onebit_adam": ["model=gpt", "dataset=shakespeare", "optim=adamw", "sync=onebit_adam",
                    "sync.freeze_step=3"],
}
COMMON = ["engine.np=2", "threads=1", "max_steps=8", "seed=0", "eval=false", "progress=false"]


def run(tree: Path, overrides: list[str], out: Path) -> dict[str, torch.Tensor]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, "-m", "compbench", "train", *overrides, *COMMON, f"output_dir={out}"]
    done = subprocess.run(cmd, env=env, cwd=out.parent, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    return torch.load(out / "checkpoint.pt", weights_only=True)["model"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--only", default="", help="comma-separated mode names (default: all)")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(MODES)
    failed = False
    with tempfile.TemporaryDirectory(prefix="compbench-same-") as tmp:
        for name in names:
            try:
                a = run(args.before.resolve(), MODES[name], Path(tmp) / f"{name}-before")
                b = run(args.after.resolve(), MODES[name], Path(tmp) / f"{name}-after")
            except RuntimeError as e:
                print(f"{name:22s} FAILED: {e}")
                failed = True
                continue
            diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
            same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            print(f"{name:22s} {'same' if same else f'DIFFERENT (max |diff| {diff:.3g})'}", flush=True)
            failed |= not same
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
