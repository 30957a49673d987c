"""`dgc`: Deep Gradient Compression's sparsifier (Lin et al., ICLR 2018): sampled threshold + adaptation.

The momentum correction, factor masking and local clipping live in memory=dgc (memory/dgc.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from compbench.codec.base import Ctx, check_ratio, make_ctx
from compbench.codec.finite import FiniteCheck, flag
from compbench.compll import runtime
from compbench.compressors.sparse import AbsIndex, SparseCompressor, Workspace, make_generator, sparse_payload
from compbench.kernels import cpu, cpu_kernels_enabled

if TYPE_CHECKING:
    from compbench.codec.deferred import Deferred


def sample_layout(numel: int, ratio: float, sample_ratio: float) -> tuple[int, int]:
    """(stride, number of samples wanted): at least max(ceil(sample_ratio*n), ceil(2/r)) samples,
    stride 1 (every element) when that is the whole tensor."""
    wanted = max(math.ceil(numel * sample_ratio), math.ceil(2.0 / ratio))
    if wanted >= numel:
        return 1, numel
    return numel // wanted, wanted


def _select(
    values: Tensor | None, k: int, ratio: float, sample_ratio: float, gen: torch.Generator, ws: Workspace,
    deferred: Deferred | None = None, check: FiniteCheck | None = None,
) -> Tensor:
    """Hot step: flat int64 indices DGC sends (at most k), selected by magnitude abs(values), at
    ratio `ratio` (`values` may be the gradient itself or its magnitudes: abs changes nothing then).

    The selection is generated from compll/specs/dgc.py (`runtime.select_indices`): the strided
    sample's start drawn from `gen`, the threshold of the ceil(m*r) largest sampled magnitudes, the
    filter, at most 10 adaptations (fewer than 0.8k: threshold *= 0.8, retry; above 1.3k the paper
    stops with the exact top-k, which the limit does), then the k largest candidates, also between
    k and 1.3k, where synxlin truncates by index instead.

    On CPU with the compiled kernels, one summary pass replaces the generated threshold's strided
    read and the filter's full read: it computes the block maxima of the tensor (`sparse.AbsIndex`,
    whose query then re-reads only the blocks that reach the threshold) and gathers the strided
    sample on its way (the same values, so the same indices). With a memory's `deferred`
    compensation (then `values` is None) that pass is the memory's own (`codec.deferred.Deferred`),
    and the indices index `deferred.result`. `check`: the trainer's non-finite check of the
    gradient, done by that summary pass (codec/finite.py); the generated selection without it does
    not take it (the trainer then reads the gradient itself)."""
    sel = runtime.select("dgc")
    if deferred is None:
        assert values is not None
        flat = values.detach().reshape(-1)
        n, device = flat.numel(), flat.device
        _, wanted = sample_layout(n, ratio, sample_ratio)
        if not (cpu_kernels_enabled(flat) and AbsIndex.takes_summary(flat, ratio)):
            return runtime.select_indices(sel, flat, ratio, wanted, k, gen)

        def summarize(samples: Tensor | None, start: int, stride: int) -> tuple[Tensor, Tensor | None]:
            return flat, cpu.block_absmax(flat, samples, start, stride, flag(check, flat.device))
    else:
        n, device = deferred.numel, deferred.device
        _, wanted = sample_layout(n, ratio, sample_ratio)
        fused = deferred

        def summarize(samples: Tensor | None, start: int, stride: int) -> tuple[Tensor, Tensor | None]:
            return fused.summary(samples, start, stride, check)
    where = runtime.strided_sample(sel, n, wanted, gen)
    sample = None
    if where is None:
        y, summary = summarize(None, 0, 1)
    else:
        start, stride, count = where
        sample = runtime.StridedSample(start, stride, torch.empty(count, device=device))
        y, summary = summarize(sample.values, start, stride)
    index = AbsIndex(y.detach().reshape(-1), ws, density=ratio, summary=summary)
    return runtime.select_indices(sel, y, ratio, wanted, k, gen, compaction=index.indices_ge, sample=sample)


class DGC(SparseCompressor):
    """DGC's sparsifier as in the paper and synxlin/deep-gradient-compression.

    Threshold = the smallest of the top ceil(m*r) of m >= max(ceil(0.01 n), ceil(2/r)) magnitudes
    sampled with a stride from a random start (seeded by seed, step, tensor name: reproducible). Then
    at most 10 adaptations: more than 1.3k selected -> exact top-k among the candidates, stop; fewer
    than 0.8k -> threshold *= 0.8, retry. At most k are sent: where synxlin truncates by INDEX when
    k < count <= 1.3k (biased towards the first rows), compbench keeps the k largest candidates.
    Payload [values fp32 (fp16 with fp16_values=true), indices int32]: 8k' (6k') bytes, k' <= k.

    Ratio warm-up (`warmup_epochs` W > 0): during epoch e < W the ratio is max(r, warmup_coeff**(e+1)),
    exponential decay from 0.25 by default: 0.25, 0.0625, 0.0156, 0.0039, 0.001 for W = 5, r = 1e-3
    (DGC's published warm-up); from epoch W on it is r. The epoch comes from `begin_step`.
    The yaml's `min_dims: 2` makes the trainer send 1-D tensors dense, but compress works on any shape.

    Host waits (the method needs them): the adaptation decides on the number of candidates, and the
    payload's size is that number, so on a GPU the compaction of the candidates (a nonzero) is read by
    the host once per tensor and adaptation, inside the backward hook that compresses it
    (scripts/host_waits.py counts them: 2 a step for the test MLP's two matrices).
    """

    name = "dgc"
    # DGC's recipe is its momentum correction (memory=dgc), with the optimizer's usual momentum on
    # the tensors that stay dense and on the weight-decay term.
    caps = replace(SparseCompressor.caps, recipe={"memory": "dgc"}, fuses_memory=True)

    def __init__(
        self,
        ratio: float = 0.01,
        sample_ratio: float = 0.01,
        warmup_epochs: int = 0,
        warmup_coeff: float = 0.25,
        fp16_values: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.base_ratio = check_ratio(ratio, "compressor=dgc")
        if not (0 < float(sample_ratio) <= 1):
            raise ValueError(f"compressor=dgc: sample_ratio={sample_ratio} is outside (0, 1]; use e.g. 0.01")
        if int(warmup_epochs) < 0:
            raise ValueError(f"compressor=dgc: warmup_epochs={warmup_epochs} is negative; use 0 to disable")
        if not (0 < float(warmup_coeff) < 1):
            raise ValueError(f"compressor=dgc: warmup_coeff={warmup_coeff} is outside (0, 1); use e.g. 0.25")
        # DGC clamps the sample ratio to [0.01, 1].
        self.sample_ratio = min(1.0, max(0.01, float(sample_ratio)))
        self.warmup_epochs = int(warmup_epochs)
        self.warmup_coeff = float(warmup_coeff)
        self.value_dtype = torch.float16 if fp16_values else torch.float32
        self.seed = int(seed)

    @property
    def ratio(self) -> float:  # type: ignore[override]  # read-only: a schedule over the set ratio
        """The ratio in force at the current epoch (warm-up schedule, then the configured ratio)."""
        e = math.floor(self.epoch)
        if e < self.warmup_epochs:
            return max(self.base_ratio, self.warmup_coeff ** (e + 1))
        return self.base_ratio

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.detach().reshape(-1)
        r = self.ratio
        k = self.k_for(flat.numel())
        gen = make_generator(self.seed, self.step, name)
        idx = _select(flat, k, r, self.sample_ratio, gen, self._ws,
                      check=self.finite.check(name, flat.numel()))
        return sparse_payload(flat.index_select(0, idx), idx, self.value_dtype), make_ctx(x, name)

    def compress_deferred(self, deferred: Deferred, name: str) -> tuple[list[Tensor], Ctx]:
        """`compress` of a memory's compensation (memory=dgc's momentum correction), run inside the
        selection's summary pass: the same payload, one pass fewer over the gradient."""
        gen = make_generator(self.seed, self.step, name)
        idx = _select(None, self.k_for(deferred.numel), self.ratio, self.sample_ratio, gen, self._ws,
                      deferred=deferred, check=self.finite.check(name, deferred.numel))
        y = deferred.result
        assert y is not None
        return sparse_payload(y.reshape(-1).index_select(0, idx), idx, self.value_dtype), make_ctx(y, name)

    def max_wire_bytes(self, numel: int) -> int:
        return (self.value_dtype.itemsize + 4) * self.k_for(numel)
