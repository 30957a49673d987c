"""net.trace's player (compbench.network.trace_player) against the file it replays: the delay line's
changes in place (no root), then, with root, a trace of three 2 s phases replayed in a job's namespaces
and measured from inside them (a bulk TCP transfer's rate, a UDP ping's round trips, as
compbench.network.probes measures a constant link), and a training job on a trace that records what
was applied, which `compbench report` draws beside its throughput, and leaves nothing behind.

Fidelity (stated, asserted): in each phase, from 0.3 s after its change to its end, the measured rate
is within 15% of the file's, and half the fastest round trip is at least the file's one-way delay
between the two workers and at most 2 ms above it."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time

import pytest

from compbench.network import delay, probes
from compbench.network.delay_line import Line
from compbench.network.netem import can_shape, list_namespaces
from compbench.network.trace import parse_trace
from compbench.network.trace_player import APPLIED_FILE, APPLIED_HEADER, TRACE_FILE, TracedLinks
from compbench.report.main import main as report
from compbench.report.trace_plot import read_applied, throughput

needs_line = pytest.mark.skipif(not (can_shape() and delay.has_tun()),
                                reason="needs root, iproute2 and /dev/net/tun")
A, B = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
PHASE_S, SETTLE_S = 2.0, 0.3
RATE_TOLERANCE, DELAY_TOLERANCE_MS = 0.15, 2.0
# Ranks 0 and 1 carry the bulk transfer (their rate changes), ranks 2 and 3 the ping (their delay):
# a link per worker, so neither measurement crosses the other's links (a ping behind a bulk
# transfer's queue would measure the queue).
PHASES = """t_s,rank,mbps,delay_ms,loss
0,*,200,0,0
0,2,100,2,0
0,3,100,2,0
2,0,20,0,0
2,1,20,0,0
2,2,100,10,0
2,3,100,10,0
4,*,200,0,0
4,2,100,2,0
4,3,100,2,0
"""


def _packet(src: bytes, dst: bytes, n: int) -> bytes:
    return bytes([0x45]) + bytes(11) + src + dst + n.to_bytes(4, "big")


def test_the_line_takes_a_hosts_new_delay_and_loss_from_the_next_packet_on():
    line = Line({A: 0.001, B: 0.001})
    line.hold(_packet(A, B, 0), now=0.0)  # held for 2 ms
    line.apply("set 10.0.0.1 10000 0")  # A's link: 10 ms each way from now on
    line.hold(_packet(A, B, 1), now=0.0)
    assert [int.from_bytes(p[20:24], "big") for p in line.due(0.0021)] == [0]
    assert not line.due(0.0109) and len(line.due(0.011)) == 1
    line.apply("set 10.0.0.2 1000 0.2")  # B's link drops 20%, A's 0: 1 - 0.8 x 1 of each packet kept
    n = 20000
    for i in range(n):
        line.hold(_packet(A, B, i), now=1.0)
    lost = n - len(line.due(2.0))
    assert abs(lost - 0.2 * n) <= 4 * math.sqrt(n * 0.2 * 0.8), lost
    with pytest.raises(ValueError, match="unknown command"):
        line.apply("drop 10.0.0.1 1 0")


# The receiver: "flowing" once the first bytes are in, then, when the sender stops (or at `end`, a
# safety), the time and size of every read.
_SINK = """
import socket, sys, time
end = float(sys.argv[1])
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.bind(("0.0.0.0", 9999))
srv.listen(1)
conn, _ = srv.accept()
buf = bytearray(4 << 20)
got = []
while (now := time.monotonic()) < end:
    n = conn.recv_into(buf)
    if not n:
        break
    if not got:
        print("flowing", flush=True)
    got.append((now, n))
