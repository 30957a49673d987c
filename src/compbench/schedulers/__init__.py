"""Schedulers: when and on what the compression pipeline runs (grouping, selection, partitioning).

A scheduler has four methods, called by the trainer (and by `wrap_compress_optimizer`):
- `setup(model)`: once, before training;
- `before_backward(pipeline)`: each step, before `loss.backward()` (overlapping schedulers arm
  their gradient hooks here and `pipeline.submit` groups as soon as they are complete);
- `synchronize(pipeline)`: each step, after back-propagation: submit what is left, then
  `pipeline.collect()` and write the averaged gradients into `p.grad`;
- `summary() -> dict`: what it decided (written to results.json).
Every rank must submit the same groups in the same order; `state_dict`/`load_state_dict` carry
what it decided across a resume. What it accepts is its `traits`, read by the config check
(compbench.compose.compat). Adding a scheduler = its file here + `conf/scheduler/NAME.yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import nn

    from compbench.seam.pipeline import GradientPipeline


@dataclass(frozen=True)
class SchedulerTraits:
    """What a scheduler does to the gradients, declared once per class.

    fuses: sends several tensors as one flat buffer (a matrix compressor would see a 1-D tensor).
    partitions: cuts gradients into flat partitions (likewise).
    plans: decides per gradient whether compressing it pays, from a cost model.
    comms: the communicators it is made for (None: any).
    momentum_memory: works with a memory that owns the momentum (memory=dgc).
    packs: sends several tensors, each compressed on its own, in one exchange
      (`GradientPipeline.submit_many`): needs a communicator that packs the compressor.
    """

    fuses: bool = False
    partitions: bool = False
    plans: bool = False
    comms: tuple[str, ...] | None = None
    momentum_memory: bool = True
    packs: bool = False


@runtime_checkable
class Scheduler(Protocol):
    """The protocol every scheduler implements (see the module docstring for when each is called)."""

    name: str
    traits: ClassVar[SchedulerTraits]

    @property
    def overlapping(self) -> bool:
        """Whether groups are submitted during back-propagation (from backward hooks)."""
        ...

    def setup(self, model: nn.Module) -> None: ...
    def before_backward(self, pipeline: GradientPipeline) -> None: ...
    def synchronize(self, pipeline: GradientPipeline) -> None: ...
    def summary(self) -> dict[str, Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
