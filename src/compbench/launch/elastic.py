"""Start an elastic job (engine.elastic=true) on this machine: the engine's own elastic launcher,
Horovod Elastic's driver (`spawn_horovod_elastic`) or TorchElastic's agents (`spawn_torch_elastic`).

Both tell machines apart by address and take a failed worker's machine out of the job. So that one
failure costs one worker, every worker gets a host of its own: the job runs in a private network
namespace (compbench.network.netem; shaped when net.emulate_gbps is set) whose loopback carries one address
per worker (visible nowhere else).

- Horovod: `horovodrun --min-np 1 --max-np N --host-discovery-script S` runs there, S printing the
  hosts file compbench keeps (127.0.1.1, 127.0.1.2, ...). Horovod's driver starts one worker per host,
  notices a worker that dies, and starts one on a host that appears.
- torch: one TorchElastic agent per host (`torchrun --nnodes=1:N --nproc-per-node=1 --rdzv-backend=c10d
  --local-addr 127.0.1.10k`), the first hosting the rendezvous store. An agent restarts its worker when
  the worker fails or another agent waits to join; an agent that is gone (its worker's kill takes it
  along: compbench.train.faults) leaves the rendezvous when its heartbeats stop. compbench sets the
  rendezvous' timings for one machine (a heartbeat a second, a machine dead after 3 missed, 2 s for
  late agents to join a round: TorchElastic's defaults, 5 s x 3 and 30 s, suit data centres) and
  turns off the rendezvous store's sharing with the workers (TORCH_DISABLE_SHARE_RDZV_TCP_STORE: in
  torch 2.13 a shared store never tells an agent that joins a later round where rank 0 is, and the
  joiner waits until its timeout).

compbench's engine.min_np is enforced by the workers themselves (compbench.train.elastic: they stop
with a checkpoint), so the engines' minimum is 1. `fault.rejoin_after_s` (or `_steps`,
compbench.train.faults): that long after a worker killed itself, a spare host joins (Horovod: the
hosts file gains it; torch: an agent starts there).

Horovod prefixes each worker's lines with its rank (`[1]<stdout>:`) and torch's agents log in glog's
form (`W1128 09:41:21.407000 ...`): compbench prints the workers' lines without either, a warning
every worker gives once, and the few driver lines worth a user's attention as `compbench:` lines.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from compbench.base.leftovers import scratch_dir
from compbench.launch.processes import (
    NODE_ENV,
    raise_interrupt,
    read_error,
    say_shaped_link,
    stop_processes,
    worker_env,
    worker_preexec,
)
from compbench.network.netem import ShapedNamespace
from compbench.records import fault_events

HOSTS = "127.0.1"  # the workers' addresses, inside the job's own namespace only
RejoinDue = Callable[[dict[str, Any]], bool]  # whether a kill event's replacement may join now
_PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
_DRIVER_NOTE = re.compile(r"^Process \d+ exit with status code")
# What a survivor's Horovod prints when a peer's connection drops: expected here, and recovered from.
_PEER_GONE = "Horovod background loop uncaught exception"


def spawn_elastic(engine: str, run_dir: Path, np: int, threads: int | None, gbps: float | None,
                  latency_us: float, rejoin_due: RejoinDue | None) -> tuple[int, str]:
    """Run RUN_DIR's job under `engine`'s elastic mode; returns (exit code, one-line failure message
    or '')."""
    spawn = spawn_horovod_elastic if engine == "horovod" else spawn_torch_elastic
    return spawn(run_dir, np, threads, gbps, latency_us, rejoin_due)


def spawn_horovod_elastic(run_dir: Path, np: int, threads: int | None, gbps: float | None, latency_us: float,
                          rejoin_due: RejoinDue | None) -> tuple[int, str]:
    """Run RUN_DIR's job under Horovod Elastic; returns (exit code, one-line failure message or '')."""
    spares = np if rejoin_due is not None else 0  # a replacement per kill, np of them at most
    hosts = [f"{HOSTS}.{k}" for k in range(1, np + spares + 1)]
    with _hosts_namespace("Horovod Elastic", "workers", hosts, np, gbps, latency_us) as (ns, scratch):
        hostfile = Path(scratch, "hosts")
        _write_hosts(hostfile, hosts[:np])
        script = Path(scratch, "discover.sh")
        script.write_text(f"#!/bin/sh\ncat {hostfile}\n")
        script.chmod(0o755)
        env = worker_env(np, threads, Path(scratch, "error"), {})
        cmd = [*ns.prefix, sys.executable, "-m", "horovod.runner.launch", "-np", str(np), "--min-np", "1",
               "--max-np", str(np), "--host-discovery-script", str(script), "--network-interface", "lo",
               sys.executable, "-m", "compbench.train.worker", str(run_dir)]
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=worker_preexec(os.getpid(), hold_sigint=False))
        done = threading.Event()
        if rejoin_due is not None:
            def offer(count: int) -> None:  # a dead worker's host stays listed: Horovod blacklisted it
                _write_hosts(hostfile, hosts[: np + count])

            threading.Thread(target=_rejoin, args=(run_dir, spares, rejoin_due, offer, done),
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


@contextlib.contextmanager
def _hosts_namespace(launcher: str, processes: str, hosts: list[str], np: int, gbps: float | None,
                     latency_us: float) -> Iterator[tuple[ShapedNamespace, str]]:
    """The job's private namespace (shaped to np x gbps) with every host's address, and a scratch
    folder; one line says where the launcher's processes run."""
    with ShapedNamespace(gbps * np if gbps is not None else None, latency_us) as ns, \
            scratch_dir() as scratch:
        ns.add_addresses(hosts)
        if gbps is not None:
            say_shaped_link(ns.name, gbps, np, latency_us)
        print(f"compbench: elastic job ({launcher}), {processes} on hosts {', '.join(hosts[:np])} of "
              f"network namespace {ns.name}", flush=True)
        yield ns, scratch


def spawn_torch_elastic(run_dir: Path, np: int, threads: int | None, gbps: float | None, latency_us: float,
                        rejoin_due: RejoinDue | None) -> tuple[int, str]:
    """Run RUN_DIR's job on TorchElastic agents; returns (exit code, one-line failure message or '')."""
    spares = np if rejoin_due is not None else 0
    # Three-digit host numbers: TorchElastic ranks the agents by their address as text, so rank 0 is
    # the first agent's worker as long as it lives (and the spares' come after).
    hosts = [f"{HOSTS}.{100 + k}" for k in range(1, np + spares + 1)]
    job = f"compbench-{os.getpid()}-{secrets.token_hex(3)}"  # the rendezvous id (commits carry it)
    with _hosts_namespace("TorchElastic", "agents", hosts, np, gbps, latency_us) as (ns, scratch):
        agents: list[subprocess.Popen] = []
        printing: list[threading.Thread] = []  # rank 0's agent's: its last lines are the run's summary
        seen: set[str] = set()
        ending = threading.Event()  # the launcher has its verdict: the agents' last words are not news

        def start(k: int) -> None:
            conf = f"is_host={int(k == 0)},{_TORCH_RDZV_TIMINGS}"
            cmd = [*ns.prefix, sys.executable, "-m", "torch.distributed.run", f"--nnodes=1:{np}",
                   "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts[0]}:{_TORCH_PORT}",
                   f"--rdzv-id={job}", f"--rdzv-conf={conf}", f"--local-addr={hosts[k]}",
                   f"--max-restarts={_TORCH_MAX_RESTARTS}", "--monitor-interval=0.2",
                   "-m", "compbench.train.worker", str(run_dir)]
            env = worker_env(np, threads, Path(scratch, f"error.{k}"),
                             {NODE_ENV: f"node{k + 1}", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                              "GLOO_SOCKET_IFNAME": "lo"})
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=worker_preexec(os.getpid(), hold_sigint=False))
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                thread = threading.Thread(target=_forward_agent, args=(stream, out, seen, ending),
                                          daemon=True)
                thread.start()
                if k == 0:
                    printing.append(thread)
            agents.append(proc)

        previous = signal.signal(signal.SIGTERM, raise_interrupt)
        done = threading.Event()
        try:
            for k in range(np):
                start(k)
            if rejoin_due is not None:
                threading.Thread(target=_rejoin, args=(run_dir, spares, rejoin_due,
                                                       lambda count: start(np + count - 1), done),
                                 daemon=True).start()
            code, message = _watch_agents(agents, Path(scratch))
            if code == 0:
                for thread in printing:  # to the end of its output (the pipe closes with the agent)
                    thread.join(timeout=_OUTPUT_WAIT_S)
            return code, message
        except KeyboardInterrupt:
            stop_processes(list(agents), signal.SIGINT)
            return 130, "interrupted: all workers stopped"
        finally:
            done.set()
            ending.set()
            signal.signal(signal.SIGTERM, previous)
            stop_processes(list(agents))


