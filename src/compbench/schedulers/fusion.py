"""Gradient groups: which parameters travel together, their flat buffers, and how error-feedback
state follows a change of grouping. Shared by `layerwise` (groups of one tensor) and `mergecomp`.

A group is a run of consecutive parameters in ready order (the order in which back-propagation
finishes their gradients). It is sent in at most two parts:
- the members the compressor may take (at least `min_dims` dimensions) fused into one flat buffer
  (a part of one member sends that gradient itself, shape kept);
- the members `min_dims` sends dense (biases and norms under DGC's `min_dims: 2`), fused into a
  second flat buffer that goes through the dense allreduce.
Flat buffers are allocated once per group and reused every step. Zero copy (DDP's
`gradient_as_bucket_view`): before back-propagation `bind` makes the members' .grad views of their
buffer, so autograd accumulates into it, the buffer is sent as it is, and the averaged result (the
buffer itself after the in-place dense allreduce, or a decode) lands where the .grads already look.
A member whose .grad was replaced (a user's own loop that skips `before_backward`) is copied in.
A packed group (scheduler=bucket) is one `PackedPart` instead: its members compressed one by one,
their payloads sent in one exchange (`GradientPipeline.submit_many`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from compbench.seam.pipeline import GradientPipeline


def balanced_cuts(nbytes: list[int], groups: int, skew: float = 1.0) -> list[int]:
    """Start index of each of `groups` contiguous, non-empty runs of `nbytes`, balanced by bytes.

    Group i aims at a share of the total proportional to skew**(i / (groups - 1)): equal shares for
    skew 1, a last group `skew` times the first otherwise (skew < 1 makes the groups that are ready
    last, whose communication nothing hides, smaller). Each cut is placed at the prefix sum closest
    to its target, then moved just enough to keep every group non-empty.
    """
    n = len(nbytes)
    groups = max(1, min(groups, n))
    weights = [skew ** (i / (groups - 1)) if groups > 1 else 1.0 for i in range(groups)]
    total, wsum = float(sum(nbytes)), sum(weights)
    prefix = [0.0]
    for b in nbytes:
        prefix.append(prefix[-1] + b)
    cuts, acc = [0], 0.0
    for j in range(1, groups):
        acc += weights[j - 1]
        target = total * acc / wsum
        best = min(range(1, n), key=lambda c: (abs(prefix[c] - target), c))
        cuts.append(min(max(best, cuts[-1] + 1), n - (groups - j)))
    return cuts


def split(order: list[int], cuts: list[int]) -> list[list[int]]:
    """`order` cut into runs starting at `cuts`."""
    ends = [*cuts[1:], len(order)]
    return [order[a:b] for a, b in zip(cuts, ends, strict=True)]


class Part:
    """What one submission sends: one tensor as it is, or several fused into a flat buffer."""

    def __init__(self, name: str, members: list[tuple[str, nn.Parameter]], dense: bool) -> None:
        self.members, self.dense = members, dense
        self.name = members[0][0] if len(members) == 1 else name
        self.fused = len(members) > 1
        self.numel = sum(p.numel() for _, p in members)
        self.shape = members[0][1].shape if not self.fused else torch.Size([self.numel])
        self._flat: Tensor | None = None
        self._view_list: list[tuple[nn.Parameter, Tensor]] | None = None
        if self.fused and len({(p.dtype, p.device) for _, p in members}) > 1:
            raise ValueError(f"scheduler: {name} would fuse tensors of different dtypes or devices; "
                             "use scheduler=layerwise")

    def _buffer(self) -> Tensor:
        if self._flat is None:
            p0 = self.members[0][1]
            self._flat = torch.zeros(self.numel, dtype=p0.dtype, device=p0.device)
        return self._flat

    def _views(self) -> list[tuple[nn.Parameter, Tensor]]:
        """(member, its view of the flat buffer), made once: the same view objects every step, so a
        bound member is recognised by identity (`p.grad is view`) without comparing memory."""
        if self._view_list is None:
            flat, pos, self._view_list = self._buffer(), 0, []
            for _, p in self.members:
                self._view_list.append((p, flat[pos : pos + p.numel()].view(p.shape)))
                pos += p.numel()
        return self._view_list

    def bind(self) -> None:
        """Before back-propagation: the members' gradients become zeroed views of the flat buffer."""
        if self.fused:
            self._buffer().zero_()
            for p, view in self._views():
                p.grad = view

    def gradient(self) -> Tensor:
        """The gradient to send: the member's own .grad, or the flat buffer the members' .grads view
        (a member not bound is copied in). A member without a gradient (unused this step) sends
        zeros: every rank sends every part."""
        if not self.fused:
            p = self.members[0][1]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            return p.grad
        for p, view in self._views():
            if p.grad is None:
                p.grad = view.zero_()
            elif p.grad is not view:  # not bound, or autograd replaced the bound view
                land(view, p.grad)
        return self._buffer()

    def submit(self, pipeline: GradientPipeline, dense: bool) -> None:
        members = [(n, p.numel()) for n, p in self.members] if self.fused else None
        pipeline.submit(self.name, self.gradient(), fused=self.fused, dense=dense or self.dense,
                        members=members)

    def write_back_from(self, averaged: dict[str, Tensor]) -> None:
        """This part's average (`averaged` holds the step's results by name) into the .grads."""
        self.write_back(averaged[self.name])

    def write_back(self, averaged: Tensor) -> None:
        if averaged.is_sparse:  # the averaged sparse payload (pipeline.sparse_names): the optimizer's
            assert not self.fused, "sparse results are asked for single tensors only"
            self.members[0][1].grad = averaged  # input as it is, decoded by nobody
            return
        flat, pos = averaged.reshape(-1), 0
        for _, p in self.members:
            grad = p.grad
            assert grad is not None  # sent: has one
            land(grad, flat[pos : pos + p.numel()].view(grad.shape))
            pos += p.numel()


