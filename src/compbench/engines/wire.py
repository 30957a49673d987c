"""Payloads as bytes: a list of tensors of any dtypes travels as one uint8 blob plus a header of
(numel, dtype code) per tensor. Used by the point-to-point `shift` and by comm=ps's all-to-all.
Frames (below): a payload as one uint8 tensor for the allgathers, with a smaller header."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
          torch.int8, torch.uint8, torch.bool)
MAX_TENSORS = 8
HEADER_LEN = 1 + 2 * MAX_TENSORS

Spec = tuple[int, torch.dtype]


def header(payload: list[Tensor]) -> Tensor:
    """[number of tensors, (numel, dtype code) per tensor], fixed length, int64."""
    assert len(payload) <= MAX_TENSORS, f"a payload of {len(payload)} tensors exceeds the wire header"
    head = torch.zeros(HEADER_LEN, dtype=torch.int64, device="cpu")  # built on the host, sent where asked
    head[0] = len(payload)
    for i, t in enumerate(payload):
        head[1 + 2 * i] = t.numel()
        head[2 + 2 * i] = DTYPES.index(t.dtype)
    return head


def parse_header(head: Tensor) -> list[Spec]:
    count = int(head[0])
    return [(int(head[1 + 2 * i]), DTYPES[int(head[2 + 2 * i])]) for i in range(count)]


def nbytes(specs: list[Spec]) -> int:
    return sum(numel * dtype.itemsize for numel, dtype in specs)


def to_bytes(payload: list[Tensor], device: torch.device | str = "cpu") -> Tensor:
    parts = [t.contiguous().view(-1).view(torch.uint8) for t in payload if t.numel()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)


def pack(payload: list[Tensor], device: torch.device | str = "cpu") -> Tensor:
    """The payload as one uint8 tensor: its header's bytes, then the tensors' bytes (`unpack`)."""
    return torch.cat([header(payload).to(device).view(torch.uint8), to_bytes(payload, device)])


def unpack(packed: Tensor) -> list[Tensor]:
    """The payload `pack` made (`packed` may start at any byte offset of a larger buffer)."""
    head = packed[: HEADER_LEN * 8].clone().view(torch.int64)
    return from_bytes(packed[HEADER_LEN * 8 :], parse_header(head))


def from_bytes(blob: Tensor, specs: list[Spec]) -> list[Tensor]:
    out, pos = [], 0
    for numel, dtype in specs:
        size = numel * dtype.itemsize
        # clone: a slice at an odd byte offset cannot be reinterpreted as a wider dtype
        out.append(blob[pos : pos + size].clone().view(dtype))
        pos += size
    return out


# Frames: one exchange's payload as ONE uint8 tensor, so that an allgather of it is one collective.
# Every rank's payload has the same number of tensors, the same dtypes and the same trailing
# dimensions (they follow from the rank-independent Ctx); only first dimensions may differ, and only
# for compressors whose bytes depend on the data. Their frames start with a header of one int32 per
# tensor (its first dimension, in payload order): 4 bytes per tensor, booked as sent. A payload whose
# layout is the same on every rank (the compressor declares exact `wire_bytes`) travels without a
# header. The body holds the tensors grouped by dtype, wider dtypes first (`_groups`): every group
# then starts at a multiple of its element size wherever the body does, so a received frame is cut
# back into its tensors by one view and one split per dtype instead of a few calls (and a copy at an
# odd offset) per tensor; a bucket's payload has a hundred tensors or more, and cutting them one by
# one was most of the CPU work of a small exchange (docs/results.md, the exposed communication).
FRAME_DIM_BYTES = 4


def frame_header_bytes(payload: list[Tensor]) -> int:
    return FRAME_DIM_BYTES * len(payload)


def frame(payload: list[Tensor], header: bool) -> Tensor:
    """The payload's bytes grouped by dtype (`_groups`), after a header of first dimensions when
    `header`."""
    device = payload[0].device if payload else torch.device("cpu")
    parts = []
    if header:
        dims = torch.tensor([t.shape[0] if t.dim() else 1 for t in payload], dtype=torch.int32, device=device)
        parts.append(dims.view(torch.uint8))
    for _, members in _groups(payload):
        # one C++ call flattens the group (torch's own helper for bucketing, as DDP's)
        parts.append(_flatten_dense_tensors([payload[i] for i in members]).view(torch.uint8))
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def frame_length(blob: Tensor, like: list[Tensor]) -> int:
    """Bytes of the framed payload (with header) that starts at `blob[0]`."""
    dims = _read_dims(blob, like)
    return frame_header_bytes(like) + sum(d * _row_bytes(t) for d, t in zip(dims, like, strict=True))


def unframe(blob: Tensor, like: list[Tensor], header: bool) -> tuple[list[Tensor], int]:
    """The payload a `frame` of a peer made (`like`: this rank's payload, for dtypes and trailing
    dimensions) and the frame's length in bytes; `blob` may be longer (padding, the next rank's
    frame). The tensors are views of `blob` where its byte offset allows it (a group at an odd
    offset is copied once)."""
    pos, dims = 0, [t.shape[0] if t.dim() else 1 for t in like]
    if header:
        pos, dims = frame_header_bytes(like), _read_dims(blob, like)
    cut: dict[int, Tensor] = {}  # payload position -> its tensor, filled group by group
    for dtype, members in _groups(like):
        if header:  # first dimensions as the peer sent them
            numels = [dims[i] * math.prod(like[i].shape[1:]) for i in members]
        else:  # the shapes are this rank's
            numels = [like[i].numel() for i in members]
        size = sum(numels) * dtype.itemsize
        region = blob[pos : pos + size]
        if region.storage_offset() % dtype.itemsize:
            region = region.clone()  # an odd byte offset cannot be reinterpreted as a wider dtype
        typed = region.view(dtype)
        if header:
            for i, piece in zip(members, typed.split(numels), strict=True):
                t = like[i]
                cut[i] = (piece if t.dim() == 1 else piece.view(dims[i], *t.shape[1:]) if t.dim()
                          else piece.view(()))
        else:  # one C++ call cuts the group into views of this rank's shapes
            pieces = _unflatten_dense_tensors(typed, [like[i] for i in members])
            cut.update(zip(members, pieces, strict=True))
        pos += size
    return [cut[i] for i in range(len(like))], pos


def _groups(payload: list[Tensor]) -> list[tuple[torch.dtype, list[int]]]:
    """The payload's positions grouped by dtype, wider dtypes first (then by `DTYPES` order), each
    group in payload order: the frame's body layout."""
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(payload):
        groups.setdefault(t.dtype, []).append(i)
    return sorted(groups.items(), key=lambda g: (-g[0].itemsize, DTYPES.index(g[0])))


def _read_dims(blob: Tensor, like: list[Tensor]) -> list[int]:
    return blob[: frame_header_bytes(like)].clone().view(torch.int32).tolist()


def _row_bytes(t: Tensor) -> int:
    """Bytes per unit of the first dimension (a 0-dim tensor is one row)."""
    return math.prod(t.shape[1:]) * t.element_size()
