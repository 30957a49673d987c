"""`compbench cluster up|down|status|run`: an emulated cluster of K machines on this one (see nodes.py).

  compbench cluster up --nodes 2 --gbps 1 [--latency-us 50]   build it (until `down`)
  compbench cluster run -- horovodrun -np 2 -H n1:1,n2:1 compbench train ...   on node n1
  compbench cluster run --each -- torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
      --rdzv-endpoint n1:29400 -m compbench train engine=torch ...           on every node at once
  compbench cluster run --each --elastic -- torchrun --nnodes 1:2 ... engine.elastic=true ...
                                          the job goes on without a node whose command fails
  compbench cluster down

`run` without a cluster up builds one from --nodes/--gbps/--latency-us for the command and removes
it afterwards (also on failure and Ctrl-C). When a command fails on one node, the others are stopped
and one `error:` line names the node; with --elastic (an elastic job, whose engine goes on without a
lost machine) a node other than n1 may fail, and the run is n1's: it ends when n1's command ends,
with its exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil

from compbench.base.args import ArgumentParser, decimal, whole
from compbench.base.errors import INTERRUPTED_EXIT
from compbench.cluster import nodes
from compbench.cluster.nodes import Cluster
from compbench.launch.processes import raise_interrupt, worker_preexec
from compbench.network.delay import has_tun
from compbench.network.netem import check_buffer, check_delay, check_rate

_GRACE_S = 10.0


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="compbench cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    for name in ("up", "run"):
        s = sub.add_parser(name)
        s.add_argument("--nodes", type=whole, default=2, help="emulated machines (default 2)")
        s.add_argument("--gbps", default="10",
                       help="node link, Gbit/s each way (default 10), or one per node: --gbps 1,1,0.1")
        s.add_argument("--latency-us", type=decimal, default=0.0,
                       help="one-way delay between two nodes, microseconds (netem, or compbench's delay line "
                            "where the kernel has none)")
    run = sub.choices["run"]
    run.add_argument("--each", action="store_true", help="run the command on every node at once")
    run.add_argument("--elastic", action="store_true",
                     help="with --each: a node other than n1 whose command fails leaves the others running")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS")
    sub.add_parser("down")
    sub.add_parser("status")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    wanted = _wanted(args) if args.action in ("up", "run") else None  # the values first, then the machine
    nodes.check_machine()
    if args.action == "down":
        gone = nodes.remove()
        print(f"cluster: removed {len(gone)} namespace(s)" if gone else "cluster: none was up")
        return 0
    from compbench.base.leftovers import remove_stale

    remove_stale()  # what dead runs left: their namespaces and folders, a cluster whose owner died
    current = nodes.load()
    if nodes.is_orphaned(current):
        nodes.remove()  # half-built, or its owner was killed
        current = None
    if args.action == "status":
        print(_describe(current) if current else "cluster: none is up")
        return 0
    assert wanted is not None
    if args.action == "up":
        if current is not None:
            raise ValueError(f"a cluster is up already ({_describe(current)}); "
                             f"run `compbench cluster down` first")
        nodes.create(wanted)
        print(_describe(wanted))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ValueError("compbench cluster run needs a command after --, e.g. -- hostname")
    # `kill` of this process removes the cluster it built, as Ctrl-C does.
    signal.signal(signal.SIGTERM, raise_interrupt)
    with _cluster_for_run(current, wanted) as cluster:
        return _run_on(cluster, command, range(1, cluster.nodes + 1) if args.each else [1], args.elastic)


def _wanted(args: argparse.Namespace) -> Cluster:
    if args.action == "run" and args.elastic and not args.each:
        raise ValueError("--elastic is about commands on several nodes; add --each")
    if args.nodes < 1 or args.nodes > 250:
        raise ValueError(f"--nodes {args.nodes} must be 1..250")
    # The same ranges as a local job's shaped link (compbench.network.netem): finite, not NaN, not vanishing.
    rates = [check_rate("--gbps", _number(v)) for v in args.gbps.split(",")]
    if len(rates) not in (1, args.nodes):
        raise ValueError(f"--gbps {args.gbps} lists {len(rates)} rates for --nodes {args.nodes}; give one "
                         f"rate for every node, or one per node")
    gbps = rates[0] if len(rates) == 1 else rates
    cluster = Cluster(args.nodes, gbps, check_delay("--latency-us", args.latency_us))
    for rate in rates:  # each node's link, with the round trip nodes.py sizes its buffers for
        check_buffer(f"--gbps {rate:g} --latency-us {cluster.latency_us:g}", rate, 2 * cluster.latency_us,
                     "lower --gbps or --latency-us")
    if cluster.line and not has_tun():
        raise ValueError("--latency-us needs the kernel's netem or /dev/net/tun (compbench's delay line); "
                         "this machine has neither: drop --latency-us")
    return cluster


def _number(text: str) -> float | str:
    """A --gbps item as a decimal number (check_rate says what is wrong with one that is not: 1_0 too,
    which float() would read as 10)."""
    try:
        return decimal(text)
    except argparse.ArgumentTypeError:
        return text


def _describe(c: Cluster) -> str:
    hosts = ",".join(c.host(i) for i in range(1, c.nodes + 1))
    life = f"removed when pid {c.owner_pid} ends" if c.owner_pid else "until `compbench cluster down`"
    rates = (f"{c.gbps:g} Gbit/s" if not isinstance(c.gbps, list)
             else ", ".join(f"{c.host(i)} {c.rate(i):g}" for i in range(1, c.nodes + 1)) + " Gbit/s")
    return (f"cluster: {c.nodes} node(s) {hosts} at {rates} each way, {c.latency_us:g} us one-way "
            f"delay, addresses {c.address(1)}..{c.address(c.nodes)}; {life}")


@contextlib.contextmanager
def _cluster_for_run(current: Cluster | None, wanted: Cluster) -> Iterator[Cluster]:
    if current is not None:
        yield current  # the cluster that is up; its settings win over --nodes/--gbps
        return
    cluster = Cluster(wanted.nodes, wanted.gbps, wanted.latency_us, owner_pid=os.getpid())
    try:
        nodes.create(cluster)
        yield cluster
    finally:
        nodes.remove()


def _run_on(cluster: Cluster, command: list[str], on: range | list[int], elastic: bool = False) -> int:
    """Run `command` on the given nodes; the first to fail stops the rest (`elastic`: n1's end stops
    the rest, another node's failure is noted). Returns the failed node's exit code (or 0)."""
    procs: dict[int, subprocess.Popen] = {}
    try:
        # Each command answers Ctrl-C (a job started from a background shell has SIGINT ignored) and
        # dies with this process (SIGKILL included); what it started on the nodes goes with the
        # cluster's namespaces (its reaper: compbench.base.reaper).
        preexec = worker_preexec(os.getpid(), hold_sigint=False)
        for i in on:
            procs[i] = subprocess.Popen([*cluster.exec_prefix(i), *command], preexec_fn=preexec)
        while procs:
            for i, p in list(procs.items()):
                code = p.poll()
                if code is None:
                    continue
                del procs[i]
                if elastic and i != 1 and code != 0:
                    print(f"cluster: `{os.path.basename(command[0])}` on node {cluster.host(i)} "
                          f"{_how(code)}; the job goes on without it (--elastic)", file=sys.stderr,
                          flush=True)
                    continue
                if elastic and i == 1 and code == 0:
                    _stop(procs.values(), after_s=_GRACE_S)  # the job is done: what is left only lingers
                    return 0
                if code != 0:
                    # The other nodes usually fail on their own at once (a peer is gone) and say
                    # so in their own words; they are stopped only if they linger.
                    _stop(procs.values(), after_s=_GRACE_S)
                    print(f"error: `{os.path.basename(command[0])}` on node {cluster.host(i)} {_how(code)}; "
                          f"stopped the job on every node", file=sys.stderr, flush=True)
                    return code if code > 0 else 128 - code
            time.sleep(0.1)
        return 0
    except KeyboardInterrupt:
        _stop(procs.values(), signal.SIGINT)
        print("error: interrupted by Ctrl-C; stopped the job on every node", file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    finally:
        _stop(procs.values())


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"


def _stop(procs, sig: int = signal.SIGTERM, after_s: float = 0.0) -> None:
    """Signal each command still running after `after_s` and all its descendants (torchrun starts
    its workers in sessions of their own, which a process-group signal would miss), then SIGKILL
    what is left after a grace period."""
    deadline = time.monotonic() + after_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    tree = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(p.pid)
            tree += [root, *root.children(recursive=True)]
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)
    _, alive = psutil.wait_procs(tree, timeout=_GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=_GRACE_S)
    for p in procs:
        p.poll()  # reap
