"""Start an elastic job (engine.elastic=true) on this machine: Horovod Elastic's own driver.

Horovod Elastic tells workers apart by host and takes a failed worker's whole host out of the job
(it blacklists it). So that one failure costs one worker, every worker gets a host of its own: the
job runs in a private network namespace (compbench.netem; shaped when net.emulate_gbps is set)
whose loopback carries the addresses 127.0.1.1, 127.0.1.2, ... (one per worker, visible nowhere
else), and `horovodrun --min-np 1 --max-np N --host-discovery-script S` runs there, S printing the
hosts file compbench keeps. Horovod's driver then starts one worker per host, notices a worker that
dies, and starts one on a host that appears; compbench's engine.min_np is enforced by the workers
themselves (compbench.train.elastic: they stop with a checkpoint), so the driver's minimum is 1.

`fault.rejoin_after_s` (compbench.train.faults): that many seconds after a worker killed itself
the hosts file gains a spare host, where Horovod starts a replacement, which joins at the
survivors' next commit.

Horovod prefixes each worker's lines with its rank (`[1]<stdout>:`): compbench prints them without
it, and a warning every worker gives once. The driver's own lines about a worker that ended go to
the user as `compbench:` lines.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from compbench.launch import (
    SCRATCH_PREFIX,
    raise_interrupt,
    read_error,
    say_shaped_link,
    stop_processes,
    worker_env,
    worker_preexec,
)
from compbench.netem import ShapedNamespace
from compbench.train import faults

HOSTS = "127.0.1"  # the workers' addresses, inside the job's own namespace only
_PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
_DRIVER_NOTE = re.compile(r"^Process \d+ exit with status code")
# What a survivor's Horovod prints when a peer's connection drops: expected here, and recovered from.
_PEER_GONE = "Horovod background loop uncaught exception"


def spawn_elastic(run_dir: Path, np: int, threads: int | None, gbps: float | None, latency_us: float,
                  rejoin_after_s: float | None) -> tuple[int, str]:
    """Run RUN_DIR's job under Horovod Elastic; returns (exit code, one-line failure message or '')."""
    spares = np if rejoin_after_s is not None else 0  # a replacement per kill, np of them at most
    hosts = [f"{HOSTS}.{k}" for k in range(1, np + spares + 1)]
    with ShapedNamespace(gbps * np if gbps is not None else None, latency_us) as ns, \
            tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX) as scratch:
        ns.add_addresses(hosts)
        hostfile = Path(scratch, "hosts")
        _write_hosts(hostfile, hosts[:np])
        script = Path(scratch, "discover.sh")
        script.write_text(f"#!/bin/sh\ncat {hostfile}\n")
        script.chmod(0o755)
        if gbps is not None:
            say_shaped_link(ns.name, gbps, np, latency_us)
        print(f"compbench: elastic job (Horovod Elastic), workers on hosts {', '.join(hosts[:np])} of "
              f"network namespace {ns.name}", flush=True)
        env = worker_env(np, threads, Path(scratch, "error"), {})
        cmd = [*ns.prefix, sys.executable, "-m", "horovod.runner.launch", "-np", str(np), "--min-np", "1",
               "--max-np", str(np), "--host-discovery-script", str(script), "--network-interface", "lo",
               sys.executable, "-m", "compbench.worker", str(run_dir)]
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=worker_preexec(os.getpid(), hold_sigint=False))
        done = threading.Event()
        if rejoin_after_s is not None:
            threading.Thread(target=_rejoin, args=(run_dir, hostfile, hosts, np, rejoin_after_s, done),
                             daemon=True).start()
        try:
            last = _forward(proc)
            code = proc.wait()
        except KeyboardInterrupt:
            stop_processes([proc], signal.SIGINT)
            return 130, "interrupted: all workers stopped"
        finally:
            done.set()
            signal.signal(signal.SIGTERM, previous)
            stop_processes([proc])
        if code == 0:
            return 0, ""
        # 1 whatever the worker said: horovodrun does not pass a worker's exit code on
        said = read_error(Path(scratch, "error"))
        return 1, said or f"the elastic job failed (horovodrun: code {code}, {last})"


def _write_hosts(path: Path, hosts: list[str]) -> None:
    """The hosts file the discovery script prints (replaced whole: the driver never reads half)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)


def _rejoin(run_dir: Path, hostfile: Path, hosts: list[str], np: int, after_s: float,
            done: threading.Event) -> None:
    """Offer a spare host `after_s` seconds after each injected kill (a dead worker's host stays
    listed: Horovod has blacklisted it)."""
    offered = 0
    while not done.wait(0.2) and offered < len(hosts) - np:
        kills = [e for e in faults.read_events(run_dir) if e["event"] == "kill"]
        due = min(sum(time.time() >= e["time"] + after_s for e in kills), len(hosts) - np)
        if due > offered:
            offered = due
            _write_hosts(hostfile, hosts[: np + offered])


def _forward(proc: subprocess.Popen) -> str:
    """Print the job's lines as a local job's: without Horovod's rank prefix, each warning once.
    Returns the driver's last line of its own (its error, when it fails)."""
    assert proc.stdout is not None
    seen: set[str] = set()
    last = ""
    for line in proc.stdout:
        line = line.rstrip("\n")
        m = _PREFIX.match(line)
        if m is None:
            last = line.strip() or last
            if _DRIVER_NOTE.match(line):  # a worker ended: the one driver line worth showing
                print(f"compbench: horovodrun: {line}", flush=True)
            continue
        _, stream, text = m.groups()
        if stream == "stdout":
            print(text, flush=True)
        elif _PEER_GONE in text:
            print("compbench: a collective failed (a worker is gone); Horovod Elastic recovers", flush=True)
        elif text not in seen:
            seen.add(text)
            print(text, file=sys.stderr, flush=True)
    return last
