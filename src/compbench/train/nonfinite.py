"""Which of this rank's gradients hold a NaN or an infinity: the trainer's check
(`Trainer.gradients_finite`), with one host read in a finite step."""

from __future__ import annotations

import torch
from torch import Tensor


def nonfinite_gradients(named: list[tuple[str, Tensor]], checked: dict[str, int], flags: list[Tensor],
                        device: torch.device) -> list[str]:
    """The names of the gradients in `named` that hold a NaN/Inf, in order ([] for a finite step).

    `checked` (name -> numel) and `flags`: what the compressor's compiled passes already tested this
    step (codec/finite.py: a flag is 1 when a pass read a NaN/Inf). Those gradients are not read
    again here. For the others, the sum is non-finite whenever an element is: one cheap reduction
    per tensor (2 ms instead of 68 ms for 16.8M gradients). The flags and the sums' verdicts are
    reduced to ONE value, the step's one host read of the check (a wait on a GPU, which the method
    needs: the host decides whether the step goes on). Only when it says something is wrong are
    the gradients looked at one by one (a flagged pass, or a sum that overflowed from finite values,
    may name nothing: then the step is finite)."""
    rest = [(n, g) for n, g in named if checked.get(n) != g.numel()]
    alarms = [f.reshape(-1).to(device) for f in flags]
    sums = torch.stack([g.sum() for _, g in rest]) if rest else None
    if sums is not None:
        alarms.append((~sums.isfinite()).to(torch.int32).to(device))
    if not alarms or not bool(torch.cat(alarms).any()):
        return []
    # The rare path: a sum that is finite clears its gradient; the checked ones are read here.
    verdicts = [] if sums is None else sums.isfinite().tolist()
    finite_sum = dict(zip([n for n, _ in rest], verdicts, strict=True))
    return [n for n, g in named if not finite_sum.get(n, False) and not bool(torch.isfinite(g).all())]