_OUTPUT_WAIT_S = 10.0  # for rank 0's last lines once its agent has ended
_TORCH_PORT = 29400  # TorchElastic's own default, free in the job's private namespace
# Restarts after a lost peer only: the launcher ends the job at a worker's first error line.
_TORCH_MAX_RESTARTS = 100
_TORCH_RDZV_TIMINGS = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=2"
# torch's own logging, and the C++ stack of a rendezvous store an agent finds closed as the job ends
_AGENT_NOISE = re.compile(r"^(\[?[IWEF]\d{4} \d\d:\d\d:\d\d|frame #\d+: |Exception raised from |"
                          r"<omitting python frames>|\s*$)")


def _watch_agents(agents: list[subprocess.Popen], scratch: Path) -> tuple[int, str]:
    """Until rank 0's agent (the first) ends, or a worker writes its error line (a user's error, a
    run below engine.min_np, a crash: anything but a lost peer, which its agent recovers from)."""
    while True:
        code = agents[0].poll()
        said = next((line for f in sorted(scratch.glob("error.*")) if (line := read_error(f))), "")
        if said:
            return 1, said
        if code is not None:
            return (0, "") if code == 0 else (1, f"the elastic job failed (torchrun: code {code})")
        time.sleep(0.2)


def _forward_agent(stream: Any, out: Any, seen: set[str], ending: threading.Event) -> None:
    """Print an agent's lines as a local job's: its worker's output, each warning once, none of the
    agent's own logging."""
    for line in stream:
        line = line.rstrip("\n")
        if out is sys.stderr:
            if ending.is_set() or _AGENT_NOISE.match(line) or line in seen:
                continue
            seen.add(line)
        print(line, file=out, flush=True)


def _write_hosts(path: Path, hosts: list[str]) -> None:
    """The hosts file the discovery script prints (replaced whole: the driver never reads half)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)


def _rejoin(run_dir: Path, spares: int, due: RejoinDue, offer: Callable[[int], None],
            done: threading.Event) -> None:
    """`offer(k)`: bring in the k-th spare host once the k-th injected kill is `due` for a replacement
    (compbench.train.faults.FaultPlan.rejoin_due; not imported: launch stands below train)."""
    offered = 0
    while not done.wait(0.2) and offered < spares:
        kills = [e for e in fault_events.read_events(run_dir) if e["event"] == "kill"]
        ready = min(sum(due(e) for e in kills), spares)
        while offered < ready:
            offered += 1
            offer(offered)


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
