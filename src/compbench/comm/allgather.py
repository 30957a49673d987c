"""`comm=allgather`: every rank receives every rank's payload (sizes may differ), decodes all of
them and averages. Works for any compressor; the only choice for rank-dependent sparse indices.
`reduce_many` (scheduler=bucket, DiLoCo's outer exchange) sends several tensors' payloads as one
allgather."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from torch import Tensor

from compbench.codec.base import Ctx, averages_sparse, decodes_into, same_layout
from compbench.codec.buffers import acc_dtype
from compbench.comm.base import CommBase, CommTraits, encode
from compbench.engines.base import Handle
from compbench.memory.base import Memory


class AllgatherComm(CommBase):
    """For a name in `sparse_names` a sparsifier's average comes back sparse, undecoded (see
    `Communicator.reduce`); otherwise decoded into the gradient it was handed where it can be."""

    traits: ClassVar[CommTraits] = CommTraits(sparse_results=True, packs=True)
    sparse_names: frozenset[str] = frozenset()  # set by the pipeline (see Communicator.reduce)

    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        finish = self._gather(name, [(name, grad)], memory)
        return Handle(lambda: finish()[0])

    def reduce_many(self, name: str, items: list[tuple[str, Tensor]], memory: Memory) -> Handle:
        return Handle(self._gather(name, items, memory))

    def _gather(self, name: str, items: list[tuple[str, Tensor]],
                memory: Memory) -> Callable[[], list[Tensor]]:
        """Encode every item, start ONE allgather of all their payloads; the returned function
        waits for it and decodes every item's average."""
        encoded = [encode(self.compressor, memory, grad, item, self.stats) for item, grad in items]
        payload = [t for p, _ in encoded for t in p]
        # A payload whose layout every rank knows (`same_layout`) goes as it is, an uneven one
        # framed with its sizes (engines.wire) within the compressor's bound.
        exact = all(same_layout(self.compressor, grad.shape) for _, grad in items)
        bound = None if exact else sum(self.compressor.max_wire_bytes(grad.numel()) for _, grad in items)
        gathered = self.engine.allgather_payload_async(payload, name, bound)
        caps = self.compressor.caps
        sparse = [caps.sparse_average and item in self.sparse_names for item, _ in items]
        into = [None if s else _decode_target(caps.decodes_into, grad, p)
                for s, (_, grad), (p, _) in zip(sparse, items, encoded, strict=True)]

        def finish() -> list[Tensor]:
            payloads, sent = gathered.wait()
            self.book(sent)  # what really left this rank: the payloads, their header and any padding
            out, pos = [], 0
            with self.stats.time("decompress"):
                for (p, ctx), s, buf in zip(encoded, sparse, into, strict=True):
                    mine = [rank_payload[pos : pos + len(p)] for rank_payload in payloads]
                    pos += len(p)
                    out.append(self._decode(mine, ctx, s, buf))
            return out

        return finish

    def _decode(self, payloads: list[list[Tensor]], ctx: Ctx, sparse: bool, into: Tensor | None) -> Tensor:
        comp = self.compressor
        if sparse and averages_sparse(comp):  # `sparse` only where caps.sparse_average
            return comp.decompress_all_sparse(payloads, ctx)
        if into is not None and decodes_into(comp):  # `into` only where caps.decodes_into
            return comp.decompress_all(payloads, ctx, out=into)
        return self.compressor.decompress_all(payloads, ctx)


def _decode_target(decodes_into: bool, grad: Tensor, payload: list[Tensor]) -> Tensor | None:
    """The gradient itself as the decode buffer (it was compensated and encoded already; the result
    replaces it), unless the compressor cannot decode into a buffer, the layout does not fit, or a
    payload tensor still reads the gradient's memory."""
    if not decodes_into or not grad.is_contiguous() or grad.dtype != acc_dtype(grad.dtype):
        return None
    storage = grad.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == storage for t in payload):
        return None
    return grad.view(-1)
