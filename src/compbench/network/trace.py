"""Links that change over time: `net.trace=FILE`, a CSV of each worker's link rate, one-way delay and
loss over time, which compbench's link shaping replays while a job runs (compbench.network.trace_player).

The file (`#` starts a comment line; blank lines are skipped)::

    t_s,rank,mbps,delay_ms,loss
    0,*,200,10,0          # from t = 0 s every rank's link: 200 Mbit/s, 10 ms one way, no loss
    0,1,50,40,0           # ... except rank 1's
    120,*,20,10,0.01      # from t = 120 s every link: 20 Mbit/s, 1% loss

- Each row sets one rank's link (`*`: every rank's) from `t_s` on: a link is piecewise constant,
  holding a row's settings until the next row for that rank.
- `mbps`: the link's rate in Mbit/s, each way (the worker's egress and the switch's port towards
  it, as net.emulate_rank_gbps shapes them), within [MBPS_MIN, MBPS_MAX]. A rate cannot be 0 (a
  token bucket needs a positive rate): a failed link is `mbps=0.001` (MBPS_MIN, 1 kbit/s: a 64 KiB
  packet takes 8.7 minutes, so nothing a job sends gets through until the rate comes back).
- `delay_ms`: the link's one-way delay, as net.emulate_rank_latency_us gives it: a packet between
  workers i and j waits Di + Dj. Within [0, 250] ms (compbench.network.netem.DELAY_US).
- `loss`: the link's packet loss rate in [0, 1): a packet between i and j is lost with
  1 - (1 - Li)(1 - Lj) (compbench's delay line draws it).
- Rows are in time order (`t_s` never decreases); at one time a `*` row comes first and a later row
  for one rank overrides it; no rank is set twice at one time.
- Every rank of the job has a setting at t = 0 (no gap), and no row names a rank beyond the job's
  workers.
- The clock starts when the workers start. The trace lasts `duration_s` (its last row's time); after
  it ends the last settings hold for the rest of the run (nothing loops: a trace that should repeat
  is written out as long as the run).

`load_trace` reads and checks a file (ValueError naming the row and the fix); `resolve` turns a
shipped trace's name (`diurnal`, `bursts`, `outage`: SHIPPED, made by scripts/make_traces.py) into
its file.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass
from pathlib import Path

from compbench.network.netem import DELAY_US, RATE_GBPS

HEADER = ("t_s", "rank", "mbps", "delay_ms", "loss")
EVERY = "*"
MBPS_MIN = 0.001  # 1 kbit/s: a failed link (a token bucket needs a positive rate)
MBPS_MAX = RATE_GBPS[1] * 1000
DELAY_MS_MAX = DELAY_US[1] / 1000
SHIPPED_DIR = Path(__file__).parent / "traces"


def shipped() -> tuple[str, ...]:
    """The names of the traces shipped with compbench (`net.trace=NAME`)."""
    return tuple(sorted(p.stem for p in SHIPPED_DIR.glob("*.csv")))


def resolve(value: str) -> Path:
    """The file `net.trace=value` names: a bare name (no `/`, no `.`) is a shipped trace
    (SHIPPED_DIR/NAME.csv); anything else a path, relative to the directory compbench runs in.
    ValueError naming net.trace and the fix when no such file exists."""
    if "/" not in value and "." not in value:
        path = SHIPPED_DIR / f"{value}.csv"
        if not path.is_file():
            raise ValueError(f"net.trace={value} is not a shipped trace ({', '.join(shipped())}) nor a path; "
                             "pass one of those names or a CSV file's path, e.g. net.trace=./my_link.csv")
        return path
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"net.trace={value}: no such file; pass a CSV file's path or a shipped trace's name "
                         f"({', '.join(shipped())})")
    return path


@dataclass(frozen=True)
class LinkState:
    """One link's settings: rate in Mbit/s, one-way delay in ms, packet loss rate."""

    mbps: float
    delay_ms: float
    loss: float


