"""`powersgd`: PowerSGD (Vogels et al., NeurIPS 2019), rank-q power iteration with warm start."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from compbench.codec.base import Capabilities, CompressorBase, Ctx, make_ctx
from compbench.compressors.lowrank import cpu_generator, dense_payload, matrix_shape, stable_seed
from compbench.engines.device import host_to

Reduce = Callable[[Tensor], Tensor]


def orthogonalize_(mat: Tensor, rtol: float = 1e-4) -> Tensor:
    """Gram-Schmidt on the columns of `mat`, in place; returns `mat`.

    Each column is projected off the previous ones twice ("twice is enough": one classical pass
    loses orthogonality when most of a column cancels, as it does for a nearly dependent column).
    A column left with less than `rtol` of its norm depends on the previous ones (rank-deficient
    gradient) or is zero: it becomes exactly 0 instead of NaN (torch's hook divides by norm + eps,
    which turns such a column into normalised rounding noise that is not orthogonal to the rest).
    No host synchronisation. For the 1 to 4 columns of PowerSGD this is cheaper than a QR.
    """
    for i in range(mat.shape[1]):
        col = mat[:, i : i + 1]
        before = torch.linalg.vector_norm(col)
        if i:
            prev = mat[:, :i]
            for _ in range(2):
                col.sub_(prev @ (prev.T @ col))
        after = torch.linalg.vector_norm(col)
        keep = after > rtol * before  # False for a zero column (0 > 0)
        col.mul_(torch.where(keep, after.reciprocal(), torch.zeros_like(after)))
    return mat


def _identity(t: Tensor) -> Tensor:
    return t


def _power_step(m: Tensor, q: Tensor, reduce: Reduce = _identity) -> tuple[Tensor, Tensor]:
    """The hot step: one power iteration. P = reduce(M Q); orthogonalize P; Q = reduce(M^T P).

    `reduce` is the identity for the local API and the allreduce-mean for the collective one; `q`
    must be the same on every rank (then mean(M_r Q) = mean(M) Q and P Q^T approximates mean(M)).
    """
    p = reduce(m @ q)
    orthogonalize_(p)
    return p, reduce(m.T @ p)


class PowerSGD(CompressorBase):
    """Rank-q PowerSGD on the gradient reshaped to (out, rest), with warm start and error feedback.

    Dense fp32 (4n) for 1-D tensors, for every tensor while step < `start_iter`, and for matrices
    whose rank-q form would not be at least `min_compression_rate` times smaller (compressed when
    q*(rows+cols)*min_compression_rate <= rows*cols, q = min(rank, rows, cols)).

    Two APIs:
    - `compress_collective(x, name, allreduce_mean)`, what the allreduce communicator uses (this is the
      sense of `summable`): M = x + error; P = mean(M Q); orthogonalize P; Q = mean(M^T P); result
      P Q^T = the same rank-q approximation of mean(M) on every rank; 4*q*(rows+cols) bytes sent.
      Error feedback is internal, with the semantics of Vogels et al.'s code and torch's PowerSGD hook:
      error_r = M_r - P Q^T, the LOCAL compensated gradient minus the AVERAGED approximation (an
      external memory cannot compute it: P Q^T only exists after the collective). Averaged over
      ranks that is exactly the compression error of mean(M). Use it with memory=none.
      Dense tensors keep no error (the hook keeps local - average for them, whose mean over ranks
      is zero, so the averaged update is the same without it).
    - `compress`/`decompress`, the local contract API (allgather communicator, tests): one local
      power step on x, payload [P (rows x q) row-major, Q (cols x q) row-major], decode P Q^T,
      4*q*(rows+cols) bytes. It has no internal error feedback: pair it with memory=residual. Its
      payloads of different ranks are NOT summable (sum P_r Q_r^T != (sum P_r)(sum Q_r)^T).

    Warm start (both APIs): Q of each tensor name is kept and re-orthogonalized at the next step;
    the first Q of a name comes from a CPU generator seeded by (seed, name), identical on every rank
    as the collective needs. `start_iter` must be > 1: the first step runs dense while the scheduler
    records the gradient order and builds its fusion groups, whose names and shapes key the state
    (the hook requires the same because DDP rebuilds its buckets after the first iteration).
    """

    name = "powersgd"
    # Over allgather/ps its local payloads are not summable; pair them with memory=residual.
    # A 1-epoch linear learning-rate warm-up, as Vogels et al.'s recipe (5 of 300 epochs): without it,
    # rank 1 on the claims' CNN (lr 0.1, momentum 0.9, seed 0) jumped from loss 1.5 to 3 when
    # compression starts (step 10) and died at chance by step ~110 (docs/results.md, "Recipes that
    # train in every seed").
    caps = Capabilities(collective=True, min_dims=2, shape_layout=True,
                        recipe={"memory": "residual", "optim.warmup_epochs": 1.0},
                        why_not_summable="sends local low-rank factors that cannot be summed")

    def __init__(
        self, rank: int = 1, start_iter: int = 10, min_compression_rate: float = 2.0, seed: int = 0
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"compressor=powersgd: rank={rank} must be an integer >= 1; pass e.g. rank=1")
        if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter <= 1:
            raise ValueError(
                f"compressor=powersgd: start_iter={start_iter} must be an integer > 1 (warm-start and "
                "error-feedback state is keyed by tensor names and shapes, which the first step's "
                "scheduler pass may still change); pass e.g. start_iter=10"
            )
        if not min_compression_rate >= 1:
            raise ValueError(
                f"compressor=powersgd: min_compression_rate={min_compression_rate} must be >= 1 (below 1 "
                "the low-rank form may be bigger than dense); pass e.g. min_compression_rate=2"
            )
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.seed = int(seed)
        self._q: dict[str, Tensor] = {}
        self._error: dict[str, Tensor] = {}

    # -- shared -------------------------------------------------------------------------------------
    def _plan(self, shape: torch.Size | tuple[int, ...]) -> tuple[int, int, int] | None:
        """(rows, cols, q) when the tensor is compressed at the current step, else None (dense)."""
        rc = matrix_shape(shape)
        if rc is None or self.step < self.start_iter:
            return None
        rows, cols = rc
        q = min(self.rank, rows, cols)
        if q * (rows + cols) * self.min_compression_rate > rows * cols:
            return None
        return rows, cols, q

    def _warm_q(self, name: str, cols: int, q: int, device: torch.device) -> Tensor:
        """This step's starting Q of `name`: last step's, re-orthogonalized, or a seeded random one."""
        prev = self._q.get(name)
        if prev is None or prev.shape != (cols, q) or prev.device != device:
            gen = cpu_generator(stable_seed("powersgd", self.seed, name))
            # drawn on the host and copied, as torch's PowerSGD hook does: the same Q on every device
            prev = host_to(torch.randn(cols, q, generator=gen, device="cpu"), device)
        q_start = orthogonalize_(prev)
        dead = q_start.abs().amax(0) == 0
        return self._redraw_dead(q_start, dead, name, on_device=device.type != "cpu")

    def _redraw_dead(self, q_start: Tensor, dead: Tensor, name: str, on_device: bool) -> Tensor:
        """`q_start` with its zero columns redrawn. A zero column (the gradient had rank < q) would
        stay zero forever: it is redrawn, seeded by (name, step) alike on every rank, so the rank
        comes back when the gradient's does. On the CPU the host decides (reading the flag costs
        nothing there); on a device (`on_device`) reading it would be a wait per tensor and step, so
        the redrawn Q is computed every step and chosen on the device where a column is dead: the
        same Q bit for bit, for a host draw and one more orthogonalization of cols x q."""
        if not on_device and not bool(dead.any()):
            return q_start
        cols, q = q_start.shape
        gen = cpu_generator(stable_seed("powersgd", self.seed, name, self.step))
        fresh = host_to(torch.randn(cols, q, generator=gen), q_start.device)
        redrawn = orthogonalize_(torch.where(dead, fresh, q_start))
        return torch.where(dead.any(), redrawn, q_start) if on_device else redrawn

    # -- local contract API -------------------------------------------------------------------------
    def compress(self, x: Tensor, name: str) -> tuple[list[Tensor], Ctx]:
        plan = self._plan(x.shape)
        if plan is None:
            return dense_payload(x), make_ctx(x, name, lowrank=None)
        rows, cols, q = plan
        m = x.detach().reshape(rows, cols).to(torch.float32)
        p, new_q = _power_step(m, self._warm_q(name, cols, q, x.device))
        self._q[name] = new_q
        # Q's payload is a copy: the kept Q is orthogonalized in place at the next step.
        return [p.reshape(-1), new_q.reshape(-1).clone()], make_ctx(x, name, lowrank=plan)

    def decompress(self, payload: list[Tensor], ctx: Ctx) -> Tensor:
        plan = ctx.meta["lowrank"]
        if plan is None:
            return payload[0].view(ctx.shape).to(ctx.dtype)
        rows, cols, q = plan
        return (payload[0].view(rows, q) @ payload[1].view(cols, q).T).view(ctx.shape).to(ctx.dtype)

    # -- distributed API ----------------------------------------------------------------------------
    def compress_collective(self, x: Tensor, name: str, allreduce_mean: Reduce) -> tuple[Tensor, int]:
        """Average `x` over all ranks through rank-q PowerSGD: (averaged decoded gradient, bytes sent).

        Every rank must call this in the same order with the same names (collectives inside).
        `allreduce_mean` may reduce in place; for a dense tensor its argument may be a view of `x`.
        """
        plan = self._plan(x.shape)
        if plan is None:
            flat = dense_payload(x)[0]
            return allreduce_mean(flat).view(x.shape).to(x.dtype), 4 * flat.numel()
        rows, cols, q = plan
        m = x.detach().reshape(rows, cols).to(torch.float32)
        err = self._error.get(name)
        if err is not None and err.shape == m.shape and err.device == m.device:
            m = m + err  # a new tensor: x is the caller's gradient
        p, new_q = _power_step(m, self._warm_q(name, cols, q, x.device), allreduce_mean)
        self._q[name] = new_q
        approx = p @ new_q.T
        if err is None or err.shape != m.shape or err.device != m.device:
            self._error[name] = m - approx
        else:
            torch.sub(m, approx, out=err)
        return approx.view(x.shape).to(x.dtype), 4 * q * (rows + cols)

    # -- bytes and state ----------------------------------------------------------------------------
    def wire_bytes(self, numel: int) -> int | None:
        return None  # depends on the shape and the step: see payload_bytes

    def max_wire_bytes(self, numel: int) -> int:
        return 4 * numel  # low rank is used only when smaller than dense (min_compression_rate >= 1)

    def payload_bytes(self, shape: torch.Size | tuple[int, ...]) -> int:
        """Exact bytes a tensor of `shape` sends at the current step (both APIs)."""
        plan = self._plan(shape)
        if plan is None:
            return 4 * math.prod(shape)
        rows, cols, q = plan
        return 4 * q * (rows + cols)

    def state_dict(self) -> dict:
        return {
            "q": {k: v.clone() for k, v in self._q.items()},
            "error": {k: v.clone() for k, v in self._error.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self._q = {k: v.clone() for k, v in state.get("q", {}).items()}
        self._error = {k: v.clone() for k, v in state.get("error", {}).items()}