def land(dst: Tensor, src: Tensor) -> None:
    """dst <- src, skipped when src already is dst's memory (an in-place result, a bound view).
    Compared as start and contiguity, not strides: a size-1 dimension's stride is arbitrary (a conv
    kernel with one input channel viewed two ways has strides (9, 1, 3, 1) and (9, 9, 3, 1))."""
    if (dst.data_ptr() == src.data_ptr() and dst.shape == src.shape
            and dst.is_contiguous() and src.is_contiguous()):
        return
    same_storage = dst.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
    dst.copy_(src.clone() if same_storage else src)  # a partial overlap must not alias the read


class PackedPart:
    """Several tensors in one exchange: each compressed on its own under its own name (its shape,
    memory and selection rules as under `layerwise`), their payloads in one collective per stage."""

    def __init__(self, name: str, members: list[tuple[str, nn.Parameter]]) -> None:
        self.name, self.members = name, members

    def bind(self) -> None:
        pass  # each member sends its own .grad

    def submit(self, pipeline: GradientPipeline, dense: bool) -> None:
        items = []
        for name, p in self.members:
            if p.grad is None:  # unused this step: every rank sends every tensor
                p.grad = torch.zeros_like(p)
            items.append((name, p.grad))
        pipeline.submit_many(self.name, items, dense=dense)

    def write_back_from(self, averaged: dict[str, Tensor]) -> None:
        """Every member's average (`averaged` holds the step's results by name) into its .grad."""
        for name, p in self.members:
            result = averaged[name]
            if result.is_sparse:  # the averaged sparse payload (pipeline.sparse_names), as Part's
                p.grad = result
            else:
                assert p.grad is not None  # sent: has one
                land(p.grad, result)


class Group:
    """Consecutive parameters (in ready order) submitted together once the last one is ready."""

    def __init__(self, members: list[tuple[str, nn.Parameter]], min_dims: int, name: str,
                 packed: bool = False) -> None:
        self.members = members
        self.parts: list[Part | PackedPart] = []
        if packed:
            self.parts.append(PackedPart(name, members))
            return
        sparse = [m for m in members if m[1].dim() >= min_dims]
        dense = [m for m in members if m[1].dim() < min_dims]
        if sparse:
            self.parts.append(Part(name, sparse, dense=False))
        if dense:
            self.parts.append(Part(f"{name}.dense", dense, dense=True))

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for _, p in self.members)

    def bind(self) -> None:
        for part in self.parts:
            part.bind()

    def submit(self, pipeline: GradientPipeline, dense: bool = False) -> None:
        for part in self.parts:
            part.submit(pipeline, dense)

    def write_back(self, averaged: dict[str, Tensor]) -> None:
        for part in self.parts:
            part.write_back_from(averaged)


def build_groups(params: list[tuple[str, nn.Parameter]], runs: list[list[int]], min_dims: int,
                 packed: bool = False) -> list[Group]:
    """Groups for `runs` (lists of indices into `params`, in submission order). A fused group is named
    after the positions it covers, so that error-feedback state is never shared by two groupings
    (a packed one keeps its members' names: their state is theirs)."""
    out, pos = [], 0
    for run in runs:
        prefix = "bucket" if packed else "fused"
        out.append(Group([params[i] for i in run], min_dims, f"{prefix}.{pos}-{pos + len(run) - 1}", packed))
        pos += len(run)
    return out


def compressible_layout(groups: list[Group]) -> list[tuple[str, torch.Size]]:
    """(name, shape) of every part that may carry error-feedback state, in order: their concatenation
    is the same vector (all compressible gradients in ready order) whatever the grouping."""
    return [(part.name, part.shape) for g in groups for part in g.parts
            if isinstance(part, Part) and not part.dense]


def reslice_state(state: dict, old: list[tuple[str, torch.Size]], new: list[tuple[str, torch.Size]]) -> dict:
    """Per-name state (error-feedback residuals, DGC momentum and velocity, compressor residuals) of
    the `old` parts, cut for the `new` ones: every dict in `state` holding tensors of the old parts'
    sizes is concatenated in old order and split at the new boundaries. A part without an entry
    (it went dense) counts as zeros. Anything else is left as it is."""
    numel = {name: math.prod(shape) for name, shape in old}
    if old == new:
        return state

    def convert(d: object) -> object:
        if not isinstance(d, dict):
            return d
        hits = [n for n in numel if n in d]
        if hits and all(isinstance(d[n], Tensor) and d[n].numel() == numel[n] for n in hits):
            ref = d[hits[0]]
            flat = torch.cat([d[n].reshape(-1) if n in d else ref.new_zeros(numel[n]) for n, _ in old])
            out = {k: v for k, v in d.items() if k not in numel}
            pos = 0
            for name, shape in new:
                size = math.prod(shape)
                out[name] = flat[pos : pos + size].view(shape)
                pos += size
            return out
        return {k: convert(v) for k, v in d.items()}

    converted = convert(state)
    assert isinstance(converted, dict)  # a dict converts to a dict
    return converted


def regroup_state(pipeline: GradientPipeline, old: list[Group], new: list[Group]) -> None:
    """Move the memory's and the compressor's per-name state from the `old` grouping to the `new` one."""
    before, after = compressible_layout(old), compressible_layout(new)
    if before == after:
        return
    for holder in (pipeline.memory, pipeline.compressor):
        holder.load_state_dict(reslice_state(holder.state_dict(), before, after))
