"""`scheduler=layerwise`: one group per tensor, each submitted from a backward hook as soon as its
gradient is ready, so that compression and communication overlap the rest of back-propagation.

`Layerwise` is also the overlap machinery `mergecomp` builds on (groups of several tensors).
"""

from __future__ import annotations

import functools
import time

import torch
from torch import nn

from compbench.schedulers import SchedulerTraits
from compbench.schedulers.fusion import Group, build_groups
from compbench.seam.pipeline import GradientPipeline


class Layerwise:
    """Submits groups (here: one tensor each) from backward hooks, then writes back the averages.

    Overlap: a `post_accumulate_grad` hook on every parameter marks it ready; a group is submitted
    when all its members are ready AND every earlier group was submitted, so every rank issues the
    same collectives in the same order. That order is the ready order rank 0 recorded in the first
    step (reverse registration order until then), broadcast to all ranks. `synchronize` submits
    what is left (groups with unused parameters send zeros), waits for everything, and writes the
    averaged gradients into `p.grad`; the optimizer steps after it.
    With `overlap=false`, or a blocking communicator (comm=ps, PowerSGD), everything is submitted
    after back-propagation. Overlap assumes one backward per step: gradient accumulation over
    several backward passes needs `overlap=false`.
    """

    name = "layerwise"
    traits = SchedulerTraits()
    packed = False  # scheduler=bucket: a group's tensors in one exchange (schedulers.fusion.PackedPart)

    def __init__(self, overlap: bool = True) -> None:
        self.overlap = bool(overlap)
        self.pipeline: GradientPipeline | None = None  # the one of the running step (before_backward)

    def setup(self, model: nn.Module) -> None:
        self.params = [(n, p) for n, p in reversed(list(model.named_parameters())) if p.requires_grad]
        self.order = list(range(len(self.params)))  # provisional, until step 0 has been recorded
        self.order_recorded = False
        self.groups: list[Group] = []  # built from self.runs when a step starts (needs min_dims)
        self.steps = 0
        self.dense_step = False  # send everything uncompressed this step (MergeComp's first step)
        self._active = self._overlapping = False
        self._next = 0
        for i, (_, p) in enumerate(self.params):
            p.register_post_accumulate_grad_hook(functools.partial(self._on_ready, i))
        self.set_runs([[i] for i in self.order])

    # -- grouping ------------------------------------------------------------------------------

    def set_runs(self, runs: list[list[int]]) -> None:
        """Group the parameters as `runs` (indices into self.params, in submission order)."""
        self.runs = runs
        self._built_for: list[list[int]] | None = None

    def _build(self, pipeline: GradientPipeline) -> None:
        if self._built_for is not self.runs:
            self.groups = build_groups(self.params, self.runs, pipeline.selection.min_dims, self.packed)
            self._group_of = {i: g for g, run in enumerate(self.runs) for i in run}
            self._built_for = self.runs

    # -- one step ------------------------------------------------------------------------------

    def before_backward(self, pipeline: GradientPipeline) -> None:
        self._start(pipeline)
        for group in self.groups:
            group.bind()  # fused groups: back-propagation writes into their buffers

    def _start(self, pipeline: GradientPipeline) -> None:
        self._build(pipeline)
        self.pipeline = pipeline
        self._t0 = self._clock(pipeline)
        self._fired: list[int] = []
        self._seen = [False] * len(self.params)
        self._missing = [len(run) for run in self.runs]
        self._next = 0
        self._active = True
        self._overlapping = self.overlap and pipeline.can_overlap
        pipeline.in_backward = self._overlapping

    def _on_ready(self, i: int, param: nn.Parameter) -> None:
        if not self._active:
            return
        if self._seen[i]:
            if self._overlapping:
                name = self.params[i][0]
                raise ValueError(f"scheduler={self.name}: the gradient of {name} was ready twice "
                                 "in one step (gradient accumulation?); pass scheduler.overlap=false")
            return
        self._seen[i] = True
        self._fired.append(i)
        if self._overlapping:
            self._missing[self._group_of[i]] -= 1
            self._submit_ready()

    def _submit_ready(self) -> None:
        pipeline = self.pipeline
        assert pipeline is not None  # armed by before_backward
        while self._next < len(self.groups) and self._missing[self._next] == 0:
            self.groups[self._next].submit(pipeline, dense=self.dense_step)
            self._next += 1

    def synchronize(self, pipeline: GradientPipeline) -> None:
        if not self._active:  # before_backward was not called this step (a user's own loop)
            self._start(pipeline)  # not bind: the .grads hold this step's gradients
        self._active = False
        pipeline.in_backward = False
        for group in self.groups[self._next :]:  # not submitted during backward (or unused members)
            group.submit(pipeline, dense=self.dense_step)
        self._next = len(self.groups)
        averaged = dict(pipeline.collect())
        with pipeline.stats.time("write_back"):  # the averages into .grad: a part of the step's `other`
            for group in self.groups:
                group.write_back(averaged)
        if not self.order_recorded:
            self._record_order(pipeline)
        self.after_step(pipeline, (self._clock(pipeline) - self._t0) * 1e3)
        self.steps += 1

    def _record_order(self, pipeline: GradientPipeline) -> None:
        """Rank 0's ready order of the first step, for every rank (hooks could fire in a different
        order on another rank; the submission order must be the same everywhere)."""
        fired = set(self._fired)
        mine = self._fired + [i for i in self.order if i not in fired]  # never ready: unused parameters
        self.order = pipeline.engine.broadcast_object(mine if pipeline.engine.rank == 0 else None, 0)
        self.order_recorded = True
        self.on_order_recorded(pipeline)

    def on_order_recorded(self, pipeline: GradientPipeline) -> None:
        self.set_runs([[i] for i in self.order])

    @property
    def searching(self) -> bool:
        """Whether the steps are being timed to the end of their work (MergeComp's search); never here."""
        return False

    def _clock(self, pipeline: GradientPipeline) -> float:
        """Now, in seconds; while `searching`, after the device's work so far is done (a GPU's launches
        return before their work: the search must compare the work, not the launches)."""
        if self.searching and pipeline.engine.device.type == "cuda":
            torch.cuda.synchronize(pipeline.engine.device)
        return time.perf_counter()

    def after_step(self, pipeline: GradientPipeline, ms: float) -> None:
        """Hook for subclasses, after the averaged gradients are written: `ms` is this step's
        backward plus synchronization time."""

    def summary(self) -> dict:
        return {"name": self.name, "groups": len(self.runs), "overlap": self.overlapping}

    def state_dict(self) -> dict:
        """The recorded submission order, the grouping and the step count, as plain data: a resumed
        run submits in the same order without recording it again."""
        return {"order": list(self.order), "order_recorded": self.order_recorded,
                "runs": [list(run) for run in self.runs], "steps": self.steps, "dense_step": self.dense_step}

    def load_state_dict(self, state: dict) -> None:
        """After `setup`: the groups are rebuilt from the restored runs when the next step starts."""
        self.order = [int(i) for i in state["order"]]
        self.order_recorded = bool(state["order_recorded"])
        self.steps = int(state["steps"])
        self.dense_step = bool(state["dense_step"])
        self.set_runs([[int(i) for i in run] for run in state["runs"]])

    @property
    def overlapping(self) -> bool:
        """Whether groups are submitted during back-propagation (not with a blocking communicator)."""
        return self.overlap and (self.pipeline is None or self.pipeline.can_overlap)