@dataclass(frozen=True)
class Change:
    """From `t_s` on, rank `rank`'s link is `state` (one entry of the schedule)."""

    t_s: float
    rank: int
    state: LinkState


@dataclass(frozen=True)
class Trace:
    """A checked trace for a job of `world` workers: per rank, the times its settings change and the
    settings from each (`times[k][i]` starts `states[k][i]`; `times[k][0]` is 0). `source` is the
    file it came from."""

    world: int
    times: tuple[tuple[float, ...], ...]
    states: tuple[tuple[LinkState, ...], ...]
    source: str = ""

    @property
    def duration_s(self) -> float:
        """The time of the trace's last change; after it the last settings hold."""
        return max(ts[-1] for ts in self.times)

    def at(self, t_s: float, rank: int) -> LinkState:
        """Rank `rank`'s link at `t_s` seconds after the workers start (before 0: the first setting;
        after duration_s: the last)."""
        i = bisect.bisect_right(self.times[rank], t_s) - 1
        return self.states[rank][max(0, i)]

    def changes(self) -> tuple[Change, ...]:
        """The schedule: each rank's settings at t = 0, then every change of a rank's link (a row that
        repeats the rank's settings is no change), by time then rank."""
        out = []
        for rank in range(self.world):
            for i, (t, state) in enumerate(zip(self.times[rank], self.states[rank], strict=True)):
                if i == 0 or state != self.states[rank][i - 1]:
                    out.append(Change(t, rank, state))
        return tuple(sorted(out, key=lambda c: (c.t_s, c.rank)))

    def mean_mbps(self, rank: int, t0: float, t1: float) -> float:
        """Rank `rank`'s time-weighted mean rate over [t0, t1] in Mbit/s: sum of rate x time in each
        stretch of constant rate, divided by t1 - t0 (the rate at t0 when t1 == t0)."""
        if t1 < t0:
            raise ValueError(f"mean_mbps: t1={t1:g} is before t0={t0:g}")
        if t1 == t0:
            return self.at(t0, rank).mbps
        times = self.times[rank]
        edges = [t0, *(t for t in times if t0 < t < t1), t1]
        total = sum(self.at(a, rank).mbps * (b - a) for a, b in zip(edges, edges[1:], strict=False))
        return total / (t1 - t0)

    def max_state(self, rank: int) -> LinkState:
        """The highest rate, delay and loss rank `rank`'s link ever has (each on its own: what the
        link's buffers are sized for)."""
        states = self.states[rank]
        return LinkState(max(s.mbps for s in states), max(s.delay_ms for s in states),
                         max(s.loss for s in states))