conn.close()
print("\\n".join(f"{t:.6f} {n}" for t, n in got))
"""
_SOURCE = probes.SOURCE.replace("PORT", "9999")  # the sink above listens there
_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9998))
while True:
    d, a = s.recvfrom(100)
    s.sendto(d, a)
"""
# One ping every 20 ms, each waited for (the line keeps a host pair's order: a ping never passes the last)
_PING = """
import socket, sys, time
host, end = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
while (t := time.monotonic()) < end:
    s.sendto(b"x" * 64, (host, 9998))
    try:
        s.recvfrom(100)
        print(f"{t:.6f} {time.monotonic() - t:.6f}", flush=True)
    except TimeoutError:
        pass
    time.sleep(max(0.0, t + 0.02 - time.monotonic()))
"""


# The traffic's programs run first on the cores, as the delay line does: a sender that waits for the CPU
# measures the machine's load, not the link (this machine's other work runs at load averages of 10-20).
_FIRST = "import os\nos.setpriority(os.PRIO_PROCESS, 0, -20)\n"


def _python(links: TracedLinks, rank: int, code: str, *args: object) -> list[str]:
    return [*links.prefix_for(rank), sys.executable, "-c", _FIRST + code, *map(str, args)]


def _replay_and_measure(trace_text: str) -> tuple[list[tuple[float, int]], list[tuple[float, float]],
                                                   TracedLinks]:
    """Replay `trace_text` for 4 workers: rank 0 sends to rank 1 as fast as it can, rank 2 pings rank 3
    every 20 ms. Returns (the receiver's (time, bytes) and the pinger's (time, round trip), both from
    the trace's clock; the links, deleted)."""
    trace = parse_trace(trace_text, 4)
    total_s = trace.duration_s + PHASE_S
    procs: list[subprocess.Popen] = []
    with TracedLinks(trace) as links:
        try:
            end = time.monotonic() + 120  # a safety: the sender's end stops the receiver
            for rank, code, args in ((1, _SINK, (end,)), (3, _ECHO, ())):
                procs.append(subprocess.Popen(_python(links, rank, code, *args), stdout=subprocess.PIPE,
                                              text=True))
            time.sleep(0.5)
            procs.append(subprocess.Popen(_python(links, 0, _SOURCE, links.address(1))))
            procs.append(subprocess.Popen(_python(links, 2, _PING, links.address(3), end),
                                          stdout=subprocess.PIPE, text=True))
            # the clock starts once both flows run (their start-up waits for the CPU on a loaded machine)
            assert procs[0].stdout is not None and procs[3].stdout is not None
            assert procs[0].stdout.readline().strip() == "flowing"
            first_ping = procs[3].stdout.readline()
            links.start_clock()
            time.sleep(max(0.0, links.t0 + total_s - time.monotonic()))
            procs[2].kill()  # the sender: the receiver sees the connection end and says what it got
            sink, _ = procs[0].communicate(timeout=30)
            procs[3].kill()
            pings = first_ping + procs[3].communicate(timeout=30)[0]
            assert links.failure() is None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    received = [(float(t) - links.t0, int(n)) for t, n in (line.split() for line in sink.split("\n") if line)]
    rtts = [(float(t) - links.t0, float(r)) for t, r in (line.split() for line in pings.split("\n") if line)]
    return received, rtts, links


@pytest.mark.dist
@needs_line
def test_a_replayed_trace_gives_each_phase_its_rate_and_delay():
    trace = parse_trace(PHASES, 4)
    received, rtts, links = _replay_and_measure(PHASES)
    print("\nphase     file Mbit/s  measured   file one-way ms  min RTT/2 ms")
    bad = []
    for start in (0.0, 2.0, 4.0):
        lo, hi = start + SETTLE_S, start + PHASE_S
        got = sum(n for t, n in received if lo <= t < hi)
        mbps = got * 8 / (hi - lo) / 1e6
        want = trace.at(start, 0).mbps
        one_way = trace.at(start, 2).delay_ms + trace.at(start, 3).delay_ms
        # round trips within the phase: one sent just before the next change comes back at its delay
        half_rtt = min(r for t, r in rtts if lo <= t and t + r < hi) / 2 * 1000
        print(f"{start:g}-{start + PHASE_S:g} s {want:11g} {mbps:10.1f} {one_way:17g} {half_rtt:13.2f}")
        if abs(mbps - want) > RATE_TOLERANCE * want:
            bad.append(f"rate at {start:g} s: {mbps:.1f} Mbit/s, the file's {want:g}")
        if not one_way <= half_rtt <= one_way + DELAY_TOLERANCE_MS:
            bad.append(f"one-way delay at {start:g} s: {half_rtt:.2f} ms, the file's {one_way:g}")
    late = [applied - change.t_s for change, applied in links.applied]
    print(f"changes applied: {len(late)}, after their time by {min(late) * 1e3:.1f}-{max(late) * 1e3:.1f} ms")
    assert not bad, bad
    assert len(links.applied) == len([c for c in trace.changes() if c.t_s > 0])
    assert [n for n in list_namespaces() if n.startswith(f"compbench-{os.getpid()}-")] == []


