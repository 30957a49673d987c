"""compbench's delay line measured against what it promises (root, iproute2, /dev/net/tun): run it on
an idle machine, `python scripts/delay_line_fidelity.py [--out FILE.json] [--quick]`.

1. Round trips: a UDP ping-pong between two workers' links (compbench.network.probes) with the line
   at one-way delays from 0.1 to 200 ms, against twice the delay plus the links' own round trip (the
   same links bridged, no line): within 5% + 50 us.
2. Bulk: a TCP transfer over 1 Gbit/s links with 50 ms each way, once its window has grown, against
   the rate (>= 90%), with the socket buffers the job's namespaces get (compbench.network.netem's
   size_socket_buffers), and the line's CPU time per Gbit/s carried (it shares the workers' cores).
3. Loss: numbered one-way datagrams through a line dropping at 1% and 10%: the count lost within
   the binomial's 99.9% two-sided bound (3.29 standard deviations).
4. A training step through the line at its smallest delay (1 us) against the same links (one per
   worker, 1 Gbit/s) bridged without it: the text race's DDP-AdamW (one allreduce of 3.2 MB a
   step), runs alternating, the median of the runs' median steps: the line's at most 3% longer.
   The shaped loopback (a job without delay: one namespace) runs beside them: a delay also changes
   the topology.

Prints a table per part and writes them as JSON (default outputs/delay_line_fidelity.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compbench.network import probes
from compbench.network.delay import Impairment
from compbench.network.netem import RankLinks

Z999 = 3.29  # two-sided 99.9% of a normal


def links(one_way_us: float = 0.0, gbps: float = 1.0, loss: float = 0.0) -> RankLinks:
    """Two workers' links; through the line when it delays or drops, bridged otherwise."""
    line = Impairment(one_way_us, loss=loss, mode="line") if one_way_us or loss else None
    return RankLinks([gbps, gbps], one_way_us, line=line)


def round_trips(quick: bool) -> list[dict]:
    with links() as bridged:
        base = statistics.median(probes.round_trips(bridged, 200))
    rows = []
    for one_way_ms in (0.1, 1.0, 10.0, 50.0, 200.0):
        if quick and one_way_ms > 10:
            continue
        n = 10 if one_way_ms >= 50 else 40 if one_way_ms >= 10 else 200  # the short ones: noise of ~20 us
        with links(one_way_ms * 1e3) as line:
            rtt = statistics.median(probes.round_trips(line, n))
        want = 2 * one_way_ms / 1e3
        error = rtt - base - want
        rows.append({"one-way ms": one_way_ms, "want ms": want * 1e3, "round trip ms": rtt * 1e3,
                     "links' own ms": base * 1e3, "error us": error * 1e6,
                     "bound us": (0.05 * want + 50e-6) * 1e6, "ok": abs(error) <= 0.05 * want + 50e-6})
    return rows


def bulk(quick: bool) -> dict:
    one_way_us, gbps = 50_000.0, 1.0
    with links(one_way_us, gbps) as line:
        assert line.line is not None and line.line.process is not None
        pid = line.line.process.pid
        sysctl = [*line.prefix_for(0), "sysctl", "-n", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]
        buffers = subprocess.run(sysctl, capture_output=True, text=True, check=True).stdout.split("\n")
        cpu0 = probes.cpu_seconds(pid)
        rate, total = probes.bulk_gbps(line, seconds=8.0 if quick else 14.0, settle=3.0 if quick else 5.0)
        cpu = probes.cpu_seconds(pid) - cpu0
    gbit = total * 8 / 1e9
    return {"link Gbit/s": gbps, "one-way ms": one_way_us / 1e3, "rate Gbit/s": rate, "share": rate / gbps,
            "ok": rate >= 0.9 * gbps, "tcp_rmem": buffers[0], "tcp_wmem": buffers[1],
            "line CPU s": cpu, "Gbit carried": gbit, "line cores per Gbit/s": cpu / gbit if gbit else None}


def loss(quick: bool) -> list[dict]:
    n = 2000 if quick else 10_000
    rows = []
    for rate in (0.01, 0.1):
        with links(100.0, loss=rate) as line:  # a small delay: the datagrams' order does not matter here
            got = probes.received(line, n)
        lost, bound = n - got, Z999 * math.sqrt(n * rate * (1 - rate))
        rows.append({"loss": rate, "sent": n, "lost": lost, "expected": n * rate, "bound": bound,
                     "ok": abs(lost - n * rate) <= bound})
    return rows


def step_effect(quick: bool) -> dict:
    from compbench.race.suites import TEXT

    keys = [*TEXT.base, *TEXT.methods["ddp-adamw"], "max_steps=40" if quick else "max_steps=60", "eval=false",
            "checkpoint=false"]
    # the line's own effect: a link per worker through the line against the same links bridged; the
    # shaped loopback (a job without delay) beside them, for the change of topology a delay brings
    arms = {"loopback": ["net.emulate_gbps=1"], "links bridged": ["net.emulate_rank_gbps=[1,1]"],
            "links through the line (1 us)": ["net.emulate_gbps=1", "net.emulate_latency_us=1",
                                              "net.delay_line=line"]}
    steps: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="compbench-fidelity-") as tmp:
        for i in range(2 if quick else 5):  # runs of one setting differ by up to 10% here
            for arm, extra in arms.items():
                out = Path(tmp) / f"{''.join(c if c.isalnum() else '-' for c in arm)}-{i}"  # Hydra parses it
                proc = subprocess.run([sys.executable, "-m", "compbench", "train", *keys, *extra,
                                       f"output_dir={out}"], capture_output=True, text=True)
                if proc.returncode != 0:
                    raise RuntimeError(f"{arm}: {proc.stderr.strip()[-1000:]}")
                steps[arm].append(json.loads((out / "results.json").read_text())["summary"]["step_ms"])
    median = {arm: statistics.median(v) for arm, v in steps.items()}
    effect = median["links through the line (1 us)"] / median["links bridged"] - 1
    topology = median["links bridged"] / median["loopback"] - 1
    return {**{f"step ms {arm}": v for arm, v in steps.items()},
            **{f"median {arm}": m for arm, m in median.items()},
            "line against bridged links": effect, "links against loopback": topology,
            "ok": effect <= 0.03}


def _table(rows: list[dict]) -> str:
    from tabulate import tabulate

    return tabulate([{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
                    headers="keys", tablefmt="github")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/delay_line_fidelity.json")
    parser.add_argument("--quick", action="store_true", help="fewer delays, shorter transfers (a smoke test)")
    parser.add_argument("--only", default="rtt,bulk,loss,step", help="comma-separated parts")
    args = parser.parse_args()
    parts = {"rtt": round_trips, "bulk": bulk, "loss": loss, "step": step_effect}
    record: dict = {}
    for name in args.only.split(","):
        result = parts[name](args.quick)
        record[name] = result
        print(f"## {name}\n{_table(result if isinstance(result, list) else [result])}\n", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    ok = all(r["ok"] for part in record.values() for r in (part if isinstance(part, list) else [part]))
    print(f"fidelity: {'all within their bounds' if ok else 'SOME OUT OF BOUNDS'}; {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
