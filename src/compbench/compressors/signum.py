"""`signum`: Signum with majority vote (Bernstein et al., 2018): send the sign of the momentum."""

from __future__ import annotations

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, CompressorBase, Ctx, make_ctx
from compbench.codec.packing import decode_bits, pack_bits, packed_nbytes, unpack_bits
from compbench.compressors.sparse import stable_seed
from compbench.kernels import cpu, cpu_kernels_enabled


class Signum(CompressorBase):
    """Each rank keeps a momentum m = beta*m + (1 - beta)*g per tensor and sends only sign(m),
    packed 8 per byte (ceil(n/8) bytes, no scale). The ranks' signs are combined by majority vote:
    aggregate = sign(sum of signs), +1 / -1 per element and 0 on a tie (even world sizes).

    The compressor owns the momentum, so pair it with `memory=none` and an optimizer without
    momentum: the update is lr * vote. Decoding is a pure function of (payload, ctx): the
    momentum only shapes what this rank sends. Zero momentum counts as positive.
    """

    name = "signum"
    # Bernstein et al. use lr 1e-4..1e-3; on digits lr 0.1 diverged (10.0%), 1e-3 reached 99.4%.
    caps = Capabilities(combine="vote", owns=frozenset({"momentum"}),
                        recipe={"memory": "none", "optim.momentum": 0.0, "optim.lr": 1e-3})

    def __init__(self, beta: float = 0.9) -> None:
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 <= beta < 1:
            raise ValueError(f"compressor=signum: beta={beta} must be in [0, 1); pass e.g. beta=0.9")
        self.beta = float(beta)
        self.momentum: dict[str, Tensor] = {}

    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        flat = x.reshape(-1).float()
        m = self.momentum.get(name)
        if m is None or m.shape != flat.shape or m.device != flat.device:
            m = self.momentum[name] = torch.zeros_like(flat)
        return [_momentum_sign(m, flat, self.beta)], make_ctx(x, name)

    def server_compress(self, vote: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        """What a comm=ps server sends back: the sign of the vote it tallied, packed, with no
        momentum of its own (the workers' momenta already smoothed it: a second one would lag the
        update). A tie (vote 0, even world sizes) takes a random sign from a stream seeded by
        (step, tensor name): 0 in expectation, as in the allgather vote, at one bit per element."""
        flat = vote.reshape(-1)
        gen = torch.Generator(device=flat.device).manual_seed(stable_seed(0, self.step, name))
        coin = torch.rand(flat.shape, generator=gen, device=flat.device) < 0.5
        return [pack_bits(torch.where(flat == 0, coin, flat < 0))], make_ctx(vote, name)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        one = torch.ones(1, dtype=torch.float32, device=payload[0].device)
        return decode_bits(payload[0], ctx.numel, -one, one).view(ctx.shape).to(ctx.dtype)

    def aggregate(self, decoded: list[Tensor]) -> Tensor:
        """Majority vote: sign of the sum of the ranks' signs (not the mean)."""
        total = decoded[0].clone() if len(decoded) == 1 else torch.stack(decoded).sum(0)
        return total.sign_()

    def decompress_all(self, payloads: list[list[Tensor]], ctx: Ctx) -> Tensor:
        """Count the negative votes per element straight from the bits: vote = N - 2 * negatives."""
        world = len(payloads)
        # uint8 counters while they cannot overflow: torch's mixed-dtype in-place add is ~20x slower.
        dtype = torch.uint8 if world <= 255 else torch.int32
        negatives = torch.zeros(ctx.numel, dtype=dtype, device=payloads[0][0].device)
        for payload in payloads:
            negatives += unpack_bits(payload[0], ctx.numel).view(torch.uint8).to(dtype)
        votes = torch.empty(ctx.numel, dtype=torch.float32, device=negatives.device).copy_(negatives)
        return votes.mul_(-2.0).add_(float(world)).sign_().view(ctx.shape).to(ctx.dtype)

    def wire_bytes(self, numel: int) -> int:
        return packed_nbytes(numel, 1)

    def state_dict(self) -> dict:
        return {"momentum": {k: v.clone() for k, v in self.momentum.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.momentum = {k: v.clone() for k, v in state.get("momentum", {}).items()}


def _momentum_sign(m: Tensor, g: Tensor, beta: float) -> Tensor:
    """The hot step: m = beta*m + (1 - beta)*g in place, then the packed bits of (m < 0); on CPU
    one compiled pass (the same momentum bits: a rounded product, then a fused multiply-add)."""
    if cpu_kernels_enabled(m) and cpu_kernels_enabled(g):
        return cpu.signum_step(m, g, beta)
    m.mul_(beta).add_(g, alpha=1.0 - beta)
    return pack_bits(m < 0)