def _number(at: str, key: str, text: str, fix: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{at}: {key}={text!r} is not a number; {fix}") from None
    if not math.isfinite(value):
        raise ValueError(f"{at}: {key}={text} is not a finite number; {fix}")
    return value


def _state(at: str, mbps: str, delay_ms: str, loss: str) -> LinkState:
    rate = _number(at, "mbps", mbps, "write the link's rate in Mbit/s, e.g. 200")
    if not MBPS_MIN <= rate <= MBPS_MAX:
        raise ValueError(f"{at}: mbps={mbps} must be within [{MBPS_MIN:g}, {MBPS_MAX:.0f}] Mbit/s "
                         f"(a rate cannot be 0 or below: write a failed link as mbps={MBPS_MIN:g})")
    delay = _number(at, "delay_ms", delay_ms, "write the one-way delay in ms, e.g. 10")
    if not 0 <= delay <= DELAY_MS_MAX:
        raise ValueError(f"{at}: delay_ms={delay_ms} must be within [0, {DELAY_MS_MAX:g}] ms "
                         "(a one-way delay; beyond 250 ms a job's start-up outlasts gloo's time-outs)")
    lost = _number(at, "loss", loss, "write a packet loss rate in [0, 1), e.g. 0.01")
    if not 0 <= lost < 1:
        raise ValueError(f"{at}: loss={loss} must be a rate in [0, 1), e.g. 0.01 (a failed link "
                         f"is written as mbps={MBPS_MIN:g})")
    return LinkState(rate, delay, lost)


def _rank(at: str, text: str, world: int) -> int | None:
    """The rank a row names (None: every rank)."""
    if text == EVERY:
        return None
    try:
        rank = int(text)
    except ValueError:
        raise ValueError(f"{at}: rank={text!r} must be a worker's rank (0 to {world - 1}) or "
                         f"{EVERY} (every rank)") from None
    if not 0 <= rank < world:
        raise ValueError(f"{at}: rank={rank} is beyond the job's {world} worker(s) (ranks 0 to "
                         f"{world - 1}); drop the row or pass engine.np={rank + 1}")
    return rank


def parse_trace(text: str, world: int, source: str = "") -> Trace:
    """A trace from a CSV's text for a job of `world` workers; ValueError naming the row (counted
    from 1, the header included, as an editor shows it) and the fix."""
    where = f"net.trace={source}" if source else "net.trace"
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{where}: the file is empty; its first line is the header {','.join(HEADER)}")
    first_n, first = lines[0]
    header = tuple(cell.strip() for cell in first.split(","))
    if header != HEADER:
        raise ValueError(f"{where} row {first_n}: the header is {first.strip()!r}; it must be "
                         f"{','.join(HEADER)}")
    times: list[list[float]] = [[] for _ in range(world)]
    states: list[list[LinkState]] = [[] for _ in range(world)]
    last_t, set_now = 0.0, set[int]()  # the ranks set by rows of their own at last_t (-1: a * row)
    for n, cells in zip((n for n, _ in lines[1:]),
                        csv.reader(line.split("#", 1)[0] for _, line in lines[1:]), strict=True):
        at, cells = f"{where} row {n}", [c.strip() for c in cells]
        if len(cells) != len(HEADER):
            raise ValueError(f"{at}: {len(cells)} values, expected {len(HEADER)} "
                             f"({','.join(HEADER)})")
        t = _number(at, "t_s", cells[0], "write the time in seconds from the workers' start, e.g. 12.5")
        if t < 0:
            raise ValueError(f"{at}: t_s={cells[0]} is before the start; times are >= 0 s")
        if t < last_t:
            raise ValueError(f"{at}: t_s={cells[0]} is before the previous row's {last_t:g}; sort "
                             "the rows by time")
        if t > last_t:
            set_now = set()
        rank = _rank(at, cells[1], world)
        state = _state(at, *cells[2:])
        ranks = range(world) if rank is None else [rank]
        if rank is None and set_now:
            raise ValueError(f"{at}: a {EVERY} row after other rows at t_s={t:g} would override them; "
                             f"put one {EVERY} row first at each time")
        for k in ranks:
            if rank is not None and k in set_now:
                raise ValueError(f"{at}: rank {k} is set twice at t_s={t:g}; keep one row")
            if times[k] and times[k][-1] == t:  # a rank's own row after the * row at the same time
                states[k][-1] = state
            else:
                times[k].append(t)
                states[k].append(state)
        set_now |= {-1} if rank is None else {rank}
        last_t = t
    missing = [k for k in range(world) if not times[k] or times[k][0] != 0]
    if missing:
        gaps = ", ".join(map(str, missing))
        raise ValueError(f"{where}: rank(s) {gaps} have no setting at t_s=0 (a gap: the "
                         f"link is undefined until the first row); add a row 0,{EVERY},MBPS,DELAY_MS,LOSS")
    return Trace(world, tuple(map(tuple, times)), tuple(map(tuple, states)), source)


def load_trace(path: Path, world: int) -> Trace:
    """The trace in file `path` for a job of `world` workers, checked (ValueError naming net.trace,
    the row and the fix)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"net.trace={path}: cannot read it ({e.strerror}); pass a readable CSV "
                         "file") from None
    except UnicodeDecodeError:
        raise ValueError(f"net.trace={path} is not a text file; pass a CSV file with the header "
                         f"{','.join(HEADER)}") from None
    shown = Path(path).stem if Path(path).parent == SHIPPED_DIR else str(path)
    return parse_trace(text, world, shown)
