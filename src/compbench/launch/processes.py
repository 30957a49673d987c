"""Start N workers on this machine, or join a job started by an external launcher.

compbench composes the config once, in the parent, then starts `engine.np` worker processes
(`python -m compbench.train.worker RUN_DIR`) with the environment their engine expects: a Horovod Gloo
rendezvous server (as horovodrun starts) or a torch.distributed file store (no ports to collide).
The parent watches them: when one dies, the others are stopped and the lost rank is named; Ctrl-C
stops them all.

Local jobs stay local: Horovod's rendezvous server listens on 127.0.0.1 only (horovod's own binds
every interface, unauthenticated, and answers HEAD requests for files in the working directory).
Workers die with the parent (PR_SET_PDEATHSIG), so a SIGKILLed launcher leaves no training
orphans; its scratch folder (`$TMPDIR/compbench-*`, the torch file store) and namespaces are removed
by its reaper (compbench.base.reaper), else by the next launch or `compbench clean`. A worker's
`error:` line goes to a file the parent reads, so the user sees it once (not once per rank).

Under horovodrun / torchrun the environment already describes the job and compbench runs the
worker in-process instead: that is the multi-machine path.

With `net.emulate_gbps` (root only) the workers, and Horovod's rendezvous server, run inside a
private network namespace whose loopback is shaped (compbench.network.netem); with `net.emulate_rank_gbps`
each worker runs in a namespace of its own, on a link of its own rate (the rendezvous in rank 0's).
They are deleted when the job ends, also on failure or Ctrl-C.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from compbench.base.errors import ERROR_FILE_ENV, PEER_LOST_EXIT

if TYPE_CHECKING:
    from compbench.network.netem import RankLinks, ShapedNamespace

    Placement = ShapedNamespace | RankLinks  # where a local job's workers run (compbench.network.netem)

# How long survivors get to exit after SIGTERM before SIGKILL.
_GRACE_S = 10.0
# Each TorchElastic agent's machine name, for its worker's commit file (compbench.train.elastic_torch):
# the agents of a job on one machine share its host name.
NODE_ENV = "COMPBENCH_ELASTIC_NODE"


def external_engine() -> str | None:
    """The engine an external launcher set up, if any."""
    if "HOROVOD_RANK" in os.environ:
        return "horovod"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torch"
    return None


class LoopbackRendezvous:
    """Horovod's Gloo rendezvous (the key-value store every rank meets at), on 127.0.0.1 only (or, for
    workers on links of their own, on rank 0's address inside the job's namespaces).

    horovod's RendezvousServer binds ('', port): every interface, no authentication, for the whole
    run; from another machine one can read and write its keys, abort the job and (its handler is a
    SimpleHTTPRequestHandler) probe files in the working directory with HEAD. Same handler and store
    here, bound to the loopback on a port the kernel picks, with HEAD refused (Gloo's HTTP store uses
    only GET, PUT and DELETE).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._httpd: Any = None  # horovod's RendezvousHTTPServer (untyped)
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Open the socket (call it inside a network namespace to listen there) and serve; the port."""
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        class Handler(RendezvousHandler):
            def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
                self.send_error(405)

        self._httpd = RendezvousHTTPServer((self.host, 0), Handler, 0)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self._httpd.server_address[1]

    def init(self, slots: list) -> None:
        self._httpd.init(slots)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        assert self._thread is not None  # started by start()
        self._thread.join()


def _horovod_envs(np: int, netns: Placement | None = None) -> tuple[list[dict[str, str]], LoopbackRendezvous]:
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_slot_env_vars

    server = LoopbackRendezvous(netns.host if netns is not None else "127.0.0.1")
    # Workers in a shaped namespace reach the server there: its socket must be opened in that
    # namespace (a socket belongs to the namespace it was created in).
    port = netns.call(server.start) if netns is not None else server.start()
    # Workers on links of their own are hosts of their own (Horovod resolves a host's name for some of
    # its connections: "localhost" would send them to a loopback where no peer listens).
    own = netns.hosts if netns is not None else ()
    hosts = ",".join(f"{h}:1" for h in own) if own else f"localhost:{np}"
    slots = get_host_assignments(parse_hosts(hosts), np)
    server.init(slots)
    common = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": server.host,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": netns.iface if netns is not None else "lo",
    }
    return [{**common, **create_slot_env_vars(s)} for s in slots], server


def _torch_envs(np: int, store_dir: str) -> list[dict[str, str]]:
    init = f"file://{store_dir}/store"
    return [
        {"COMPBENCH_INIT_METHOD": init, "RANK": str(r), "WORLD_SIZE": str(np), "LOCAL_RANK": str(r),
         "LOCAL_WORLD_SIZE": str(np)}
        for r in range(np)
    ]


def raise_interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: stop as Ctrl-C does (the `except KeyboardInterrupt` clean-up runs)."""
    raise KeyboardInterrupt


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def worker_preexec(parent: int, hold_sigint: bool) -> Callable[[], None]:
    """Run in each worker between fork and exec: die with the launcher, answer Ctrl-C.

    SIGKILL of the launcher cannot be caught, so the kernel must stop the workers
    (PR_SET_PDEATHSIG; it survives exec). SIGINT is reset to its default: a launcher started in the
    background (`cmd &`) ignores it and its children would inherit that, so stopping them with
    SIGINT would wait out the grace period. `hold_sigint` also blocks it (the mask survives exec):
    a Ctrl-C that arrives while the interpreter starts stays pending until compbench.train.worker has
    installed its handler and unblocks it, instead of a KeyboardInterrupt traceback from start-up.
    """
    _libc()  # loaded before the fork: dlopen is not safe between fork and exec with threads running

    def preexec() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if hold_sigint:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        die_with_parent(parent)

    return preexec


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when its parent `parent` ends (PR_SET_PDEATHSIG);
    ends at once if that parent is gone already."""
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def die_with_process(pid: int) -> None:
    """SIGKILL this process once process `pid` ends (at once if it has), whichever thread of `pid`
    started it. For a process a pool started (a launcher plugin's loky workers): PR_SET_PDEATHSIG
    fires when the thread that forked the child ends, and which of the pool's threads that was is the
    pool's business. A daemon thread waits on a pidfd of `pid`; once per process and pid."""
    from compbench.base.reaper import wait_for

    key = (os.getpid(), pid)
    if key in _dying_with:
        return
    _dying_with.add(key)

    def watch() -> None:
        wait_for(pid)
        os.kill(os.getpid(), signal.SIGKILL)  # its own children follow (PR_SET_PDEATHSIG)

    threading.Thread(target=watch, name=f"die-with-{pid}", daemon=True).start()


_dying_with: set[tuple[int, int]] = set()


def stop_processes(procs: list[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
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
    The config's `net.emulate_gbps` (or `net.emulate_rank_gbps`) and `net.emulate_latency_us` (or
    `net.emulate_rank_latency_us`) put them on a shaped link (or a link each); `net.trace` on a link
    each that changes over time (compbench.network.trace_player)."""
    from omegaconf import DictConfig, OmegaConf

    from compbench.network.delay import from_config
    from compbench.network.netem import RankLinks, shaped

    cfg = cast(DictConfig, OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
    net = cfg.get("net") or {}
    gbps, latency_us = net.get("emulate_gbps"), net.get("emulate_latency_us") or 0
    argv = [sys.executable, "-m", "compbench.train.worker", str(run_dir)]
    trace = net.get("trace")
    if trace is not None:  # a link per worker, replayed from a trace (checked: no emulate_*)
        from compbench.network.trace_player import traced

        with traced(str(trace), np, int(cfg.get("seed") or 0), run_dir) as traced_links:
            return run_processes(argv, engine, np, threads, netns=traced_links, hold_sigint=True)
    rank_gbps = net.get("emulate_rank_gbps")
    # compbench's delay line runs between links of their own: a shaped loopback takes a link per worker
    impairment = from_config(net, int(cfg.get("seed") or 0))
    if rank_gbps is None and impairment.line:
        rank_gbps = [gbps] * np
    if rank_gbps is not None:
        rank_latency = list(impairment.rank_latency_us) or None
        with RankLinks(list(rank_gbps), latency_us, line=impairment, rank_latency_us=rank_latency) as links:
            rates = ", ".join(f"rank {k} {g:g}" for k, g in enumerate(links.gbps))
            how = " through compbench's delay line" if impairment.line else ""
            extra = "".join([f" +- {impairment.jitter_us:g} us" if impairment.jitter_us else "",
                             f", {impairment.loss:g} loss" if impairment.loss else ""])
            one_way = (f"{latency_us:g} us one-way delay" if not rank_latency else
                       "one-way delays of " + ", ".join(f"rank {k} {d:g}" for k, d in enumerate(rank_latency))
                       + " us per link")
            delayed = latency_us or rank_latency or impairment.loss
            delay = f", {one_way}{extra}{how}" if delayed else ""
            print(f"compbench: a link per worker ({rates} Gbit/s each way{delay}; network namespaces "
                  f"{links.switch} and its ranks')", flush=True)
            return run_processes(argv, engine, np, threads, netns=links, hold_sigint=True)
    with shaped(gbps, np, latency_us) as ns:
        if ns is not None and gbps is not None:  # one without the other: never (shaped)
            say_shaped_link(ns.name, gbps, np, latency_us)
        return run_processes(argv, engine, np, threads, netns=ns, hold_sigint=True)


def say_shaped_link(namespace: str, gbps: float, np: int, latency_us: float) -> None:
    delay = f", {latency_us:g} us one-way delay" if latency_us else ""
    print(f"compbench: shaped link {gbps:g} Gbit/s per worker ({np} x {gbps:g} on the loopback of "
          f"network namespace {namespace}{delay})", flush=True)


def worker_env(np: int, threads: int | None, error_file: Path, job: dict[str, str]) -> dict[str, str]:
    """A local worker's environment: this process's, the job's (`job`: its rendezvous, its rank),
    one compute thread per worker unless told otherwise (ranks share this machine's cores), and the
    file where the worker writes its `error:` line."""
    nthreads = str(threads or max(1, (os.cpu_count() or 1) // np))
    # THP: a fresh 100 MB CPU tensor costs ~40 ms of page faults without, ~6 ms with.
    return {"THP_MEM_ALLOC_ENABLE": "1", **os.environ, **job, "OMP_NUM_THREADS": nthreads,
            "COMPBENCH_THREADS": nthreads, ERROR_FILE_ENV: str(error_file)}


def run_processes(argv: list[str], engine: str, np: int, threads: int | None = None,
                  netns: Placement | None = None, hold_sigint: bool = False) -> tuple[int, str]:
    """Run `argv` as `np` ranks of an `engine` job on this machine and watch them. With `netns`
    (compbench.network.netem's ShapedNamespace or RankLinks) each rank runs in its namespace there."""
    from compbench.base.leftovers import remove_stale, scratch_dir

    server: LoopbackRendezvous | None = None
    remove_stale()  # what a dead run left (SIGKILLed with its reaper)
    with scratch_dir() as store_dir:
        if engine == "horovod":
            envs, server = _horovod_envs(np, netns)
        else:
            envs = _torch_envs(np, store_dir)
        procs = []
        # One machine: torch's gloo listens on the loopback only (by default it binds the host's
        # address, reachable from other machines; in a shaped namespace there is nothing else), or
        # on the rank's own link.
        extra = {"GLOO_SOCKET_IFNAME": netns.iface if netns is not None else "lo"}
        # `kill` of the launcher stops the job like Ctrl-C does, instead of orphaning the workers.
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
        try:
            for rank, env in enumerate(envs):
                full = worker_env(np, threads, Path(store_dir) / f"error.{rank}", {**env, **extra})
                preexec = worker_preexec(os.getpid(), hold_sigint)
                cmd = [*netns.prefix_for(rank), *argv] if netns is not None else argv
                procs.append(subprocess.Popen(cmd, env=full, preexec_fn=preexec))
            return _watch(procs, Path(store_dir), netns.failure if netns is not None else None)
        except KeyboardInterrupt:
            stop_processes(procs, signal.SIGINT)
            return 130, "interrupted: all workers stopped"
        finally:
            signal.signal(signal.SIGTERM, previous)
            stop_processes(procs)
            if server is not None:
                server.stop()


_CAUSE_WAIT_S = 2.0


def _watch(procs: list[subprocess.Popen], errors: Path,
           link_failure: Callable[[], str | None] | None = None) -> tuple[int, str]:
    """Wait for the workers; on the first failure stop the rest. The message is the failed
    worker's own `error:` text when it wrote one (see compbench.base.errors), else how it ended.
    `link_failure` says why the links can no longer carry the job (a delay line that ended): the
    workers would wait on their collectives until a timeout, so they are stopped at once."""
    cause_deadline = None
    while True:
        broken = link_failure() if link_failure is not None else None
        if broken:
            stop_processes(procs)
            return 1, broken
        codes = [p.poll() for p in procs]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        # A worker that lost a peer is a consequence: report the peer's own failure (it is seen
        # within moments: killed, or its error), unless none shows up.
        cause = [f for f in failed if f[1] != PEER_LOST_EXIT]
        if failed and not cause and cause_deadline is None:
            cause_deadline = time.monotonic() + _CAUSE_WAIT_S
        if cause or (failed and cause_deadline is not None and time.monotonic() > cause_deadline):
            rank, code = (cause or failed)[0]
            stop_processes(procs)
            said = read_error(errors / f"error.{rank}")
            # Exit code 2 is a user error (a ValueError the worker explained).
            return ((2 if code == 2 else 1),
                    said or f"worker rank {rank} {_describe(code)}; all workers stopped")
        if all(c == 0 for c in codes):
            return 0, ""
        time.sleep(0.1)


def read_error(path: Path) -> str:
    try:
        return path.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        return ""
