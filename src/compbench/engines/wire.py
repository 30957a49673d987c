"""Payloads as bytes: a list of tensors of any dtypes travels as one uint8 blob plus a header of
(numel, dtype code) per tensor. Used by the point-to-point `shift` and by comm=ps's all-to-all."""

from __future__ import annotations

import torch
from torch import Tensor

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.int16,
          torch.int8, torch.uint8, torch.bool)
MAX_TENSORS = 8
HEADER_LEN = 1 + 2 * MAX_TENSORS

Spec = tuple[int, torch.dtype]


def header(payload: list[Tensor]) -> Tensor:
    """[number of tensors, (numel, dtype code) per tensor], fixed length, int64."""
    assert len(payload) <= MAX_TENSORS, f"a payload of {len(payload)} tensors exceeds the wire header"
    head = torch.zeros(HEADER_LEN, dtype=torch.int64)
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
