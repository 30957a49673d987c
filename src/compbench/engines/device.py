"""Where a run trains: `device=auto|cpu|cuda` and `precision=fp32|bf16` (conf/train.yaml).

A run has one device per worker; everything on the training's hot path lives there (model, batches,
optimizer state, memories, compressor state, packing buffers); host-side only what must be (sizes
for uneven collectives, records). One rule, `place`, decides it from the setting and the number of
workers on this machine: in the parent, where the start line says what it chose, and again with the
same answer in each worker (under horovodrun or torchrun, in the workers alone):

- `cpu`: the CPU.
- `cuda`: CUDA, refused where torch sees no GPU; worker `local_rank` takes GPU `local_rank mod
  GPUs`, so more workers than GPUs share them (engine=torch then reduces over gloo's CUDA
  collectives: NCCL puts one rank on a GPU).
- `auto`: CUDA when this machine has a GPU for every local worker, else the CPU (the start line says
  why). Sharing a GPU is a choice (`device=cuda`), never a default. With GPUs, but fewer than the
  workers, the config check also warns (one line) that the run trains on the CPU and how to use them:
  a machine with a GPU and the default 2 workers would otherwise train on its CPU unnoticed.

The engines take the worker's device (`torch.device`): engine=torch picks its backend with
`torch_backend`, engine=horovod needs a build with CUDA for CUDA tensors. `check` is the config
check (compbench.compose.checks): every refusal one line, before anything is written.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from compbench.base.settings import DEVICES
from compbench.base.values import show

# engine=torch's backend for CUDA tensors with one GPU per worker: NCCL for them, gloo for the
# host-side tensors (sizes, objects) in the same process group.
NCCL_WITH_HOST = "cpu:gloo,cuda:nccl"


@dataclass(frozen=True)
class Placement:
    """Where this machine's `workers` train: `kind` cpu or cuda, over `gpus` visible GPUs; `why`
    completes the start line."""

    kind: str
    gpus: int
    workers: int
    why: str

    @property
    def shares_gpu(self) -> bool:
        """Several workers on one GPU (device=cuda with more workers than GPUs)."""
        return self.kind == "cuda" and self.workers > self.gpus

    def device(self, local_rank: int) -> torch.device:
        """The device of the worker with this rank on its machine."""
        if self.kind == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", local_rank % self.gpus)

    def describe(self) -> str:
        """The start line's words, e.g. `device cuda (2 workers on 2 GPUs, one each)`."""
        return f"device {self.kind} ({self.why})"


