"""Per-worker sync intervals for `sync=diloco` (`sync.inner_steps_per_worker`): workers of unequal
speed each train their own number H_r of a round's H steps, so that a slower worker does fewer inner
steps and nobody waits at the exchange (torchft's per-replica `sync_every`, meta-pytorch/torchft
`local_sgd.py`, asked for mixed hardware; torchft's streaming DiLoCo derives each replica's fragment
schedule from the manager's common step so that replicas with different `sync_every` still meet).

The setting:
- null (default): every worker trains all H steps (DiLoCo, unchanged);
- a list [H_0, H_1, ...]: one entry per worker (engine.np of them), each 1..H, at least one equal to
  H (the round's length is the fastest worker's);
- `adaptive`: the first round runs every worker at H. At the end of every round, with the exchange,
  the workers allgather each one's median compute milliseconds per trained step of that round (the
  loop's `compute` phase: forward and backward, a straggler's injected sleep included), and the next
  round's H_r = max(1, round(H x fastest / own)) for every worker (Python's round: halves go to the
  even integer). So the H_r of round k+1 come from round k's timings; the fastest worker keeps H.

How a round stays common (evaluations, checkpoints and exchanges are collectives at loop steps): a
round is H loop steps for every worker; worker r trains on the first H_r of them and idles the rest
(`step_share().mine` false: no forward, backward or optimizer step, and no injected straggle, which is
proportional to the step's compute). Its batch of an idle step is skipped: the data it would have seen
is not trained on (the loader keeps its order, so every worker's data position stays the loop step's).
The learning-rate schedule advances on idle steps too: it follows the loop's steps, the same on every
worker. An idle step books no compute (records/goodput.py counts it as idle time); the step's
global units (tokens) count only the workers that trained it (`step_share().workers`); rank 0 records
`train/loss` only at the steps it trained.

The outer gradient's average is weighted by the tokens each worker trained in the round. Every
training batch holds batch_size samples of the same length on every worker (the training loader drops
the last partial batch), so worker r's tokens are H_r x its batch tokens and its weight is
w_r = H_r / sum_s H_s. The pipeline averages (a sum, then a division by N workers), so each worker
hands it N·w_r·Δ_r and the average is sum_r w_r·Δ_r: a weighted allreduce. With equal H_r the factor
N·H_r / (N·H) is exactly 1.0 and Δ is not touched, so the run is today's mean bit for bit; with unequal
ones the scaling adds one rounding per element (the product N·w_r·Δ_r) before the pipeline's sum.

Refused at compose time (`check_job`, one line naming the fix): a list whose length is not the
number of workers; a compressor that does not combine by the mean (signum's vote, sparseloco's
per-coordinate mean of senders after clipping to the median norm: neither keeps the weights'
scale); sharding (a shard group's workers would have to idle together, and FSDP's per-step
collectives span them); engine.elastic (a list counts the workers, and the agreed H_r are the old
world's); on_nonfinite=skip (its check is a collective every step, which an idle worker has no
gradients for); Streaming DiLoCo's fragments and overlap (`check_options`: a fragment's exchange
mid-round would cover fewer of a slow worker's steps than its weight says). Error-feedback memory is
allowed: what it carries is the weighted Δ's unsent part, and over the rounds the sum it sends is the
sum of the weighted Δs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import torch

from compbench.base.values import is_int
from compbench.engines.base import Engine
from compbench.records.stats import StepStats

ADAPTIVE = "adaptive"
KEY = "sync.inner_steps_per_worker"


def check_setting(value: Any, inner_steps: int) -> None:
    """Config-time check of the setting against H (the number of workers: `check_job`)."""
    if value is None or value == ADAPTIVE:
        return
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{KEY}={value} is unknown; pass a list of steps per worker (e.g. "
                         f"{KEY}=[{inner_steps},{max(1, inner_steps // 3)}]), {KEY}={ADAPTIVE} or null")
    for h in value:
        if not is_int(h) or not 1 <= h <= inner_steps:
            raise ValueError(f"{KEY}={list(value)}: {h} is not a number of steps from 1 to "
                             f"sync.inner_steps={inner_steps}; pass entries from 1 to {inner_steps}")
    if max(value) != inner_steps:
        raise ValueError(f"{KEY}={list(value)} has no entry equal to sync.inner_steps={inner_steps} (the "
                         f"round's length is its fastest worker's); make the fastest worker's "
                         f"{inner_steps}, or pass sync.inner_steps={max(value)}")


def check_job(value: Any, workers: int | None, combine: str, compressor: str, sharded: bool, elastic: bool,
              on_nonfinite: str) -> None:
    """Compose-time check of a set `value` against the job (`workers`: None under an external launcher,
    where the mode checks the world it joins)."""
    if value is None:
        return
    if value != ADAPTIVE and workers is not None and len(value) != workers:
        raise ValueError(f"{KEY}={list(value)} has {len(value)} entries and engine.np={workers}; give one "
                         f"number of steps per worker ({workers} entries), or {KEY}={ADAPTIVE}")
    if combine != "mean":
        raise ValueError(f"{KEY} weights each worker's outer gradient by its tokens, and "
                         f"compressor={compressor} combines the workers' by {combine}, which does not keep "
                         "the weights; use a "
                         "compressor that averages (e.g. compressor=none, fp16 or qsgd)")
    if sharded:
        raise ValueError(f"{KEY} with sharding: a shard group's workers would have to idle together; "
                         "drop sharding= (or the setting)")
    if elastic:
        raise ValueError(f"{KEY} with engine.elastic=true: its steps are the workers' as they started; "
                         "drop engine.elastic (or the setting)")
    if on_nonfinite == "skip":
        raise ValueError(f"{KEY} with on_nonfinite=skip: its check is a collective every step, and an idle "
                         "worker has no gradients; pass on_nonfinite=raise or on_nonfinite=ignore")


def weights(steps: Sequence[int]) -> list[float]:
    """Each worker's share of the round's tokens: w_r = H_r / sum_s H_s (equal batches)."""
    total = sum(steps)
    return [h / total for h in steps]


def next_steps(inner_steps: int, compute_ms: Sequence[float]) -> list[int]:
    """The adaptive rule: H_r = max(1, round(H x fastest / own)) from each worker's median compute
    milliseconds per trained step (a worker that measured nothing, 0 ms, counts as the fastest)."""
    measured = [ms for ms in compute_ms if ms > 0]
    if not measured:
        return [inner_steps] * len(compute_ms)
    fastest = min(measured)
    return [max(1, round(inner_steps * fastest / ms)) if ms > 0 else inner_steps for ms in compute_ms]


class PerWorkerPlan:
    """This round's H_r of every worker, the weights they give, and (adaptive) this worker's compute
    milliseconds per trained step, agreed at the round's end."""

    def __init__(self, setting: list[int] | str, inner_steps: int, engine: Engine) -> None:
        self.setting, self.inner_steps, self.rank = setting, inner_steps, engine.rank
        self.adaptive = setting == ADAPTIVE
        if not self.adaptive and len(setting) != engine.size:
            raise ValueError(f"{KEY}={list(setting)} has {len(setting)} entries and the job has "
                             f"{engine.size} workers; give one number of steps per worker")
        self.steps: list[int] = [inner_steps] * engine.size if self.adaptive else [int(h) for h in setting]
        self.history: list[list[int]] = [list(self.steps)]  # each round's H_r, as they ran
        self.compute_ms: list[float] = []  # this worker's trained steps of the current round

    def trains(self, inner: int) -> bool:
        """Whether this worker trains the round's step `inner` (0-based): its first H_r."""
        return inner < self.steps[self.rank]

    def workers_at(self, inner: int) -> int:
        return sum(h > inner for h in self.steps)

    def scale(self) -> float:
        """N·w_r, the factor on this worker's Δ before the pipeline's mean (exactly 1.0 when equal)."""
        return len(self.steps) * self.steps[self.rank] / sum(self.steps)

    def note(self, compute_ms: float) -> None:
        self.compute_ms.append(compute_ms)

    def end_round(self, engine: Engine, stats: StepStats) -> None:
        """After the round's exchange was submitted with its weights: the adaptive rule's allgather of
        the median compute milliseconds, and the next round's H_r."""
        if self.adaptive:
            mine = statistics.median(self.compute_ms) if self.compute_ms else 0.0
            ms = torch.full((1,), float(mine), dtype=torch.float64, device=engine.device)
            with stats.time("comm", exposed=True):
                rows = engine.allgather([ms], "per_worker.compute_ms")
            stats.bytes_sent += ms.numel() * ms.element_size()
            self.steps = next_steps(self.inner_steps, [float(r[0][0]) for r in rows])
            self.history.append(list(self.steps))
        self.compute_ms = []

    def summary(self) -> dict[str, Any]:
        return {"setting": self.setting, "steps": self.history if self.adaptive else self.steps}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "history": [list(h) for h in self.history],
                "compute_ms": list(self.compute_ms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = [int(h) for h in state["steps"]]
        self.history = [[int(h) for h in row] for row in state["history"]]
        self.compute_ms = [float(ms) for ms in state["compute_ms"]]
