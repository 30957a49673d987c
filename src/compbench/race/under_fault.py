"""The what-if model under a straggler: each mode's step time, idle time and goodput when one of W
workers computes s times as long (fault.slow_factor, compbench.train.faults: it sleeps (s - 1) x its
forward and backward time inside the compute phase, after back-propagation).

From a run's profile (compbench.race.model.Profile: a worker's step without communication f, its
compute c and optimizer o, the exchange's time comm at the link, one exchange every H steps hidden
behind k steps of compute) and the straggler's factor s:

    the straggler's step without communication   f_s = f + (s - 1) c
    a worker's useful work a step                 u = c + o        (goodput's: compbench.records.goodput)
    the straggler's                               u_s = u + (s - 1) c

Lock-step modes (every exchange needs every worker: DDP and the per-step compressors, DiLoCo, and
delayed DiLoCo, whose workers may run k rounds ahead but no more, so in the long run it too goes at
the straggler's pace) take the straggler's step; the exchange hides behind what the straggler does
while it travels (its k x H steps, PCCL's delayed outer step: exposed = max(0, comm - k H f_s) a
round; and for an exchange from backward hooks, backward and the straggler's sleep after it):

    step     = f_s + max(0, comm - hidden_s) / H,   hidden_s = k f_s (+ 2/3 c + (s - 1) c from hooks)
    goodput  = ((W - 1) u + u_s) / (W step)          idle = 1 - goodput, nothing discarded

Quorum DiLoCo (compbench.race.model.Quorum; sync=quorum_diloco, after Decoupled DiLoCo, Douillard et
al. 2026) with a quorum q of at most W - 1 learners: the round ends when the quorum's slowest member
has delivered, plus the window, not when the straggler has. A fast learner's round is T_f = H f +
comm (its steps, its delivery and the answer: the pattern "ps", nothing hidden), the straggler's
T_s = H f_s + comm (a late learner is answered at once). The window w: fixed (window_s), adaptive
(window_factor x the median round time, the fast learners' T_f: the straggler's deliveries are late,
not counted), or None (every learner on the current θ: the straggler).

    if T_s <= T_f + w:  the straggler makes the window: every round waits for it, as lock-step
    else:               the window is waited once per straggler round (the merge after it took the
                        latest θ, while it trains on it; later merges find it on an older θ and do
                        not wait): T = T_f + w T / T_s, so T = T_f / (1 - w / T_s)
    step (a fast learner's, rank 0's: the race's clock) = T / H
    the straggler's outer gradient lags by floor(T_s / T) merges: beyond max_staleness it is
    discarded (its work is not in the model)
    goodput  = ((W - 1) H u / T + H u_s / T_s [not discarded]) / W
    discarded = H u_s / T_s / W [discarded],   idle = 1 - goodput - discarded

DiLoCo with per-worker steps (sync=diloco's inner_steps_per_worker; torchft's per-replica sync
intervals): a round stays H loop steps; the straggler trains H_s of them and idles the rest (an idle
step costs nothing here), H_s = max(1, round(H / s)) for `adaptive` (its rule: H x the fastest
compute per trained step over its own, whose compute holds the straggler's sleep: s c against c),
the smallest entry of a list (the straggler's, as the run gave it). The round's compute is the
longer of the fast workers' and the straggler's; the exchange as DiLoCo's, hidden behind the fast pace:

    step     = max(H f, H_s f_s) / H + max(0, comm - k f) / H
    goodput  = ((W - 1) H u + H_s u_s) / (W H step)        nothing discarded

HALoS (sync=halos, Kim et al. 2025): no worker waits for another; each waits for its local server's
answer to every update (every H steps, the pattern "ps": nothing hidden). Rank 0's step and the
straggler's:

    step = f + comm / H,   step_s = f_s + comm / H
    goodput  = ((W - 1) u / step + u_s / step_s) / W        nothing discarded

The quorum's exchange is priced as its run's communicator prices its booked bytes (Profile.comm_ms:
an allreduce): with 2 workers that is the bytes of a delivery and its answer each way; with more, a
single synchronizer's link carries W - 1 of them each way, which this does not count.

Without a straggler (s = 1) every formula is the plain model's step (Profile.step_ms, after the
warm-up). Left out: the warm-up's dense steps (a step after it is predicted), evaluations and
checkpoints (which the run's goodput counts as idle, its `step_goodput` does not: the prediction is
set beside that one), the merge's own time on rank 0, and kills (a scenario that kills is not
predicted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compbench.comm.cost_model import Fit
from compbench.race.model import BACKWARD_SHARE, Profile


@dataclass(frozen=True)
class UnderFault:
    """A mode's predicted step (ms, rank 0's) and its workers' shares of their time: useful work
    (goodput), work discarded, and idle; `lock_step`: whether every round waits for the straggler."""

    step_ms: float
    goodput: float
    discarded_share: float
    lock_step: bool

    @property
    def idle_share(self) -> float:
        return 1.0 - self.goodput - self.discarded_share


def under_straggler(p: Profile, fit: Fit, gbps: float, slow_factor: float, workers: int | None = None,
                    latency_ms: float = 0.0, per_node: int = 1) -> UnderFault:
    """The prediction of the module for `p`'s mode at `gbps` with one worker `slow_factor` times slower."""
    if slow_factor < 1:
        raise ValueError(f"a straggler's factor {slow_factor:g} must be >= 1 (1: no straggler)")
    n = workers or p.workers
    s, c, f, every = slow_factor, p.compute_ms, p.fixed_ms, p.every
    f_s = f + (s - 1) * c
    useful, useful_s = c + p.optimizer_ms, c + p.optimizer_ms + (s - 1) * c
    comm = p.comm_ms(fit, gbps, n, latency_ms, per_node=per_node)
    q = p.quorum
    quorum = n if q is None or q.quorum is None else min(q.quorum, n)
    if q is not None and quorum < n and s > 1:
        fast, slow = every * f + comm, every * f_s + comm
        window = (math.inf if q.window_s is None else q.window_factor * fast if isinstance(q.window_s, str)
                  else q.window_s * 1e3)
        if slow > fast + window:
            round_ms = fast / (1 - window / slow)
            discarded = math.floor(slow / round_ms) > q.max_staleness
            straggler = every * useful_s / slow / n
            return UnderFault(round_ms / every, (n - 1) * every * useful / round_ms / n
                              + (0.0 if discarded else straggler), straggler if discarded else 0.0, False)
    if p.independent:
        step, step_s = f + comm / every, f_s + comm / every
        return UnderFault(step, ((n - 1) * useful / step + useful_s / step_s) / n, 0.0, False)
    if p.per_worker is not None:
        slow = (max(1, round(every / s)) if isinstance(p.per_worker, str) else min(p.per_worker))
        step = max(every * f, slow * f_s) / every + max(0.0, comm - p.hidden_steps * f) / every
        return UnderFault(step, ((n - 1) * every * useful + slow * useful_s) / (n * every * step), 0.0,
                          slow * f_s > every * f)
    hidden = p.hidden_steps * f_s + (BACKWARD_SHARE * c + (s - 1) * c if p.overlaps_backward else 0.0)
    # a sharded run's own collectives, exposed every step (Profile.step_ms)
    step = f_s + p.fsdp_ms(fit, gbps, n, latency_ms, per_node) + max(0.0, comm - hidden) / every
    return UnderFault(step, ((n - 1) * useful + useful_s) / (n * step), 0.0, True)
