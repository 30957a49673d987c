"""The synchronizer's decisions and arithmetic for `sync=quorum_diloco` (compbench.sync.quorum_diloco),
with no transport: which learners a merge takes, when it happens, and the merge itself. The thread
that feeds it deliveries and sends its replies is compbench.sync.quorum_server.

After Decoupled DiLoCo (Douillard et al., "Decoupled DiLoCo for Resilient Distributed
Pre-training", arXiv 2604.21428, 2026): learners train on their own, a synchronizer merges the outer
gradients of whichever learners deliver once a minimum quorum has, waiting a grace window for the
rest, weighting each by the tokens it trained on; the outer step is DiLoCo's (Nesterov SGD).

State: the global parameters θ at version v (v merges so far), the outer optimizer, and the
contributions pending for merge v+1. A contribution is a learner's outer gradient Δ = θ_b − θ_local
after its round, with b the version it started from (its base), the tokens it trained on, its
compute seconds and its step count.

Rules (each a decision, written down here and in docs/guide/synchronization.md):
- Fresh (b = v): the learner waits for merge v+1, unless it is behind (its step count below the
  most steps any delivery has reported: it straggled), then it is answered at once with θ_v.
- Late (b < v): staleness s = v − b. With s <= `max_staleness` it goes into merge v+1 as it is
  (the asynchronous outer gradient of its older base, as a delayed gradient); beyond, it is
  discarded and counted. Either way the learner is answered at once with the latest θ_v and
  continues from it (it catches up from the latest merge).
- The quorum: `quorum` distinct learners with a fresh contribution (fewer if fewer learners are
  still training: those that left at the end cannot deliver). Once it is in, the merge waits for
  the rest, the learners training on θ_v that have not delivered, at most `window_s` seconds
  (`window` None: until every one of them has; a float: fixed; "adaptive": `window_factor` times
  the median round time observed so far, hivemind-style: a round time is the time from sending a
  learner θ to its fresh delivery), then merges what it has.
- Weights: weighting "tokens" takes w_i = the contribution's tokens, "uniform" w_i = 1. The merge
  computes Σ r_i Δ_i / Σ r_i with r_i = w_i / max_j w_j, summing in rank order (fresh contributions
  first, then the late ones in arrival order). Equal weights give r_i = 1.0 exactly, so the merge
  is (Σ Δ_i) / n, DiLoCo's average (a sum, then one division): with two learners it equals gloo's
  allreduce bit for bit (a sum of two is the same in either order); with more, gloo's ring sums
  each chunk in its own order, so they agree within rounding.
- The outer step: θ.grad = the merged Δ, then torch's SGD (`outer_lr`, `outer_momentum`,
  `nesterov`) steps θ: DiLoCo's outer optimizer, the same tensors and calls.
- At the end, contributions still pending (late ones with no merge after them) are discarded and
  counted as such: their compute did not reach the model.
- The stop (`stop`): rank 0's training ended (its target, budget or max_steps) and rank 0 has
  evaluated the θ it last took. From then on no merge happens: what is pending is discarded as at
  the end, the learners waiting for a merge are answered at once, and every later delivery is
  answered at once and discarded (`after_stop`): its compute never reaches the evaluated model.
  Every answer from then on carries the stop, and the learner stops training there.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

WEIGHTINGS = ("tokens", "uniform")
ADAPTIVE = "adaptive"
# Round times the adaptive window's median is taken over (the latest ones: the run's pace changes).
ROUND_HISTORY = 64


@dataclass(frozen=True)
class QuorumSettings:
    """The synchronizer's settings (sync=quorum_diloco's keys, checked by its `check_options`)."""

    quorum: int | None = None  # None: every learner
    window: float | str | None = ADAPTIVE  # seconds, ADAPTIVE, or None (unbounded)
    window_factor: float = 0.1
    weighting: str = "tokens"
    max_staleness: int = 4
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Contribution:
    """One learner's delivery: its outer gradient (flat, on θ's device) and what it is worth."""

    rank: int
    base: int  # the θ version the learner's round started from
    step: int  # the learner's steps taken when it delivered
    tokens: int  # tokens (or samples) it trained on in the round
    compute_s: float  # its forward, backward and optimizer seconds in the round
    delta: Tensor
    arrived: float = 0.0  # when the synchronizer received it (its clock)


@dataclass
class Ledger:
    """What the synchronizer did, for results.json (compbench.records.goodput reads `discarded_s`)."""

    merges: int = 0
    merges_short: int = 0  # merges that went ahead without some learner still training
    fresh: int = 0  # contributions merged on the θ they started from
    late_merged: int = 0  # merged with staleness >= 1
    late_discarded: int = 0  # staleness above max_staleness
    left_at_end: int = 0  # pending when every learner had left, or at the stop
    after_stop: int = 0  # delivered after rank 0's stop: answered with it, discarded
    merged_s: float = 0.0  # compute seconds of contributions that entered a merge
    discarded_s: float = 0.0  # compute seconds of those that did not
    window_waits: int = 0  # merges that waited for the window to close
    max_seen_staleness: int = 0
    per_rank: dict[int, dict[str, int]] = field(default_factory=dict)

    def count(self, rank: int, what: str) -> None:
        row = self.per_rank.setdefault(rank, {"merged": 0, "late_merged": 0, "discarded": 0, "missed": 0})
        row[what] += 1

    def record(self) -> dict[str, Any]:
        return {"merges": self.merges, "merges_short": self.merges_short, "fresh": self.fresh,
                "late_merged": self.late_merged, "late_discarded": self.late_discarded,
                "left_at_end": self.left_at_end, "after_stop": self.after_stop,
                "merged_compute_s": round(self.merged_s, 3),
                "discarded_compute_s": round(self.discarded_s, 3), "window_waits": self.window_waits,
                "max_staleness_seen": self.max_seen_staleness,
                "per_rank": {str(r): dict(v) for r, v in sorted(self.per_rank.items())}}


def merge_weights(tokens: Sequence[int], weighting: str) -> list[float]:
    """r_i = w_i / max_j w_j (w_i the tokens, or 1 for "uniform"): 1.0 exactly where all are equal."""
    if weighting == "uniform" or not tokens:
        return [1.0] * len(tokens)
    top = max(tokens)
    if top <= 0:
        raise ValueError("every contribution trained on 0 tokens: nothing to weight them by")
    return [t / top for t in tokens]


def merged_delta(deltas: Sequence[Tensor], tokens: Sequence[int], weighting: str) -> Tensor:
    """Σ r_i Δ_i / Σ r_i, summed in the order given (see the module: DiLoCo's mean for equal weights)."""
    ratios = merge_weights(tokens, weighting)
    total = deltas[0] * ratios[0] if ratios[0] != 1.0 else deltas[0].clone()
    for delta, r in zip(deltas[1:], ratios[1:], strict=True):
        total.add_(delta, alpha=r) if r != 1.0 else total.add_(delta)
    return total.div_(sum(ratios))


class QuorumState:
    """θ, the outer optimizer and the pending merge (see the module); the caller passes the time.

    `deliver` and `leave` return the ranks to answer with the latest θ now; `due(now)` says whether
    the pending merge should happen; `merge(now)` does it and returns the learners that waited for it."""

    def __init__(self, theta: list[Tensor], learners: int, settings: QuorumSettings) -> None:
        s = settings
        self.theta = theta
        self.outer = torch.optim.SGD(theta, lr=s.outer_lr, momentum=s.outer_momentum, nesterov=s.nesterov)
        self.learners = learners
        self.quorum = learners if s.quorum is None else int(s.quorum)
        self.window, self.window_factor = s.window, float(s.window_factor)
        self.weighting, self.max_staleness = s.weighting, int(s.max_staleness)
        self.version = 0
        self.fresh: list[Contribution] = []  # base == version, in arrival order
        self.late: list[Contribution] = []  # 1 <= staleness <= max_staleness, in arrival order
        self.waiting: set[int] = set()  # learners waiting for the pending merge's θ
        self.holds = dict.fromkeys(range(learners), 0)  # the θ version each learner trains on
        self.sent_at = dict.fromkeys(range(learners), 0.0)  # when it was sent that θ
        self.left: set[int] = set()
        self.lead_step = 0  # the most steps any delivery reported
        self.rounds: list[float] = []  # observed round times (s), the latest ROUND_HISTORY
        self.quorum_at: float | None = None  # when the pending merge's quorum came in
        self.stopping = False  # rank 0's training ended: every answer carries the stop, no merge follows
        self.ledger = Ledger()

    # -- deliveries ---------------------------------------------------------------------------

    def deliver(self, c: Contribution, now: float) -> list[int]:
        c.arrived = now
        assert c.rank not in self.left, f"learner {c.rank} delivered after it left"
        if self.stopping:  # rank 0 evaluated its last θ already: this round never reaches the model
            self.ledger.after_stop += 1
            self.ledger.discarded_s += c.compute_s
            self.ledger.count(c.rank, "discarded")
            return [c.rank]
        self.lead_step = max(self.lead_step, c.step)
        staleness = self.version - c.base
        assert staleness >= 0, f"learner {c.rank} started from θ version {c.base}, after {self.version}"
        self.ledger.max_seen_staleness = max(self.ledger.max_seen_staleness, staleness)
        if staleness == 0:
            self.fresh.append(c)
            self.rounds = [*self.rounds, now - self.sent_at[c.rank]][-ROUND_HISTORY:]
            behind = c.step < self.lead_step
            if not behind:
                self.waiting.add(c.rank)
                self.holds[c.rank] = -1  # neither training on θ_v nor answered yet
                self._note_quorum(now)
                return []
        elif staleness <= self.max_staleness:
            self.late.append(c)
        else:
            self.ledger.late_discarded += 1
            self.ledger.discarded_s += c.compute_s
            self.ledger.count(c.rank, "discarded")
        self._note_quorum(now)
        return [c.rank]  # answered at once with the latest θ (`answered` marks it)

    def answered(self, rank: int, now: float) -> None:
        """`rank` was sent θ at version `version` now: it trains on it from here."""
        self.holds[rank], self.sent_at[rank] = self.version, now

    def leave(self, rank: int, now: float) -> None:
        """The learner will deliver no more (its training ended)."""
        self.left.add(rank)
        self.holds[rank] = -1
        self._note_quorum(now)

    def stop(self) -> list[int]:
        """Rank 0's training ended: no merge follows; returns the learners waiting for one, to answer
        now (with the stop). What is pending is discarded and counted (`close`)."""
        self.stopping = True
        waited = sorted(self.waiting)
        self.close()
        self.waiting, self.quorum_at = set(), None
        return waited

    @property
    def done(self) -> bool:
        return len(self.left) == self.learners

    # -- the merge's timing -------------------------------------------------------------------

    def _quorum_in(self) -> bool:
        need = min(self.quorum, self.learners - len(self.left))
        return need > 0 and len({c.rank for c in self.fresh}) >= need

    def _note_quorum(self, now: float) -> None:
        if self.quorum_at is None and self._quorum_in():
            self.quorum_at = now

    def outstanding(self) -> list[int]:
        """The learners the window waits for: training on θ_v, not delivered, not left."""
        delivered = {c.rank for c in self.fresh}
        return [r for r, v in self.holds.items()
                if v == self.version and r not in delivered and r not in self.left]

    def window_s(self) -> float | None:
        """The grace window after the quorum (None: unbounded)."""
        if self.window is None:
            return None
        if self.window == ADAPTIVE:
            return self.window_factor * statistics.median(self.rounds) if self.rounds else None
        return float(self.window)

    def deadline(self) -> float | None:
        """When the pending merge happens at the latest (None: not yet known or unbounded)."""
        window = self.window_s()
        if self.quorum_at is None or window is None:
            return None
        return self.quorum_at + window

    def due(self, now: float) -> bool:
        if self.quorum_at is None or not self.fresh:
            return False
        if not self.outstanding():
            return True
        deadline = self.deadline()
        if deadline is not None and now >= deadline:
            self.ledger.window_waits += 1
            return True
        return False

    # -- the merge ----------------------------------------------------------------------------

    @torch.no_grad()
    def merge(self, now: float) -> list[int]:
        """Merge the pending contributions into θ (one outer step); returns the learners to send
        the new θ, those that waited for it."""
        fresh = sorted(self.fresh, key=lambda c: c.rank)  # rank order: the sum's order is fixed
        taken = [*fresh, *self.late]
        flat = merged_delta([c.delta for c in taken], [c.tokens for c in taken], self.weighting)
        start = 0
        for t in self.theta:
            t.grad = flat[start : start + t.numel()].view_as(t)
            start += t.numel()
        self.outer.step()
        for t in self.theta:
            t.grad = None
        led = self.ledger
        led.merges += 1
        led.merges_short += bool(self.outstanding())
        for r in self.outstanding():
            led.count(r, "missed")
        for c in taken:
            led.merged_s += c.compute_s
            late = c.base != self.version
            led.late_merged += late
            led.fresh += not late
            led.count(c.rank, "late_merged" if late else "merged")
        self.version += 1
        waited = sorted(self.waiting)
        self.fresh, self.late, self.waiting, self.quorum_at = [], [], set(), None
        return waited

    def close(self) -> None:
        """Every learner left, or rank 0 stopped: what is still pending never enters the model."""
        for c in [*self.fresh, *self.late]:
            self.ledger.left_at_end += 1
            self.ledger.discarded_s += c.compute_s
            self.ledger.count(c.rank, "discarded")
        self.fresh, self.late = [], []

    def flat_theta(self) -> Tensor:
        return torch.cat([t.reshape(-1) for t in self.theta])

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """θ, the outer optimizer and the pending contributions (their Δ included): a resumed run
        merges what was delivered before the checkpoint."""
        def plain(c: Contribution) -> dict[str, Any]:
            return {"rank": c.rank, "base": c.base, "step": c.step, "tokens": c.tokens,
                    "compute_s": c.compute_s, "delta": c.delta.clone()}

        return {"version": self.version, "theta": [t.detach().clone() for t in self.theta],
                # a copy: the synchronizer thread goes on stepping θ after the snapshot
                "outer": copy.deepcopy(self.outer.state_dict()), "fresh": [plain(c) for c in self.fresh],
                "late": [plain(c) for c in self.late], "lead_step": self.lead_step,
                "rounds": list(self.rounds), "ledger": self.ledger.record()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        for t, saved in zip(self.theta, state["theta"], strict=True):
            t.copy_(saved)
        self.outer.load_state_dict(state["outer"])
        device = self.theta[0].device
        self.fresh = [Contribution(**{**c, "delta": c["delta"].to(device)}) for c in state["fresh"]]
        self.late = [Contribution(**{**c, "delta": c["delta"].to(device)}) for c in state["late"]]
        self.lead_step, self.rounds = int(state["lead_step"]), [float(r) for r in state["rounds"]]
        # Learners of the resumed run start from the saved θ: every one trains on this version.
        self.holds = dict.fromkeys(range(self.learners), self.version)
        self.waiting, self.left, self.quorum_at = set(), set(), None
        led = state["ledger"]
        self.ledger = Ledger(**{k: led[k] for k in ("merges", "merges_short", "fresh", "late_merged",
                                                    "late_discarded", "left_at_end", "window_waits")},
                             after_stop=int(led.get("after_stop", 0)),  # older checkpoints: none
                             merged_s=float(led["merged_compute_s"]),
                             discarded_s=float(led["discarded_compute_s"]),
                             max_seen_staleness=int(led["max_staleness_seen"]),
                             per_rank={int(r): dict(v) for r, v in led["per_rank"].items()})
