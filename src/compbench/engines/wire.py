"""Payloads as bytes: a list of tensors of any dtypes travels as one uint8 blob plus a header of
(numel, dtype code) per tensor. Used by the point-to-point `shift` and by comm=ps's all-to-all.
Frames (below): a payload as one uint8 tensor for the allgathers, with a smaller header."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from compbench.engines.device import host_to

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
    """The specs of a `header`: read by the host in one go (one wait for a device tensor, where an
    element-by-element read waited once per element); the receiver must know the sizes."""
    return _specs(head.tolist())


def parse_headers(heads: Tensor) -> list[list[Spec]]:
    """The specs of several `header`s, one per row of `heads` (int64, HEADER_LEN columns): ONE host
    read for all of them (one wait on a GPU where a read per header waited once per header)."""
    return [_specs(row) for row in heads.tolist()]


def _specs(values: list[int]) -> list[Spec]:
    count = values[0]
    return [(values[1 + 2 * i], DTYPES[values[2 + 2 * i]]) for i in range(count)]


def nbytes(specs: list[Spec]) -> int:
    return sum(numel * dtype.itemsize for numel, dtype in specs)


def to_bytes(payload: list[Tensor], device: torch.device | str = "cpu") -> Tensor:
    parts = [t.contiguous().view(-1).view(torch.uint8) for t in payload if t.numel()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)


def pack(payload: list[Tensor], device: torch.device | str = "cpu") -> Tensor:
    """The payload as one uint8 tensor: its header's bytes, then the tensors' bytes (`unpack`)."""
    return torch.cat([host_to(header(payload), device).view(torch.uint8), to_bytes(payload, device)])


def unpack(packed: Tensor) -> list[Tensor]:
    """The payload `pack` made (`packed` may start at any byte offset of a larger buffer)."""
    return unpack_all([packed])[0]


def unpack_all(packed: list[Tensor]) -> list[list[Tensor]]:
    """The payloads `pack` made, one per tensor of `packed` (each may start at any byte offset of a
    larger buffer): every header read by the host at once (`parse_headers`: one wait per exchange
    on a GPU), the sizes then cut the rest."""
    if not packed:
        return []
    # a copy: a payload may start at any byte offset, which an int64 view cannot
    heads = torch.stack([p[: HEADER_LEN * 8] for p in packed]).view(torch.int64)
    specs = parse_headers(heads)
    return [from_bytes(p[HEADER_LEN * 8 :], s) for p, s in zip(packed, specs, strict=True)]


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
# tensor (its first dimension, in payload order): 4 bytes per tensor, booked as sent. The host needs
# them to cut the frames (and the torch engine to size its next capacity): a receiver reads every
# rank's header in ONE host read per exchange (`read_headers`, one wait on a GPU), then cuts each
# frame with the dims it read (`frame_length`, `unframe`). A payload whose
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
    if header:  # the shapes are the host's: built there, copied without a wait (`host_to`)
        dims = torch.tensor([t.shape[0] if t.dim() else 1 for t in payload], dtype=torch.int32)
        parts.append(host_to(dims, device).view(torch.uint8))
    for _, members in _groups(payload):
        # one C++ call flattens the group (torch's own helper for bucketing, as DDP's)
        parts.append(_flatten_dense_tensors([payload[i] for i in members]).view(torch.uint8))
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def read_headers(frames: Tensor, like: list[Tensor]) -> list[list[int]]:
    """Every frame's header (its first dimensions) from `frames`, one frame per row (a 2-D uint8
    tensor, rows at least the header long): ONE host read for all of them, the one wait per exchange
    on a GPU that cutting uneven frames needs (the host must know where each tensor ends)."""
    # a copy: a frame may start at any byte offset, which an int32 view cannot
    heads = frames[:, : frame_header_bytes(like)].clone(memory_format=torch.contiguous_format)
    return heads.view(torch.int32).tolist()


def frame_length(dims: list[int], like: list[Tensor]) -> int:
    """Bytes of the framed payload (with header) whose header holds `dims` (`read_headers`)."""
    return frame_header_bytes(like) + sum(d * _row_bytes(t) for d, t in zip(dims, like, strict=True))


def unframe(blob: Tensor, like: list[Tensor], header: bool,
            dims: list[int] | None = None) -> tuple[list[Tensor], int]:
    """The payload a `frame` of a peer made (`like`: this rank's payload, for dtypes and trailing
    dimensions) and the frame's length in bytes; `blob` may be longer (padding, the next rank's
    frame). The tensors are views of `blob` where its byte offset allows it (a group at an odd
    offset is copied once). With `header`, `dims` is the frame's header as `read_headers` read it;
    without them the header is read from `blob` here (a host read per frame: one wait on a GPU)."""
    pos, first = 0, [t.shape[0] if t.dim() else 1 for t in like]
    if header:
        pos = frame_header_bytes(like)
        first = dims if dims is not None else read_headers(blob[:pos].view(1, -1), like)[0]
    cut: dict[int, Tensor] = {}  # payload position -> its tensor, filled group by group
    for dtype, members in _groups(like):
        if header:  # first dimensions as the peer sent them
            numels = [first[i] * math.prod(like[i].shape[1:]) for i in members]
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
                cut[i] = (piece if t.dim() == 1 else piece.view(first[i], *t.shape[1:]) if t.dim()
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


def _row_bytes(t: Tensor) -> int:
    """Bytes per unit of the first dimension (a 0-dim tensor is one row)."""
    return math.prod(t.shape[1:]) * t.element_size()