def host_to(t: Tensor, device: torch.device | str) -> Tensor:
    """A host tensor `t` (a header, a host-side draw) on `device` without making the host wait: a copy
    to a GPU goes from pinned memory, queued on the current stream (torch's pinned-memory allocator
    keeps the buffer until the copy is done); a plain `.to(device)` from pageable memory waits for
    the stream, inside a backward hook too."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def visible_gpus() -> int:
    """CUDA devices torch can use here (0 without CUDA, or with a CPU build of torch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def place(setting: str, workers: int) -> Placement:
    """The placement of `workers` local workers for `device=setting`; ValueError (one line) where the
    setting cannot hold."""
    gpus = visible_gpus()
    if setting == "cpu":
        return Placement("cpu", gpus, workers, "device=cpu")
    if setting == "cuda":
        if gpus == 0:
            raise ValueError("device=cuda but torch sees no CUDA GPU here (torch.cuda.is_available() is "
                             "false); use device=cpu or device=auto")
        return Placement("cuda", gpus, workers, _shares(workers, gpus))
    if setting != "auto":
        raise ValueError(f"device={show(setting)} is unknown; use {', '.join(DEVICES[:-1])} or {DEVICES[-1]}")
    if gpus == 0:
        return Placement("cpu", 0, workers, "auto: no CUDA GPU")
    if gpus < workers:
        return Placement("cpu", gpus, workers, f"auto: {gpus} GPU(s) for {workers} workers, one each is "
                                               "needed")
    return Placement("cuda", gpus, workers, "auto: " + _shares(workers, gpus))


def _shares(workers: int, gpus: int) -> str:
    if workers <= gpus:
        return f"{workers} worker(s) on {gpus} GPU(s), one each"
    return f"{workers} workers share {gpus} GPU(s)"


def local_workers(np: int) -> int:
    """Workers on this machine: the external launcher's (horovodrun, torchrun), else `engine.np`
    (compbench starts them all here)."""
    for key in ("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
        if os.environ.get(key):
            return int(os.environ[key])
    return np


def torch_backend(requested: str, device: torch.device, shares_gpu: bool) -> str:
    """engine=torch's process-group backend for a worker on `device`: gloo on the CPU; with CUDA,
    NCCL for the CUDA tensors (and gloo for the host-side ones) when each worker has its own GPU,
    gloo's CUDA collectives when workers share one (`requested` gloo chooses those anyway)."""
    if device.type != "cuda" or requested == "gloo":
        return "gloo"
    if requested == "nccl" or not shares_gpu:
        return NCCL_WITH_HOST
    return "gloo"


def check(setting: str, precision: str, workers: int, engine: str, backend: str | None) -> Placement:
    """The config check of device, precision and the engine's backend for `workers` local workers
    (ValueError: one line naming the key and the fix); the placement for the start line."""
    placement = place(setting, workers)
    unused = _unused_gpus(placement, engine) if setting == "auto" else None
    if unused:
        warnings.warn(unused, stacklevel=2)
    if backend == "nccl":
        if placement.kind != "cuda":
            raise ValueError(f"engine.backend=nccl reduces CUDA tensors and this run trains on the CPU "
                             f"({placement.why}); use device=cuda, or engine.backend=gloo (or auto)")
        if placement.shares_gpu:
            raise ValueError(f"engine.backend=nccl needs a GPU per worker: {workers} workers on "
                             f"{placement.gpus} GPU(s); use engine.np<={placement.gpus}, or "
                             "engine.backend=gloo (workers share a GPU over gloo's CUDA collectives)")
    if precision == "bf16" and not bf16_supported(placement.kind):
        raise ValueError(f"precision=bf16: this {placement.kind.upper()} has no bfloat16 arithmetic; "
                         "use precision=fp32")
    if placement.kind == "cuda" and engine == "horovod":
        _check_horovod_cuda(placement)
    if placement.kind == "cuda" and not cupy_importable():
        warnings.warn("device=cuda without CuPy: the CUDA kernels (compression, fused memory and optimizer "
                      "steps) cannot run and their torch twins do; pip install cupy-cuda13x "
                      "(compbench's [gpu] extra)", stacklevel=2)
    return placement


def _unused_gpus(placement: Placement, engine: str) -> str | None:
    """device=auto's warning where it placed the workers on the CPU beside GPUs: what it chose, and the
    two ways to the GPUs (share them, or one worker each); None where there is nothing to say. Under an
    external launcher every worker checks its config: local rank 0 says it, once per machine."""
    gpus, workers = placement.gpus, placement.workers
    launched = any(os.environ.get(k) for k in ("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"))
    local_rank = os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))
    if placement.kind != "cpu" or not gpus or local_rank != "0":
        return None
    them, s = ("it", "") if gpus == 1 else ("them", "s")
    ways = [f"pass device=cuda to share {them} (gloo's CUDA collectives)" if engine == "torch" else
            f"pass device=cuda engine=torch to share {them} (Horovod's NCCL takes one worker per GPU)"]
    if launched:  # the launcher's workers: its engine is fixed, their number is the launcher's
        ways = [*(ways if engine == "torch" else []), f"start {gpus} worker(s) per machine (a GPU each)"]
    else:
        ways.append(f"engine.np={gpus} (a GPU each)")
    return (f"device=auto: {gpus} GPU{s} for {workers} workers, so they train on the CPU; to train on the "
            f"GPU{s}, {', or '.join(ways)}")


def bf16_supported(kind: str) -> bool:
    """Whether this machine's `kind` device has bfloat16 arithmetic for autocast."""
    if kind == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _check_horovod_cuda(placement: Placement) -> None:
    """Horovod reduces CUDA tensors over NCCL: the capability is `nccl_built()` (a build with CUDA
    but without NCCL, `cuda_built()` true, reduces them over MPI/Gloo staged through the host, or
    fails inside its completion callback; `make setup` builds with both where both are present).
    NCCL puts one rank on a GPU."""
    import horovod.torch as hvd

    if not hvd.nccl_built():
        raise ValueError("engine=horovod was built without NCCL and device=cuda hands it CUDA tensors; "
                         "rebuild it with `make setup` where CUDA and NCCL are present, or use "
                         "engine=torch, or device=cpu")
    if placement.shares_gpu:
        raise ValueError(f"engine=horovod reduces CUDA tensors over NCCL, one worker per GPU: "
                         f"{placement.workers} workers on {placement.gpus} GPU(s); use "
                         f"engine.np<={placement.gpus}, or engine=torch (workers share a GPU over gloo)")


def cupy_importable() -> bool:
    from compbench.kernels import cupy_importable as importable

    return importable()
