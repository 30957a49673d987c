"""A worker's memory, split as a sharded user reads it: parameters, gradients, optimizer state and
activations, each measured from the tensors themselves, and the process's peak beside them.

- parameters, gradients, optimizer state: the bytes of this worker's tensors (its shards where the
  run is sharded), at the end of each of the first steps (the largest);
- activations: the bytes autograd saved for backward during a forward pass (a saved-tensors hook
  on the first steps, storages counted once), less the weights: the worker's own parameters count as
  parameters, and the module's parameters that are not its own storage (a sharded unit's gathered
  weights, saved for its backward) are `gathered`;
- peak: the process's high-water mark: the CPU's resident set (VmHWM, everything the process
  touched, Python and libraries included) or the GPU's `max_memory_allocated`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

MB = 1 << 20
_MEASURED_STEPS = 3  # the saved-tensors hook costs a call per saved tensor: the first steps tell


# fp32 state elements per parameter element, by optimizer (SGD: its momentum buffer when momentum > 0)
_STATE_ELEMENTS = {"adam": 2, "adamw": 2, "lamb": 2, "onebit_adam": 2, "muon": 1}


def predict_worker_bytes(numel: int, optim_name: str, optim: dict[str, Any], shards: int = 1,
                         element_bytes: int = 4) -> dict[str, int]:
    """What one worker holds of `numel` parameters sharded `shards` ways (1: whole): parameters,
    gradients and optimizer state, and their total (activations come on top)."""
    state = _STATE_ELEMENTS.get(optim_name, 1 if float(optim.get("momentum") or 0.0) > 0 else 0)
    mine = -(-numel // shards)
    parts = {"parameters": mine * element_bytes, "gradients": mine * element_bytes,
             "optimizer": mine * element_bytes * state}
    return {**parts, "total": sum(parts.values())}


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def process_peak_bytes(device: torch.device) -> int | None:
    """The process's high-water mark on `device` (None where the system does not say)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    found = re.search(r"VmHWM:\s+(\d+) kB", status.read_text())
    return int(found.group(1)) * 1024 if found else None


FIELDS = ("parameters", "gradients", "optimizer", "activations", "gathered", "peak")


class MemoryLedger:
    """Measures one worker's memory split (see the module); `gather` is results.json's record."""

    def __init__(self, device: torch.device, model: nn.Module, optimizer: torch.optim.Optimizer,
                 local: Callable[[Tensor], Tensor]) -> None:
        """`local`: a tensor's part on this worker (a sharded run's shard; else the tensor)."""
        self.device, self.model, self.optimizer, self.local = device, model, optimizer, local
        self.seen = 0  # steps measured so far
        self.measured = dict.fromkeys(("parameters", "gradients", "optimizer", "activations", "gathered"), 0)
        self._saved: dict[int, int] = {}
        self._weights: dict[int, int] = {}
        self._own: set[int] = set()
        self._gathers = False
        self._hooks: Any = None

    def begin_step(self) -> None:
        """The first steps this worker runs are measured (a resumed run's too)."""
        if self.seen < _MEASURED_STEPS and self._hooks is None:
            self._saved, self._weights = {}, {}
            params = list(self.model.parameters())
            self._own = {self.local(p).untyped_storage().data_ptr() for p in params}
            self._gathers = any(self.local(p) is not p for p in params)  # sharded: weights come and go
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            self._hooks.__enter__()

    def _pack(self, t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._own:  # this worker's own parameters: counted as parameters
            return t
        # the module's parameters now that are not its own storage: a sharded unit's gathered weights
        gathered = self._gathers and key in {self.local(p).untyped_storage().data_ptr()
                                             for p in self.model.parameters()}
        (self._weights if gathered else self._saved)[key] = storage.nbytes()
        return t

    def end_forward(self) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
            self._keep("activations", sum(self._saved.values()))
            self._keep("gathered", sum(self._weights.values()))
            self._saved, self._weights = {}, {}

    def end_step(self) -> None:
        if self.seen >= _MEASURED_STEPS:
            return
        self.seen += 1
        grads = (self.local(p.grad) for p in self.model.parameters() if p.grad is not None)
        self._keep("gradients", tensor_bytes(grads))
        # after the step: a stage-2 unit's weights are sharded again (an evaluation's forward leaves
        # them gathered, so the figure is not read at the end)
        self._keep("parameters", tensor_bytes(self.local(p) for p in self.model.parameters()))
        state = (self.local(v) for s in self.optimizer.state.values() for v in s.values()
                 if isinstance(v, Tensor) and v.dim() > 0)
        self._keep("optimizer", tensor_bytes(state))

    def _keep(self, part: str, nbytes: int) -> None:
        self.measured[part] = max(self.measured[part], nbytes)

    def figures(self) -> dict[str, float]:
        """This worker's megabytes per part and the process's peak (NaN where unknown)."""
        peak = process_peak_bytes(self.device)
        parts = {**self.measured, "peak": math.nan if peak is None else peak}
        return {k: parts[k] / MB for k in FIELDS}

    def gather(self, engine: Any) -> list[dict[str, Any]]:
        """Every worker's `figures`, in rank order (a collective); `peak` says what measured it."""
        mine = torch.tensor([self.figures()[k] for k in FIELDS], dtype=torch.float64, device=self.device)
        rows = engine.allgather([mine], "memory")
        return [{**{k: (None if math.isnan(v) else round(v, 3))
                    for k, v in zip(FIELDS, row[0].tolist(), strict=True)},
                 "peak_of": "cuda max_memory_allocated" if self.device.type == "cuda" else "process VmHWM"}
                for row in rows]


def _unpack(t: Tensor) -> Tensor:
    return t
