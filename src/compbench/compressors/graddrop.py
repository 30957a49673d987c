"""`graddrop`: Aji and Heafield's gradient dropping (EMNLP 2017): drop the (1 - r) smallest by magnitude.
On a GPU its selection reads the selected count on the host once per tensor (the payload's size)."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from compbench.codec.base import Ctx, check_ratio, make_ctx
from compbench.codec.buffers import acc_dtype
from compbench.compll import runtime
from compbench.compressors.sparse import SparseCompressor, make_generator, sparse_payload

# Everything that passes the sampled threshold is sent, up to this many times k (ties, an all-zero
# gradient or an unlucky sample could otherwise send the whole tensor).
_CAP = 2


class GradDrop(SparseCompressor):
    """Gradient dropping: a threshold estimated from a uniform sample keeps a fraction ~r of the
    entries; all entries above it are sent (no adaptation, at most 2k), [values fp32, indices int32].

    The algorithm's residual accumulation (R += g; the sent entries leave R) is exactly error feedback
    with memory=residual, the memory to use with it (the compressor itself is stateless). Samples:
    max(ceil(sample_ratio*n), ceil(2/r)) (all of a small tensor), seeded by (seed, step, tensor name).
    The selection's kernels and the decode are generated from compll/specs/graddrop.py
    (`runtime.select_indices`, `runtime.select_decode`).
    """

    name = "graddrop"
    caps = replace(SparseCompressor.caps, random_sample=True)

    def __init__(self, ratio: float = 0.01, sample_ratio: float = 0.01, seed: int = 0) -> None:
        super().__init__()
        self.ratio = check_ratio(ratio, "compressor=graddrop")
        if not (0 < float(sample_ratio) <= 1):
            raise ValueError(f"compressor=graddrop: sample_ratio={sample_ratio} is outside (0, 1]; use 0.01")
        self.sample_ratio = float(sample_ratio)
        self.seed = int(seed)

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.detach().reshape(-1)
        n = flat.numel()
        m = self._samples(n)
        gen = make_generator(self.seed, self.step, name, device=flat.device)
        cap = _CAP * self.k_for(n)
        idx = runtime.select_indices(runtime.select("graddrop"), flat, self.ratio, m, cap, gen)
        return sparse_payload(flat[idx], idx), make_ctx(x, name)

    def _samples(self, numel: int) -> int:
        return max(math.ceil(self.sample_ratio * numel), math.ceil(2.0 / self.ratio))

    def sampled_reads(self, numel: int) -> int:
        """The threshold's sample (`Capabilities.random_sample`); none when it is the whole tensor."""
        m = self._samples(numel)
        return m if m < numel else 0

    def max_wire_bytes(self, numel: int) -> int:
        return 8 * min(numel, _CAP * self.k_for(numel))

    def decompress(self, payload: list[Tensor], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Dense decode (the generated scatter); into the caller's buffer `out` when given."""
        return runtime.select_decode(runtime.select("graddrop"), payload[0], payload[1], ctx, out)

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx, out: Tensor | None = None) -> Tensor:
        """Average of every rank's decode: the few sent values divided by N, one generated scatter."""
        acc = acc_dtype(ctx.dtype)
        values = torch.cat([p[0].to(acc) for p in payloads]).div_(len(payloads))
        indices = torch.cat([p[1] for p in payloads])
        return runtime.select_decode(runtime.select("graddrop"), values, indices, ctx, out)
