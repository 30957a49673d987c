"""`sync=ddp`: the baseline users would otherwise reach for, torch DistributedDataParallel with its
own communication hooks, run inside compbench's trainer so that a sweep compares against it.

`hook=allreduce` is DDP's built-in path (no hook registered: what `DDP(model)` does); `fp16` and
`bf16` are torch's `fp16_compress_hook` / `bf16_compress_hook`; `powersgd` is torch's
`powerSGD_hook` (vanilla allreduce for the first `start_powersgd_iter` steps, as torch requires);
`topk` is the sampled-threshold top-k hook users write (`ddp_topk_hook.py`, `topk_ratio`).
The trainer's model becomes the DDP module; compbench's compressor, memory, communicator and
scheduler are not used (the config check refuses them).

What is recorded per step and rank:
- `comm/bytes_sent`, exact: fp32 4n (n: elements of the parameters that require grad), fp16/bf16 2n,
  PowerSGD 4 x (sum of q(rows+cols) over the matrices it compresses + elements of the tensors it
  leaves dense: vectors and matrices not worth compressing), read from the hook's own statistics;
  top-k 12 x 1.5k per bucket (fp32 values and int64 indices, padded);
  plus DDP's per-step broadcast of module buffers (BatchNorm statistics) when `broadcast_buffers`.
- time: DDP communicates inside `loss.backward()`, overlapped with it, and backward returns only
  when every bucket is reduced. The overlapped part cannot be observed; the part backward waited for
  after its last gradient was computed (DDP's finalize) is measured with two autograd final
  callbacks and booked as `comm` and `comm_exposed` (and taken out of `compute`, so the phases
  still add up to the step).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import torch
from torch import nn

from compbench.base.values import KeyRange, show
from compbench.engines.base import Engine
from compbench.optim.optimizers import plain_optimizer
from compbench.records.stats import StepStats
from compbench.sync import ExchangePlan, SyncTraits, fits_any_model
from compbench.sync.ddp_topk_hook import TopKHookState, topk_hook

HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "topk")


def check_options(hook: str = "allreduce", powersgd_rank: int = 1, start_powersgd_iter: int = 2,
                  topk_ratio: float = 0.001, **_: Any) -> None:
    """Config-time check of sync=ddp's own options (the engine and compbench's unused compressor,
    memory, communicator and scheduler are checked by compbench.compose.compat from `sync_traits`)."""
    if hook not in HOOKS:
        raise ValueError(f"sync.hook={show(hook)} is unknown; use one of: {', '.join(HOOKS)}")
    if hook == "bf16" and not torch.cuda.is_available():
        raise ValueError("sync.hook=bf16 (torch's bf16_compress_hook) needs CUDA + NCCL; use sync.hook=fp16")
    if isinstance(powersgd_rank, bool) or not isinstance(powersgd_rank, int) or powersgd_rank < 1:
        raise ValueError(f"sync.powersgd_rank={powersgd_rank} must be an integer >= 1")
    if isinstance(topk_ratio, bool) or not isinstance(topk_ratio, (int, float)) or not 0 < topk_ratio <= 1:
        raise ValueError(f"sync.topk_ratio={topk_ratio} is outside (0, 1]; pass e.g. sync.topk_ratio=0.001")
    if hook == "powersgd" and (not isinstance(start_powersgd_iter, int) or start_powersgd_iter < 2):
        raise ValueError(f"sync.start_powersgd_iter={start_powersgd_iter} must be >= 2 (torch's PowerSGD "
                         "hook needs two plain allreduce steps while DDP rebuilds its buckets)")


class _DDP(nn.parallel.DistributedDataParallel):
    """DDP, except that checkpoints hold the plain model's keys (no `module.` prefix: a run with
    sync=ddp and one without store the same state dict) and that forward passes without autograd
    (evaluation) skip DDP's buffer broadcast: ranks may run different numbers of test batches."""

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]  # passes Module's overloads on
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        return super().forward(*args, **kwargs)