@pytest.mark.slow  # 16-25 s here: two workers' start-up and the report's figures
@pytest.mark.dist
@needs_line
def test_a_job_on_a_trace_records_what_was_applied_and_leaves_nothing(tmp_path):
    """The text workload (model=gpt, dataset=shakespeare) on 2 torch workers, rank 1's link dropping to
    20 Mbit/s with 5 ms more delay after 1 s: the run says what it replays, copies the trace, logs each
    applied change with its time (the report's figure places the run's throughput by it), and removes
    its namespaces and line."""
    trace = tmp_path / "drop.csv"
    trace.write_text("t_s,rank,mbps,delay_ms,loss\n0,*,200,1,0\n1,1,20,6,0\n")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "compbench", "train", "model=gpt", "dataset=shakespeare",
                           "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "batch_size=8",
                           "max_steps=4", "eval=false", "checkpoint=false", "progress=false", "engine=torch",
                           "engine.np=2", f"net.trace={trace}", f"output_dir={out}"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = (f"net.trace={trace}: a link per worker replayed from the trace (rank 0 200, rank 1 200 Mbit/s at "
            "t=0; 1 change(s) of a rank's link over 1 s, then its last row holds for the rest of the run")
    assert said in proc.stdout, proc.stdout
    assert (out / TRACE_FILE).read_text() == trace.read_text()
    rows = [row.split(",") for row in (out / APPLIED_FILE).read_text().splitlines()]
    assert ",".join(rows[0]) == APPLIED_HEADER
    # the t = 0 settings at the clock's start, then the change (the run outlasts 1 s: its start-up alone)
    assert [(t, rank, mbps, delay, loss) for t, _, _, rank, mbps, delay, loss in rows[1:]] == [
        ("0", "0", "200", "1", "0"), ("0", "1", "200", "1", "0"), ("1", "1", "20", "6", "0")]
    applied = [float(row[1]) for row in rows[1:]]
    assert applied[:2] == [0, 0] and applied[2] >= 1.0
    assert float(rows[3][2]) - float(rows[1][2]) == pytest.approx(applied[2], abs=1e-3)  # Unix times
    assert "compbench: net.trace: 1 of 1 change(s) applied, the latest" in proc.stdout
    # compbench report draws the trace above the run's throughput, both on the trace's clock
    assert report([str(out)]) == 0 and (out / "plots" / "trace_run.png").stat().st_size > 0
    start, world, later = read_applied(out)
    unit, points = throughput(out)
    assert world == 2 and later == [(applied[2], 1)] and unit == "tokens/s, all workers" and len(points) == 4
    assert all(0 < wall - start < 240 for wall, _ in points)  # after the workers' start, within the run
    switch = re.search(r"network namespaces (compbench-\S+)-sw", proc.stdout)
    assert switch, proc.stdout
    assert [n for n in list_namespaces() if n.startswith(switch.group(1))] == []
    line = subprocess.run(["pgrep", "-f", switch.group(1)], capture_output=True, text=True)
    assert line.stdout.strip() == ""  # the delay line ran in the switch's namespace
