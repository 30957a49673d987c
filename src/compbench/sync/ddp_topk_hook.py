"""`sync=ddp sync.hook=topk`: the sampled-threshold top-k DDP comm hook a user writes in ~40 lines,
kept as a baseline so that compbench's compressed pipeline is measured next to it.

Per DDP bucket (a flat fp32 buffer of n gradients): add the bucket's residual (error feedback), take
the threshold from a uniform sample of ~1% of the magnitudes (at least ceil(2/ratio)), select every
element at or above it, keep at most 1.5k of them (k = ceil(n ratio)), pad to exactly 1.5k, allgather
one fp32 buffer per rank ([int64 indices as pairs of fp32 words | values]), scatter-add every rank's
values, divide by the world size. What was not sent stays in the residual.
"""

import math

import torch
import torch.distributed as dist
from torch import Tensor

SAMPLE_FRACTION = 0.01
PAD_FACTOR = 1.5


class TopKHookState:
    """Residuals per bucket index, the ratio and the bytes sent since `reset_bytes`."""

    def __init__(self, ratio: float, seed: int = 0) -> None:
        self.ratio = ratio
        self.residuals: dict[int, Tensor] = {}
        self.generator = torch.Generator().manual_seed(seed)
        self.bytes_sent = 0


def topk_hook(state: TopKHookState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    grad = bucket.buffer()
    n, world = grad.numel(), dist.get_world_size()
    residual = state.residuals.get(bucket.index())
    x = grad if residual is None or residual.numel() != n else grad.add_(residual)
    k = max(1, math.ceil(n * state.ratio))
    cap = min(n, math.ceil(PAD_FACTOR * k))
    samples = min(n, max(math.ceil(n * SAMPLE_FRACTION), math.ceil(2 / state.ratio)))
    picked = torch.randint(n, (samples,), generator=state.generator).to(x.device)
    sampled = x[picked].abs()
    threshold = sampled.topk(max(1, math.ceil(samples * state.ratio))).values[-1]
    idx = (x.abs() >= threshold).nonzero().view(-1)[:cap]
    values = x[idx]
    # [cap int64 indices | cap values]: the indices first, where an int64 view is aligned
    send = torch.zeros(3 * cap, dtype=torch.float32, device=x.device)
    send[: 2 * cap].view(torch.int64)[: idx.numel()] = idx
    send[2 * cap :][: idx.numel()] = values
    kept = x.clone()
    kept[idx] = 0
    state.residuals[bucket.index()] = kept
    state.bytes_sent += send.numel() * 4
    gathered = [torch.empty_like(send) for _ in range(world)]
    work = dist.all_gather(gathered, send, async_op=True)

    def decode(_: torch.futures.Future) -> Tensor:
        out = grad.zero_()
        for buf in gathered:  # padding: index 0 with value 0 adds nothing
            out.index_add_(0, buf[: 2 * cap].view(torch.int64), buf[2 * cap :])
        return out.div_(world)

    return work.get_future().then(decode)