class DDPSync:
    """torch DistributedDataParallel with one of its comm hooks, as the trainer's synchronizer
    (compbench.sync's protocol).

    `setup` returns the DDP module (the trainer trains through it); the other methods only book
    bytes and times: DDP has averaged every gradient by the time `loss.backward()` returns.
    """

    KEY_RANGES: ClassVar[dict[str, KeyRange]] = {
        "bucket_cap_mb": KeyRange(0, integer=False, what="megabytes per DDP bucket"),
        "start_powersgd_iter": KeyRange(0), "min_compression_rate": KeyRange(0, integer=False)}

    name = "ddp"
    sync_traits = SyncTraits(pipeline=False, engines=("torch",), pattern="allreduce", elastic=False)
    pipeline = None
    scheduler = None
    check_options = staticmethod(check_options)
    check_model = staticmethod(fits_any_model)

    def __init__(self, engine: Engine, stats: StepStats, hook: str = "allreduce",
                 bucket_cap_mb: float = 25.0, broadcast_buffers: bool = True, powersgd_rank: int = 1,
                 start_powersgd_iter: int = 2, min_compression_rate: float = 2.0,
                 use_error_feedback: bool = True, warm_start: bool = True, topk_ratio: float = 0.001) -> None:
        check_options(hook=hook, powersgd_rank=powersgd_rank, start_powersgd_iter=start_powersgd_iter,
                      topk_ratio=topk_ratio)
        self.topk_ratio = float(topk_ratio)
        self.engine, self.stats, self.hook = engine, stats, hook
        self.bucket_cap_mb, self.broadcast_buffers = float(bucket_cap_mb), bool(broadcast_buffers)
        self.powersgd: dict[str, Any] = dict(
                             matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=start_powersgd_iter,
                             min_compression_rate=min_compression_rate, use_error_feedback=use_error_feedback,
                             warm_start=warm_start)
        self.state: Any = None  # the hook's state (PowerSGD's or top-k's error feedback), per rank

    # -- the trainer's seam --------------------------------------------------------------------

    def setup(self, model: nn.Module) -> nn.Module:
        ddp = self._wrap(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in params)
        buffers = list(model.buffers()) if self.broadcast_buffers else []
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in buffers)
        self._after_before = 0  # PowerSGD's count of elements sent, before this step
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)
        self._armed = False
        return ddp

    def _wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        # Newer torch renamed the per-forward buffer broadcast (the old name warns); both sync at init.
        params = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
        key = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
        sync_buffers: dict[str, Any] = {key: self.broadcast_buffers}
        ddp = _DDP(model, bucket_cap_mb=self.bucket_cap_mb, **sync_buffers)
        if self.hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif self.hook == "bf16":
            try:
                ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
            except TypeError as e:  # torch allows it on CUDA + NCCL only
                raise ValueError(f"sync.hook=bf16: {str(e).splitlines()[0]}; use sync.hook=fp16") from None
        elif self.hook == "powersgd":
            self.state = powersgd.PowerSGDState(process_group=None, **self.powersgd)
            ddp.register_comm_hook(self.state, powersgd.powerSGD_hook)
        elif self.hook == "topk":
            self.state = TopKHookState(self.topk_ratio)
            ddp.register_comm_hook(self.state, topk_hook)
        return ddp

    make_optimizer = staticmethod(plain_optimizer)

    def before_backward(self) -> None:
        self._armed = True
        if self.hook == "powersgd":
            self._after_before = self.state.total_numel_after_compression
        elif self.hook == "topk":
            self.state.bytes_sent = 0

    def _on_grad(self, param: nn.Parameter) -> None:
        # First gradient of this backward: queue a final callback. It runs once the graph is done,
        # before DDP's own finalize (queued later, when the last bucket is ready) and queues a
        # second one that runs after it: the time between the two is what backward waited for DDP,
        # timed as communication (it pauses the trainer's compute phase) and exposed.
        if self._armed:
            self._armed = False
            engine = torch.autograd.Variable._execution_engine

            def first() -> None:
                self.stats.begin("comm", exposed=True)
                engine.queue_callback(lambda: self.stats.end("comm"))

            engine.queue_callback(first)

    def synchronize(self) -> None:
        self._armed = False
        self.stats.bytes_dense += 4 * self.numel
        # One allreduce per bucket (what-if model): DDP cuts buckets at bucket_cap_mb.
        sent = self.bytes_this_step() + self.buffer_bytes
        self.stats.add_dense_allreduce(sent, calls=max(1, math.ceil(sent / (self.bucket_cap_mb * 2**20))))

    def bytes_this_step(self) -> int:
        """Gradient bytes this rank handed to the process group in the step just finished."""
        if self.hook in ("fp16", "bf16"):
            return 2 * self.numel
        if self.hook == "powersgd":
            sent = self.state.total_numel_after_compression - self._after_before
            return 4 * sent if sent else 4 * self.numel  # before start_powersgd_iter: plain allreduce
        if self.hook == "topk":
            return self.state.bytes_sent
        return 4 * self.numel

    def begin_step(self, step: int, epoch: float) -> None:
        pass

    def after_step(self) -> None:
        pass

    def drain(self) -> None:
        pass  # DDP finished every bucket inside backward

    def state_dict(self) -> dict[str, Any]:
        return {}  # the model and the optimizer are all there is

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def exchange_plan(self) -> ExchangePlan:
        return ExchangePlan(pattern="allreduce", overlaps_backward=True)  # bucketed, from backward hooks

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": "ddp", "hook": self.hook, "bucket_cap_mb": self.bucket_cap_mb,
                               "broadcast_buffers": self.broadcast_buffers}
        if self.hook == "topk":
            out.update(topk_ratio=self.topk_ratio)
        if self.hook == "powersgd":
            out.update(powersgd_rank=self.powersgd["matrix_approximation_rank"],
                       start_powersgd_iter=self.powersgd["start_powerSGD_iter"],
                       compression_rate=float(self.state.compression_stats()[0]))
        return out
