"""The what-if model of every synchronization mode: a run's step time at another bandwidth, latency
or worker count, from what the run measured and what its mode declares.

A run gives, per step, the time that does not depend on the network, `fixed` = step - comm (compute,
encode, decode, optimizer, other: `split_ms`), and what it sends: bytes and collectives per step
(means over whole rounds for periodic modes). Its mode declares (results.json `exchange`,
`compbench.sync.ExchangePlan`) one exchange every `every` steps, in the collectives of `pattern`,
hidden behind `hidden_steps` steps of compute while it travels, or behind back-propagation
(`overlaps_backward`), after `warmup_steps` steps that exchange the gradients dense (one allreduce
of them: 1-bit Adam's warm-up). Then, at G Gbit/s with N workers and a latency L per message round:

    comm(G, N, L) = the node-aware alpha-beta cost of one exchange's collectives
                    (compbench.comm.cost_model: per collective, per round, per byte on the
                    busiest link), plus L for each of its rounds
    hidden        = hidden_steps * fixed  (+ 2/3 of the compute for an exchange that overlaps
                    back-propagation: backward's usual share of forward + backward)
    step(G, N, L) = fixed + max(0, comm - hidden) / every
    time to S steps = min(S, warmup) x the warm-up's step + the rest x step(G, N, L)

The alpha-beta coefficients are fitted (non-negative least squares on relative errors) on the race's
own runs: each row's measured step time against its prediction with the row's own `fixed`.
Assumptions: `fixed` and the payload per worker do not change with N or G; every worker is its own
machine on a link of G each way (compbench's shaped loopback: 2 workers, 2 x G on one device; with a
delay, a link each). The delay L is waited once per message round (`latency_factor` x L x rounds,
the factor fitted where the race's runs had two delays or more: TCP's slow start and
acknowledgements can cost more round trips than the collective's own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compbench.comm.cost_model import TERMS, Fit, Shape, features

BACKWARD_SHARE = 2 / 3  # of forward + backward: what a per-step exchange from backward hooks can hide behind


@dataclass(frozen=True)
class Profile:
    """What the model needs of one run (per worker, per step unless said otherwise)."""

    fixed_ms: float
    compute_ms: float
    row: dict                  # cost_model's row for ONE exchange (bytes and calls per exchange, comm)
    every: int
    hidden_steps: int
    overlaps_backward: bool
    workers: int
    warmup_steps: int = 0

    @classmethod
    def of(cls, results: dict) -> Profile:
        s, plan = results["summary"], results.get("exchange") or {}
        every = int(plan.get("every", 1))
        row = {"comm": results["config"]["choices"]["comm"],
               **{k: float(s.get(k) or 0.0) * every for k in (
                   "bytes_sent_per_step", "bytes_allreduce_per_step", "bytes_dense_per_step",
                   "compressed_calls_per_step", "dense_calls_per_step")}}
        if plan.get("pattern") == "group_allreduce":  # NoLoCo: the allreduce runs inside groups
            row["group"] = float(plan.get("group", 0))
        # one group (a bucket of the whole model) goes as backward ends: nothing overlaps, though
        # the scheduler overlaps (the scheduler's summary names its groups)
        groups = (results.get("scheduler") or {}).get("groups")
        return cls(fixed_ms=float(s["step_ms"]) - float(s.get("comm_ms") or 0.0),
                   compute_ms=float(s.get("compute_ms") or 0.0), row=row, every=every,
                   hidden_steps=int(plan.get("hidden_steps", 0)),
                   overlaps_backward=bool(plan.get("overlaps_backward", False)) and groups != 1,
                   workers=int(results["environment"]["world_size"]),
                   warmup_steps=int(plan.get("warmup_steps", 0)))

    def terms(self, gbps: float, workers: int | None = None, dense: bool = False) -> dict[str, float]:
        n = workers or self.workers
        row = self.row
        if dense:  # the warm-up: the gradients' fp32 bytes in one allreduce a step
            fp32 = self.row["bytes_dense_per_step"] / self.every
            row = {"comm": "allreduce", "bytes_sent_per_step": fp32, "bytes_allreduce_per_step": fp32,
                   "bytes_dense_per_step": fp32, "compressed_calls_per_step": 0, "dense_calls_per_step": 1}
        return features(row, Shape(nodes=n, workers=n, gbps=gbps))

    def hidden_ms(self, dense: bool = False) -> float:
        """What an exchange hides behind: backward (a per-step one from backward hooks), or the
        steps it overlaps; a warm-up's dense exchange, backward at most."""
        backward = BACKWARD_SHARE * self.compute_ms if self.overlaps_backward else 0.0
        return backward if dense else self.hidden_steps * self.fixed_ms + backward

    def comm_ms(self, fit: Fit, gbps: float, workers: int | None = None, latency_ms: float = 0.0,
                dense: bool = False) -> float:
        """One exchange's communication, before what hides it: the collectives plus the delay once
        per message round (times the fitted factor)."""
        terms = self.terms(gbps, workers, dense)
        return fit.comm_ms(terms) + fit.latency_factor * latency_ms * terms["rounds"]

    def step_ms(self, fit: Fit, gbps: float, workers: int | None = None, latency_ms: float = 0.0,
                dense: bool = False) -> float:
        """A step's time; `dense`: a warm-up step's (every step exchanges, nothing hidden but backward)."""
        comm = self.comm_ms(fit, gbps, workers, latency_ms, dense)
        return self.fixed_ms + max(0.0, comm - self.hidden_ms(dense)) / (1 if dense else self.every)

    def time_ms(self, steps: float, fit: Fit, gbps: float, workers: int | None = None,
                latency_ms: float = 0.0) -> float:
        """Time to `steps` steps: the warm-up's dense steps, then the mode's own."""
        warm = min(steps, self.warmup_steps)
        return (warm * self.step_ms(fit, gbps, workers, latency_ms, dense=True)
                + (steps - warm) * self.step_ms(fit, gbps, workers, latency_ms))

    def utilization(self, fit: Fit, gbps: float, workers: int | None = None,
                    latency_ms: float = 0.0) -> float:
        return self.compute_ms / self.step_ms(fit, gbps, workers, latency_ms)


