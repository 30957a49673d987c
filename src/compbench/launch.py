"""Start N workers on this machine, or join a job started by an external launcher.

compbench composes the config once, in the parent, then starts `engine.np` worker processes
(`python -m compbench.worker RUN_DIR`) with the environment their engine expects: a Horovod Gloo
rendezvous server (as horovodrun starts) or a torch.distributed file store (no ports to collide).
The parent watches them: when one dies, the others are stopped and the lost rank is named; Ctrl-C
stops them all.

Under horovodrun / torchrun the environment already describes the job and compbench runs the
worker in-process instead: that is the multi-machine path.

With `net.emulate_gbps` (root only) the workers, and Horovod's rendezvous server, run inside a
private network namespace whose loopback is shaped (compbench.netem); it is deleted when the job
ends, also on failure or Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from compbench.netem import ShapedNamespace

# How long survivors get to exit after SIGTERM before SIGKILL.
_GRACE_S = 10.0


def external_engine() -> str | None:
    """The engine an external launcher set up, if any."""
    if "HOROVOD_RANK" in os.environ:
        return "horovod"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torch"
    return None


def _horovod_envs(np: int, netns: ShapedNamespace | None = None) -> tuple[list[dict[str, str]], object]:
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_slot_env_vars
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(False)
    # Workers in a shaped namespace reach 127.0.0.1 of that namespace: the server's socket must be
    # opened there (a socket belongs to the namespace it was created in).
    port = netns.call(server.start) if netns is not None else server.start()
    slots = get_host_assignments(parse_hosts(f"localhost:{np}"), np)
    server.init(slots)
    common = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "lo",
    }
    return [{**common, **create_slot_env_vars(s)} for s in slots], server


def _torch_envs(np: int, store_dir: str) -> list[dict[str, str]]:
    init = f"file://{store_dir}/store"
    return [
        {"COMPBENCH_INIT_METHOD": init, "RANK": str(r), "WORLD_SIZE": str(np), "LOCAL_RANK": str(r),
         "LOCAL_WORLD_SIZE": str(np)}
        for r in range(np)
    ]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(procs: list[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
    deadline = time.monotonic() + _GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def spawn_workers(run_dir: Path, engine: str, np: int, threads: int | None = None) -> tuple[int, str]:
    """Run `np` workers on RUN_DIR's config; returns (exit code, one-line failure message or '').
    The config's `net.emulate_gbps` / `net.emulate_latency_us` put them on a shaped link."""
    from omegaconf import OmegaConf

    from compbench.netem import shaped

    net = OmegaConf.load(run_dir / ".hydra" / "config.yaml").get("net") or {}
    gbps, latency_us = net.get("emulate_gbps"), net.get("emulate_latency_us") or 0
    argv = [sys.executable, "-m", "compbench.worker", str(run_dir)]
    with shaped(gbps, np, latency_us) as ns:
        if ns is not None:
            delay = f", {latency_us:g} us one-way delay" if latency_us else ""
            print(f"compbench: shaped link {gbps:g} Gbit/s per worker ({np} x {gbps:g} on the loopback of "
                  f"network namespace {ns.name}{delay})", flush=True)
        return run_processes(argv, engine, np, threads, netns=ns)


def run_processes(argv: list[str], engine: str, np: int, threads: int | None = None,
                  netns: ShapedNamespace | None = None) -> tuple[int, str]:
    """Run `argv` as `np` ranks of an `engine` job on this machine and watch them. With `netns`
    (a `compbench.netem.ShapedNamespace`) every rank runs inside it (`ip netns exec NAME argv`)."""
    server = None
    with tempfile.TemporaryDirectory(prefix="compbench-") as store_dir:
        if engine == "horovod":
            envs, server = _horovod_envs(np, netns)
        else:
            envs = _torch_envs(np, store_dir)
        # One compute thread per worker unless told otherwise: ranks share this machine's cores.
        nthreads = str(threads or max(1, (os.cpu_count() or 1) // np))
        procs = []
        # The namespace has nothing but its loopback: gloo must not look up the host's address.
        extra = {"GLOO_SOCKET_IFNAME": "lo"} if netns is not None else {}
        cmd = [*netns.prefix, *argv] if netns is not None else argv
        # `kill` of the launcher stops the job like Ctrl-C does, instead of orphaning the workers.
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            for env in envs:
                # THP: a fresh 100 MB CPU tensor costs ~40 ms of page faults without, ~6 ms with.
                full = {"THP_MEM_ALLOC_ENABLE": "1", **os.environ, **env, **extra,
                        "OMP_NUM_THREADS": nthreads, "COMPBENCH_THREADS": nthreads}
                procs.append(subprocess.Popen(cmd, env=full))
            return _watch(procs)
        except KeyboardInterrupt:
            _stop(procs, signal.SIGINT)
            return 130, "interrupted: all workers stopped"
        finally:
            signal.signal(signal.SIGTERM, previous)
            _stop(procs)
            if server is not None:
                server.stop()


def _watch(procs: list[subprocess.Popen]) -> tuple[int, str]:
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                _stop(procs)
                # Exit code 2 is a user error the worker already explained on stderr.
                return (2 if code == 2 else 1), f"worker rank {rank} {_describe(code)}; all workers stopped"
        if all(c == 0 for c in codes):
            return 0, ""
        time.sleep(0.1)
