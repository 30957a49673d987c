"""`sync=horovod_optimizer`: the baseline of the seeds' world, Horovod's own
`hvd.DistributedOptimizer` (optionally with `hvd.Compression.fp16`), run inside compbench's trainer.

The gradient exchange is Horovod's code path as a user runs it: `hvd.DistributedOptimizer` registers
its hooks on every parameter's gradient accumulator at construction, each hook starts
`allreduce_async_` (compressed by `hvd.Compression`) as soon as that gradient is ready during
`loss.backward()`, and `synchronize()` waits for them and writes the averages into `p.grad`.
A synchronizer does not replace the trainer's optimizer, so the DistributedOptimizer here wraps a
stand-in SGD over the same parameters and is never stepped: its `synchronize()` is called when
back-propagation ends, and the trainer's own optimizer then steps on the averaged gradients. That
is Horovod's documented `optimizer.synchronize()` + `with optimizer.skip_synchronize(): step()`
pattern, with the same optimizer class and parameter groups the trainer would have wrapped; the
arithmetic is the same as `hvd.DistributedOptimizer(trainer's optimizer).step()`.

Why at the end of backward (an autograd final callback), as DDP does, rather than in the
scheduler's `synchronize()`: the trainer's non-finite check between the two issues a small
allreduce that Horovod would queue behind the gradients, so the wait would land there, untimed;
and the check then sees averaged gradients, as with DDP.

Recorded per step and rank: `comm/bytes_sent` 4n (compression=none) or 2n (fp16), n = elements of
the parameters that require grad; `time/comm` = `time/comm_exposed` = the wait in `synchronize()`,
taken out of `time/compute` (the allreduces that finished during backward stay hidden in it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from compbench.base.values import show
from compbench.engines.base import Engine
from compbench.optim.optimizers import plain_optimizer
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model

COMPRESSIONS = ("none", "fp16")


def check_options(compression: str = "none", **_: Any) -> None:
    """Config-time check of sync=horovod_optimizer's own options (the engine and compbench's unused
    compressor, memory, communicator and scheduler are checked by compbench.compose.compat from
    `sync_traits`)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"sync.compression={show(compression)} is unknown; use one of: "
                         f"{', '.join(COMPRESSIONS)}")


class HorovodOptimizerSync:
    """hvd.DistributedOptimizer's gradient exchange as the trainer's synchronizer (see the module)."""

    name = "horovod_optimizer"
    sync_traits = SyncTraits(pipeline=False, engines=("horovod",), pattern="allreduce", elastic=False)
    pipeline = None
    scheduler = None
    check_options = staticmethod(check_options)
    check_model = staticmethod(fits_any_model)

    def __init__(self, engine: Engine, stats: StepStats, compression: str = "none") -> None:
        check_options(compression=compression)
        self.engine, self.stats, self.compression = engine, stats, compression

    # -- the trainer's seam --------------------------------------------------------------------

    def setup(self, model: nn.Module) -> nn.Module:
        """Horovod leaves the model alone: its hooks go on the parameters' gradient accumulators."""
        import horovod.torch as hvd

        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.numel = sum(p.numel() for _, p in params)
        stand_in = torch.optim.SGD([p for _, p in params], lr=0.0)
        self.optimizer = hvd.DistributedOptimizer(stand_in, named_parameters=params,
                                                  compression=getattr(hvd.Compression, self.compression))
        for _, p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)
        self._armed = False
        self._synchronized = False  # the backward hook already ran this step's exchange
        return model

    make_optimizer = staticmethod(plain_optimizer)

    def before_backward(self) -> None:
        # A step dropped before synchronizing left Horovod's allreduces in flight: finish them and
        # clear the gradients, or the next backward trips Horovod's checks.
        if self.optimizer._handles:
            self.optimizer.synchronize()
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.zero_()
        self._armed, self._synchronized = True, False

    def _on_grad(self, param: nn.Parameter) -> None:
        if self._armed:  # first gradient of this backward: synchronize once the graph is done
            self._armed = False
            torch.autograd.Variable._execution_engine.queue_callback(self._synchronize)

    def _synchronize(self) -> None:
        # Timed as communication, exposed: inside loss.backward() it pauses the trainer's compute.
        with self.stats.time("comm", exposed=True):
            self.optimizer.synchronize()
        self._synchronized = True

    def synchronize(self) -> None:
        self._armed = False
        if not self._synchronized:  # no backward hook fired (a user's own loop, no gradients)
            self._synchronize()
        self._synchronized = False
        self.stats.bytes_dense += 4 * self.numel
        # Horovod fuses the per-tensor allreduces into buffers of up to 64 MiB (its default
        # HOROVOD_FUSION_THRESHOLD): that many collectives for the what-if model.
        sent = (2 if self.compression == "fp16" else 4) * self.numel
        self.stats.add_dense_allreduce(sent, calls=max(1, math.ceil(sent / 2**26)))

    def begin_step(self, step: int, epoch: float) -> None:
        pass

    def after_step(self) -> None:
        pass

    def drain(self) -> None:
        pass  # the next before_backward finishes what Horovod still has in flight

    def state_dict(self) -> dict[str, Any]:
        return {}  # the model and the optimizer are all there is

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def exchange_plan(self) -> ExchangePlan:
        return ExchangePlan(pattern="allreduce", overlaps_backward=True)  # bucketed, from backward hooks

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "compression": self.compression, "overlap": True}
