"""`comm=allgather`: every rank receives every rank's payload (sizes may differ), decodes all of
them and averages. Works for any compressor; the only choice for rank-dependent sparse indices."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from compbench.comm.base import CommBase, CommTraits, encode
from compbench.compressors.buffers import acc_dtype
from compbench.engines.base import Handle
from compbench.memory.base import Memory


class AllgatherComm(CommBase):
    """For a name in `sparse_names` a sparsifier's average comes back sparse, undecoded (see
    `Communicator.reduce`); otherwise decoded into the gradient it was handed where it can be."""

    traits: ClassVar[CommTraits] = CommTraits(sparse_results=True)

    def reduce(self, grad: Tensor, name: str, memory: Memory) -> Handle:
        payload, ctx = encode(self.compressor, memory, grad, name, self.stats)
        # One collective: a payload whose layout every rank knows (exact wire_bytes) goes as it is,
        # an uneven one framed with its sizes (engines.wire) within the compressor's bound.
        exact = self.compressor.wire_bytes(grad.numel())
        bound = None if exact is not None else self.compressor.max_wire_bytes(grad.numel())
        gathered = self.engine.allgather_payload_async(payload, name, bound)
        sparse = self.compressor.caps.sparse_average and name in self.sparse_names
        into = None if sparse else _decode_target(self.compressor.caps.decodes_into, grad, payload)

        def finish() -> Tensor:
            payloads, sent = gathered.wait()
            self.book(sent)  # what really left this rank: the payload, its header and any padding
            with self.stats.time("decompress"):
                if sparse:
                    return self.compressor.decompress_all_sparse(payloads, ctx)  # type: ignore[attr-defined]
                if into is None:
                    return self.compressor.decompress_all(payloads, ctx)
                return self.compressor.decompress_all(payloads, ctx, out=into)  # type: ignore[call-arg]

        return Handle(finish)


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
