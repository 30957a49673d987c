"""Make compbench's shipped link traces (src/compbench/network/traces/*.csv, `net.trace=NAME`) from
stated assumptions:

    python scripts/make_traces.py [--out DIR]

Each trace is written as the format says (compbench.network.trace: `t_s,rank,mbps,delay_ms,loss`,
piecewise constant, `delay_ms` each link's one-way share: a packet between two workers waits for
both links), with `#` lines at its top that repeat its assumptions. The traces are deterministic
(fixed seeds): running this again writes the same files, which tests/unit/test_trace.py checks.
Rates stay at a few hundred Mbit/s at most: the delay line carries the links in Python, at about a
quarter of a core per Gbit/s (docs/results.md), and the machine these traces were made for has 2 cores.

diurnal (240 s): a wide-area path between two data centres over a day, compressed in time: a day of
  24 hours in 240 s (1 s of the trace is 6 minutes of the day), from midnight, a row every 30
  minutes of the day (5 s). Assumptions: the path carries 500 Mbit/s per worker; other traffic uses a
  share u of it that follows the day, least at 04:00 (u = 0.2) and most at 20:00 (u = 0.8, the evening
  peak of residential and content traffic), rising as half a cosine from 04:00 to 20:00 and falling as
  the other half from 20:00 to 04:00; a worker gets (1 - u) x 500 Mbit/s, 400 at night to 100 in the
  evening. The one-way delay between two workers is 40 ms of propagation (a continent's width) plus a
  queue that grows as u / (1 - u) x 2 ms (an M/M/1 queue's wait, 2 ms at u = 0.5): 40.5 ms at night,
  48 ms at the peak; each link carries half of it. Loss: 0 up to u = 0.7, then rising linearly to
  0.1% at the peak (queues overflowing). The last row (midnight again) holds after the day.
  Every rank's link alike (`*` rows): any engine.np.

bursts (180 s): a 200 Mbit/s link with 5 ms each way (10 ms between two workers) hit by bursts of cross
  traffic. Assumptions: the quiet time from the end of one burst to the start of the next is
  exponential with mean 20 s (bursts arrive as a Poisson process while the link is quiet); a burst
  lasts an exponential time of mean 3 s, kept within [1, 8] s; during one the link keeps a share of
  its rate drawn uniformly from [0.2, 0.5] (40-100 Mbit/s) and its delay grows by 5 ms (the cross
  traffic's queue). Times to 0.1 s; seed 0 (7 bursts in 180 s, about the 180 / (20 + 3) = 7.8
  expected).
  Every rank's link alike: any engine.np.

outage (180 s): one worker's link fails for a minute. Assumptions: every link carries 100 Mbit/s with
  10 ms each way; rank 1's link fails from t = 60 s to t = 120 s and comes back as it was. A failed link
  is written as the format's floor rate, mbps = 0.001 (1 kbit/s: a token bucket needs a positive rate,
  and at that rate a 64 KiB packet takes 8.7 minutes: nothing a job sends gets through), with no loss:
  packets wait in the link's queue and TCP's retransmission timer backs off, as over a path whose
  route has gone, so a job resumes at its next retransmission after the link returns (engine=torch's
  timeout_s of 300 s outlasts the minute). Needs engine.np >= 2 (it names rank 1).
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

from compbench.network.trace import HEADER, MBPS_MIN, SHIPPED_DIR

DAY_S = 240.0  # a day of the diurnal trace, in seconds of the trace
DAY_STEPS = 48  # a row every 30 minutes of the day


def _row(t_s: float, rank: str, mbps: float, delay_ms: float, loss: float) -> str:
    return f"{t_s:g},{rank},{mbps:.4g},{delay_ms:.4g},{loss:.4g}"


def _file(assumption: str, rows: list[str]) -> str:
    said = "".join(f"# {line}\n" for line in assumption.strip().splitlines())
    made = "# made by scripts/make_traces.py (see its docstring)\n"
    return said + made + ",".join(HEADER) + "\n" + "\n".join(rows) + "\n"


def diurnal() -> str:
    rows = []
    for step in range(DAY_STEPS + 1):  # the last row: midnight again, which then holds
        hour = 24.0 * step / DAY_STEPS
        # least at 04:00, most at 20:00: a sinusoid would put them 12 h apart, so the day is warped to
        # a rising half from 04:00 to 20:00 (16 h) and a falling one from 20:00 to 04:00 (8 h)
        since = (hour - 4.0) % 24.0
        phase = since / 16.0 if since <= 16.0 else 1.0 + (since - 16.0) / 8.0
        u = 0.5 - 0.3 * math.cos(math.pi * phase)  # 0.2 at 04:00, 0.8 at 20:00
        mbps = (1.0 - u) * 500.0
        one_way_ms = 40.0 + 2.0 * u / (1.0 - u)
        loss = 0.001 * min(1.0, max(0.0, (u - 0.7) / 0.1))
        rows.append(_row(step * DAY_S / DAY_STEPS, "*", mbps, one_way_ms / 2, loss))
    return _file("A wide-area link over one day compressed into 240 s (1 s = 6 minutes, from midnight): "
                 "500 Mbit/s,\nless what other traffic uses (20% at 04:00 to 80% at 20:00), 40 ms between "
                 "two workers plus queueing,\nloss up to 0.1% at the evening peak.", rows)


def bursts(seed: int = 0, length_s: float = 180.0) -> str:
    rng = random.Random(seed)
    rate, delay = 200.0, 5.0
    rows, t = [_row(0, "*", rate, delay, 0)], 0.0
    while True:
        t = round(t + rng.expovariate(1 / 20.0), 1)
        lasts = round(min(8.0, max(1.0, rng.expovariate(1 / 3.0))), 1)
        share = rng.uniform(0.2, 0.5)
        if t + lasts >= length_s:
            break
        rows.append(_row(t, "*", rate * share, delay + 5.0, 0))
        t = round(t + lasts, 1)
        rows.append(_row(t, "*", rate, delay, 0))
    rows.append(_row(length_s, "*", rate, delay, 0))
    return _file("A 200 Mbit/s link, 5 ms each way, hit by bursts of cross traffic (20 s apart on "
                 "average, 1-8 s long):\nduring one it keeps 20-50% of its rate and its delay grows by 5 ms.",
                 rows)


def outage() -> str:
    rows = [_row(0, "*", 100, 10, 0), _row(60, "1", MBPS_MIN, 10, 0), _row(120, "1", 100, 10, 0),
            _row(180, "*", 100, 10, 0)]
    return _file("Every link 100 Mbit/s, 10 ms each way; rank 1's link fails from 60 s to 120 s (the floor "
                 f"rate,\n{MBPS_MIN:g} Mbit/s: packets wait in its queue) and comes back. Needs "
                 "engine.np >= 2.", rows)


TRACES = {"diurnal": diurnal, "bursts": bursts, "outage": outage}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=SHIPPED_DIR, help="where the CSV files go")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, make in TRACES.items():
        (args.out / f"{name}.csv").write_text(make())
        print(f"wrote {args.out / name}.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
