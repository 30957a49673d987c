"""The non-finite check folded into the compressors' first pass over the gradients.

The trainer's on_nonfinite=raise check (`Trainer.gradients_finite`) must see every NaN/Inf in this
rank's gradients before anything steps. A compressor whose selection pass is a compiled kernel
(DRAGONN's hashed selection, the block maxima of DGC and top-k, the memory's fused pass) reads
every element of the gradient anyway, inside the backward hooks of an overlapping scheduler: the
same pass tests each block it has just read (in cache, no extra memory traffic) and sets a flag on
the device. The ledger says which tensors were so checked this step, so the trainer reads only the
others again, and reads the flag with their sums in one host read.

One `FiniteLedger` per compressor (`CompressorBase.finite`), opened by its `begin_step` and closed
by the trainer's check (`close`): what a compressor reads after the check (a non-overlapping
scheduler's tensors, a periodic mode's outer gradient) is not this step's check, and a mode that
does not call `begin_step` every step leaves it closed, so stale names never excuse a tensor.

Soundness: a name is recorded only when a kernel that reads all `numel` elements of the tensor
took the flag (`FiniteCheck.take`), and the trainer excuses a gradient only when its numel matches.
What the kernel read is the gradient itself, a fused group's flat buffer (its members' gradients:
`group`), or a memory's compensation of it: residual and dgc compensations are sums and products
with the gradient, so a NaN/Inf element of the gradient is a NaN/Inf of the compensated value at
the same place. The converse need not hold (a residual's overflow): the trainer's per-tensor detail
pass, run only when something is flagged, names the gradients that are really non-finite.
"""

from __future__ import annotations

import torch
from torch import Tensor


class FiniteLedger:
    """One step's record of the gradients a compiled pass checked, and their device flags: per
    device a 1-element int32 tensor, zeroed once per step (when first taken) and set to 1 by any
    kernel that read a NaN/Inf."""

    def __init__(self) -> None:
        self._flags: dict[torch.device, Tensor] = {}  # reused every step: no allocation per step
        self._taken: dict[torch.device, Tensor] = {}  # the flags zeroed and handed out this step
        self._checked: dict[str, int] = {}  # name -> numel of each gradient checked this step
        self._groups: dict[str, list[tuple[str, int]]] = {}  # a fused group's members (name, numel)
        self._open = False

    def begin_step(self) -> None:
        """A new step: nothing checked yet (the compressor's `begin_step`)."""
        self._open = True
        self._checked.clear()
        self._taken.clear()

    def group(self, name: str, members: list[tuple[str, int]]) -> None:
        """Tensor `name` is a fused group's flat buffer, its members' gradients in this order (the
        pipeline says so for scheduler=mergecomp / fused layerwise groups): checking it checks them."""
        self._groups[name] = members

    def check(self, name: str, numel: int) -> FiniteCheck | None:
        """What a compressor hands to the pass over tensor `name` of `numel` elements; None when
        nothing is recorded now (closed: after this step's check, or before its first `begin_step`)."""
        return FiniteCheck(self, name, numel) if self._open else None

    def flag_for(self, device: torch.device) -> Tensor:
        """This step's flag on `device` (zeroed the first time it is taken in a step)."""
        flag = self._taken.get(device)
        if flag is None:
            flag = self._flags.get(device)
            if flag is None:
                flag = self._flags[device] = torch.zeros(1, dtype=torch.int32, device=device)
            else:
                flag.zero_()
            self._taken[device] = flag
        return flag

    def record(self, name: str, numel: int) -> None:
        """Tensor `name` (`numel` elements) was read whole by a pass that sets this step's flag."""
        members = self._groups.get(name)
        if members is not None and sum(n for _, n in members) == numel:
            self._checked.update(members)
        else:
            self._checked[name] = numel

    def close(self) -> tuple[dict[str, int], list[Tensor]]:
        """(name -> numel of the gradients checked this step, the flags they set): the trainer's
        check takes them once; until the next `begin_step` nothing more is recorded."""
        checked, flags = dict(self._checked), list(self._taken.values())
        self._open = False
        self._checked.clear()
        self._taken.clear()
        return checked, flags


class FiniteCheck:
    """A compressor's promise for one tensor: whoever takes the flag runs a kernel that reads every
    element of it and sets the flag on a NaN/Inf."""

    def __init__(self, ledger: FiniteLedger, name: str, numel: int) -> None:
        self.ledger, self.name, self.numel = ledger, name, numel

    def take(self, device: torch.device) -> Tensor:
        """The flag to pass to the kernel; records the tensor as checked."""
        self.ledger.record(self.name, self.numel)
        return self.ledger.flag_for(device)


def flag(check: FiniteCheck | None, device: torch.device) -> Tensor | None:
    """`check.take(device)`, or None (the kernels' no-check) without a check."""
    return None if check is None else check.take(device)
