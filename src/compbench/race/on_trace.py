"""The race on a link that changes: a trace (`compbench race --links trace:NAME|FILE`, net.trace:
compbench.network.trace) and the what-if model's time on it.

A trace sets each worker's link over time (rate, one-way delay, loss). A collective among the
workers goes at the pace of the slowest: the model takes, at each moment, the lowest rate of any
worker's link and the longest one-way delay between two workers (a packet between workers i and j
waits Di + Dj, compbench.network.netem.RankLinks), the `effective` link; loss it leaves out (TCP's
retransmissions are not in the alpha-beta cost). The effective link is piecewise constant:
`stretches` are the intervals where it holds.

The time to S steps on a trace walks the schedule from t = 0: each step takes the model's step time
at the effective link in force when it starts (compbench.race.model.Profile.step_ms: the warm-up's
dense steps first, as Profile.time_ms counts them), so a stretch of n steps lasts n of them, and the
step that starts before a change runs wholly at the old settings. After the trace's end its last
settings hold (as the player keeps them). Two approximations, said where the figures are: the clock
is the training clock (the trace's starts with the workers, and evaluations and start-up take wall
time the walk does not count: on the run's clock a change comes earlier than the walk has it), and a
periodic mode's exchange is spread over its round's steps (Profile's mean step), not sent at the
round's end.

The link's figure for ordering and labels (Link.mbps): the slowest worker's time-weighted mean rate
over the trace (Trace.mean_mbps of the effective rate over [0, duration_s]; the first row's where the
trace is one setting).
"""

from __future__ import annotations

import math

from compbench.comm.cost_model import Fit
from compbench.network.trace import Trace, load_trace, resolve
from compbench.race.model import Profile
from compbench.race.suites import Link

Stretch = tuple[float, float, float]  # (from t_s, effective Mbit/s, effective one-way delay ms)


def effective(trace: Trace, t_s: float) -> tuple[float, float]:
    """(Mbit/s, one-way ms) of the effective link at `t_s`: the lowest rate of any worker's link, and
    the longest delay between two workers (Di + Dj; one worker: its own link's, there is no pair)."""
    states = [trace.at(t_s, k) for k in range(trace.world)]
    delays = sorted((s.delay_ms for s in states), reverse=True)
    return min(s.mbps for s in states), delays[0] + (delays[1] if len(delays) > 1 else 0.0)


def stretches(trace: Trace) -> list[Stretch]:
    """The effective link's constant stretches, in time order, each from its start (the first at 0;
    the last holds for ever)."""
    out: list[Stretch] = []
    for t in sorted({c.t_s for c in trace.changes()}):
        mbps, delay = effective(trace, t)
        if not out or (out[-1][1], out[-1][2]) != (mbps, delay):
            out.append((t, mbps, delay))
    return out


def _mean(trace: Trace, column: int) -> float:
    """A column of the effective link's stretches (1: Mbit/s, 2: ms), time-weighted over the trace
    (its first where the trace lasts no time)."""
    parts = stretches(trace)
    end = trace.duration_s
    if end <= 0:
        return parts[0][column]
    edges = [*(p[0] for p in parts), end]
    return sum(p[column] * (b - p[0]) for p, b in zip(parts, edges[1:], strict=False)) / end


def mean_mbps(trace: Trace) -> float:
    """The effective rate's time-weighted mean over the trace."""
    return _mean(trace, 1)


def mean_delay_ms(trace: Trace) -> float:
    """The effective one-way delay's time-weighted mean over the trace."""
    return _mean(trace, 2)


def time_on_trace_ms(profile: Profile, steps: float, fit: Fit, trace: Trace, workers: int | None = None,
                     per_node: int = 1) -> float:
    """Milliseconds to `steps` steps walking the trace's schedule (see the module): in each stretch,
    whole steps at its effective link until one starts at or after the next change."""
    parts = stretches(trace)
    t_ms, taken, left = 0.0, 0.0, float(steps)
    for i, (_, mbps, delay) in enumerate(parts):
        end_ms = parts[i + 1][0] * 1e3 if i + 1 < len(parts) else math.inf
        while left > 0 and t_ms < end_ms:
            dense = taken < profile.warmup_steps
            step = profile.step_ms(fit, mbps / 1e3, workers, delay, dense=dense, per_node=per_node)
            kind = min(left, profile.warmup_steps - taken) if dense else left  # steps of this kind left
            n = min(kind, math.ceil((end_ms - t_ms) / step)) if end_ms < math.inf else kind
            t_ms, taken, left = t_ms + n * step, taken + n, left - n
        if left <= 0:
            break
    return t_ms


def trace_link(value: str, world: int) -> Link:
    """The race's link replaying `value` (a shipped trace's name, or a file), checked for `world`
    workers (the most any of the race's methods runs): a file's path made absolute, the runs being
    started elsewhere; ValueError naming the trace, its row and the fix."""
    path = resolve(value)
    trace = load_trace(path, world)
    shipped = "/" not in value and "." not in value  # compbench.network.trace.resolve's rule
    return Link(mean_mbps(trace), 0.0, value if shipped else str(path.resolve()))


def load_link_trace(link: Link, world: int) -> Trace:
    """The trace a race's link replays, for a run of `world` workers (ValueError where it is gone or
    no longer reads)."""
    return load_trace(resolve(link.trace), world)
