"""Probes of the emulated link between two workers' namespaces (compbench.network.netem.RankLinks):
a UDP ping-pong's round trips, a bulk TCP transfer's rate once its window has grown, and one-way UDP
loss. Each side is a small Python program run in its worker's namespace (`prefix_for`), as a job's
workers are. scripts/delay_line_fidelity.py measures the delay line with them; the tests use them too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

_PORT = 9999
_START_S = 0.5  # the listening side's start-up before the other side sends

# Both ends of the ping-pong poll their socket instead of sleeping on it: a process woken from sleep
# on a virtual machine starts tens of microseconds late (more after a longer idle spell), a cost of the
# host, not of the link, that would blur a round trip of 0.2 ms; the two busy ends take a core each.
_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", PORT))
s.setblocking(False)
while True:
    try:
        d, a = s.recvfrom(100)
    except BlockingIOError:
        continue
    s.sendto(d, a)
"""
_PING = """
import socket, sys, time
host, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
for i in range(n):
    t = time.perf_counter()
    s.sendto(b"x" * 64, (host, PORT))
    while True:
        try:
            s.recvfrom(100)
            break
        except BlockingIOError:
            if time.perf_counter() - t > 5:
                raise TimeoutError("no answer in 5 s")
    print(time.perf_counter() - t)
"""
# The receiver: the rate between `settle` seconds after the first byte and `seconds` (TCP's window
# grows over the first round trips); it closes the connection at the end, which ends the sender.
_SINK = """
import socket, sys, time
seconds, settle = float(sys.argv[1]), float(sys.argv[2])
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.bind(("0.0.0.0", PORT))
srv.listen(1)
conn, _ = srv.accept()
buf = bytearray(4 << 20)
first = conn.recv_into(buf)
t0 = time.perf_counter()
total, mark = first, None
while (now := time.perf_counter()) - t0 < seconds:
    n = conn.recv_into(buf)
    if not n:
        break
    total += n
    if mark is None and now - t0 >= settle:
        mark = (now, total)
conn.close()
print((total - mark[1]) * 8 / (now - mark[0]) / 1e9, total)
"""
# The bulk sender (as fast as it can to argv[1]); tests/integration/test_trace_player.py sends with it too.
SOURCE = """
import socket, sys
s = socket.create_connection((sys.argv[1], PORT))
chunk = bytes(1 << 20)
try:
    while True:
        s.sendall(chunk)
except OSError:
    pass
"""
# One-way datagrams, paced below the link's rate (a socket buffer's overflow is not the line's loss).
_BLAST = """
import socket, sys, time
host, n, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t = time.perf_counter()
for i in range(n):
    s.sendto(i.to_bytes(4, "big") + bytes(996), (host, PORT))
    t += gap
    while time.perf_counter() < t:
        pass
"""
_COUNT = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("0.0.0.0", PORT))
s.settimeout(30)
seen = set()
s.recvfrom(2000)  # the first one: the sender is there
seen.add(0)
s.settimeout(2)
try:
    while True:
        d, _ = s.recvfrom(2000)
        seen.add(int.from_bytes(d[:4], "big"))
except TimeoutError:
    pass
print(len(seen))
"""


class Links(Protocol):
    def prefix_for(self, rank: int) -> list[str]: ...
    def address(self, rank: int) -> str: ...


def _python(links: Links, rank: int, code: str, *args: object) -> list[str]:
    return [*links.prefix_for(rank), sys.executable, "-c", code.replace("PORT", str(_PORT)), *map(str, args)]


def _pair(links: Links, listener: list[str], talker: list[str], timeout: float) -> tuple[str, str]:
    """Run the listening program (rank 1) and, once it is up, the talking one (rank 0); the output
    of each, the listener's ended or killed."""
    server = subprocess.Popen(listener, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(_START_S)
        client = subprocess.run(talker, capture_output=True, text=True, timeout=timeout)
        if client.returncode != 0:
            raise RuntimeError(f"probe failed: {client.stderr.strip()[-500:]}")
        try:
            out, err = server.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            server.kill()
            out, err = server.communicate()
        return out, client.stdout
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def round_trips(links: Links, n: int = 20) -> list[float]:
    """`n` UDP ping-pongs from rank 0 to rank 1 (seconds each)."""
    server = subprocess.Popen(_python(links, 1, _ECHO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(_START_S)
        out = subprocess.run(_python(links, 0, _PING, links.address(1), n), capture_output=True, text=True,
                             timeout=60 + 10 * n)
        if out.returncode != 0:
            raise RuntimeError(f"ping failed: {out.stderr.strip()[-500:]}")
        return [float(x) for x in out.stdout.split()]
    finally:
        server.kill()
        server.wait()


def bulk_gbps(links: Links, seconds: float = 12.0, settle: float = 4.0) -> tuple[float, int]:
    """A TCP transfer from rank 0 to rank 1 for `seconds`: (Gbit/s after the first `settle` seconds,
    bytes in all)."""
    sink = _python(links, 1, _SINK, seconds, settle)
    out, _ = _pair(links, sink, _python(links, 0, SOURCE, links.address(1)), timeout=seconds + 60)
    gbps, total = out.split()
    return float(gbps), int(total)


def received(links: Links, n: int, gap_s: float = 50e-6) -> int:
    """How many of `n` numbered UDP datagrams (1 kB, one every `gap_s`) from rank 0 reach rank 1."""
    out, _ = _pair(links, _python(links, 1, _COUNT), _python(links, 0, _BLAST, links.address(1), n, gap_s),
                   timeout=60 + n * gap_s)
    return int(out)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