def fit_model(rows: list[tuple[Profile, float, float, float, bool]]) -> Fit:
    """Fit the alpha-beta coefficients on (profile, Gbit/s, one-way delay ms, measured step ms, a
    warm-up step) rows: non-negative least squares on relative errors of the exposed communication,
    iterated so that only the rows whose exchange is not fully hidden (the max(0, .) is active)
    constrain it. The delay's factor per message round is fitted where the rows had two delays or
    more; otherwise it stays 1 (each round waits the delay once)."""
    from scipy.optimize import nnls

    fit_latency = len({latency for _, _, latency, _, _ in rows}) >= 2
    scale = np.array([1.0, 1.0, 1.0, 1e3, 1.0] + ([1.0] if fit_latency else []))
    active = list(rows)
    model = Fit(0.0, 0.0, 0.0, 1.0, math.inf)
    for _ in range(4):
        x, y, w = [], [], []
        for p, gbps, latency, step, dense in active:
            terms = p.terms(gbps, dense=dense)
            every, hidden = (1, p.hidden_ms(dense=True)) if dense else (p.every, p.hidden_ms())
            delay = latency * terms["rounds"]
            # step = fixed + (comm - hidden) / every  =>  comm = (step - fixed) * every + hidden
            x.append(np.array([terms[k] for k in TERMS] + ([delay] if fit_latency else [])) * scale)
            y.append((step - p.fixed_ms) * every + hidden - (0.0 if fit_latency else delay))
            w.append(1.0 / max(step * every, 1e-3))
        if len(x) < len(scale):
            break
        coef, _ = nnls(np.array(x) * np.array(w)[:, None], np.array(y) * np.array(w))
        waited, queued, rounds, link, per_byte = (float(c) for c in coef[:5])
        model = Fit(waited, queued, rounds, link, math.inf if per_byte == 0 else 1e3 / per_byte / 1e9,
                    float(coef[5]) if fit_latency else 1.0)
        active = [(p, g, lat, s, d) for p, g, lat, s, d in rows
                  if p.comm_ms(model, g, latency_ms=lat, dense=d) > p.hidden_ms(dense=d)]
    return model


def crossover_gbps(method: Profile, steps: float, baseline: Profile, baseline_steps: float, fit: Fit,
                   workers: int | None = None, latency_ms: float = 0.0) -> tuple[float | None, str]:
    """The bandwidth below which `method` reaches the target before `baseline` (times to target:
    steps x predicted step time), searched from 0.1 Mbit/s to 100 Gbit/s; (None, why) where it
    beats it everywhere or nowhere in that range."""
    grid = np.logspace(-4, 2, 121)  # Gbit/s
    wins = [method.time_ms(steps, fit, g, workers, latency_ms)
            < baseline.time_ms(baseline_steps, fit, g, workers, latency_ms) for g in grid]
    if all(wins):
        return None, "everywhere"
    if not any(wins):
        return None, "nowhere"
    last = max(i for i, w in enumerate(wins) if w)
    if all(wins[: last + 1]):
        return float(grid[last]), "below"
    return float(grid[last]), "mixed"


def crossover_rtt_ms(method: Profile, steps: float, baseline: Profile, baseline_steps: float, fit: Fit,
                     gbps: float, workers: int | None = None) -> tuple[float | None, str]:
    """The round trip (ms, twice the one-way delay) above which `method` reaches the target before
    `baseline` at `gbps`, searched from 0.01 ms to 2 s; (None, why) where it beats it at every
    round trip in that range or at none."""
    grid = np.logspace(-2, np.log10(2000), 121)  # round trip, ms
    wins = [method.time_ms(steps, fit, gbps, workers, rtt / 2)
            < baseline.time_ms(baseline_steps, fit, gbps, workers, rtt / 2) for rtt in grid]
    if all(wins):
        return None, "everywhere"
    if not any(wins):
        return None, "nowhere"
    first = min(i for i, w in enumerate(wins) if w)
    if all(wins[first:]):
        return float(grid[first]), "above"
    return float(grid[first]), "mixed"
