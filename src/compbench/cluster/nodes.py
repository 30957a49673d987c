"""K emulated machines on this one: network namespaces `cbcl-n1..nK` joined by a bridge that lives in
its own namespace `cbcl-sw`, each node's link shaped with tc, each node running an sshd.

Layout (nothing outside these namespaces is touched but the files named here):
- node i: namespace `cbcl-n<i>`, interface `eth0` with 10.213.7.<i>/24 (veth to the switch), its own
  loopback up and unshaped (intra-node traffic), and a hostname `n<i>` of its own (a UTS namespace
  per command, see `exec_prefix`) that every node's /etc/hosts resolves to its address.
- the link of node i carries `gbps` Gbit/s each way (or a rate of its own: `--gbps 1,0.1`): HTB on
  the node's eth0 (egress) and on the switch side of its veth (the node's ingress), plus `latency_us`
  one-way delay between two nodes: netem where the kernel has it, each node's link delaying both
  ways by half of it (compbench.network.netem.join_switch), else compbench's delay line in the
  switch namespace (compbench.network.delay: the switch routes between its ports instead of bridging
  them, through a TUN device, and the line process runs until the cluster is removed).
- per-node configuration in /etc/netns/cbcl-n<i>/ (`ip netns exec` bind-mounts it over /etc): `hosts`
  and an `ssh/` folder with the sshd and ssh client settings, the cluster's host key and client key,
  so `ssh n2` and `horovodrun -H n1:2,n2:2` work inside a node without flags, as on a real cluster.
- /run/sshd (sshd's privilege-separation folder) when missing, removed with the cluster.
- the cluster's record, /run/compbench-cluster/state.json: nodes, rate, and the pid of the process
  that removes it when it ends (`compbench cluster run` without a cluster up), if any; while it is
  built, builder.pid there names the building process.

`remove()` deletes all of it (processes in the namespaces first). A cluster whose owner died (SIGKILL)
is removed by the owner's reaper (compbench.base.reaper), else by the next run of any kind or
`compbench clean` (`remove_orphaned`); a half-built one without a builder's pid by the next `up`,
`run` or `down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from compbench.network.delay import DelayLine, Impairment
from compbench.network.netem import exec_as_host, join_switch, list_namespaces

PREFIX = "cbcl-"
SWITCH = f"{PREFIX}sw"
SUBNET = "10.213.7"  # unused by this machine (checked in `check_machine`)
STATE_DIR = Path("/run/compbench-cluster")
NETNS_ETC = Path("/etc/netns")
SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
_NAME = re.compile(rf"^{PREFIX}(sw|n\d+)$")
_SSH_READY_S = 20.0
_BUILDER = "builder.pid"


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gbps: float | list[float]  # every node's link, or each node's (heterogeneous bandwidth)
    latency_us: float = 0.0
    owner_pid: int | None = None  # removed when this process ends (None: until `down`)

    def rate(self, i: int) -> float:
        """Node i's link, Gbit/s each way."""
        return self.gbps[i - 1] if isinstance(self.gbps, list) else self.gbps

    def namespace(self, i: int) -> str:
        return f"{PREFIX}n{i}"

    def host(self, i: int) -> str:
        return f"n{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i}"

    @property
    def line(self) -> bool:
        """Whether compbench's delay line makes the delay (the kernel has no netem)."""
        return Impairment(self.latency_us).line

    def exec_prefix(self, i: int) -> list[str]:
        """argv prefix that runs a command on node i: its network namespace and /etc view, and a
        hostname of its own (`n<i>`, in a private UTS namespace) as every machine of a real cluster
        has; torchrun hands its hostname to the other nodes as the rendezvous address."""
        return exec_as_host(self.namespace(i), self.host(i))


def check_machine() -> None:
    """One-line ValueError unless this machine can host a cluster."""
    if os.geteuid() != 0:
        raise ValueError("compbench cluster needs root (network namespaces, tc, sshd); run it as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ValueError(f"compbench cluster needs iproute2's `{tool}`; "
                             f"as root run: apt-get install -y iproute2")
    if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None:
        raise ValueError("compbench cluster needs openssh-server and openssh-client; as root run: "
                         "apt-get install -y openssh-server openssh-client")
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    if f" {SUBNET}." in used:
        raise ValueError(f"this machine already uses {SUBNET}.0/24, the emulated cluster's subnet")


def load() -> Cluster | None:
    try:
        return Cluster(**json.loads((STATE_DIR / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def leftovers() -> bool:
    return any(_NAME.match(n) for n in list_namespaces()) or STATE_DIR.exists() or any(
        NETNS_ETC.glob(f"{PREFIX}*"))


def owner_pid() -> int | None:
    """The pid the cluster's life is tied to: its `run`'s (the record's owner), or, while it is built
    (no record yet), its builder's; None for a cluster up until `down`, or none at all."""
    cluster = load()
    if cluster is not None:
        return cluster.owner_pid
    try:
        return int((STATE_DIR / _BUILDER).read_text())
    except (OSError, ValueError):
        return None


def is_orphaned(cluster: Cluster | None) -> bool:
    """A half-built cluster whose builder is gone (or unknown), or one whose owning process is gone."""
    from compbench.base.leftovers import pid_alive

    owner = owner_pid()
    if cluster is None:
        return leftovers() and (owner is None or not pid_alive(owner))
    return owner is not None and not pid_alive(owner)


def remove_orphaned(owner: int | None = None) -> list[str]:
    """Remove the cluster if its owner (or builder) is dead, or is `owner`; a cluster up until `down`
    and one of unknown owner stay. Returns what went."""
    from compbench.base.leftovers import is_stale

    pid = owner_pid()
    if pid is None or not is_stale(pid, owner):
        return []
    return [f"cluster namespace {name}" for name in remove()]


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip() or proc.returncode}")


def create(cluster: Cluster) -> None:
    """Build the cluster; on any failure (Ctrl-C included) everything made so far is removed."""
    from compbench.base.leftovers import guard

    guard()  # a SIGKILL of this process from here on: its reaper removes the cluster (owner_pid)
    try:
        STATE_DIR.mkdir(mode=0o700, parents=True)
        (STATE_DIR / _BUILDER).write_text(str(os.getpid()))
        _keys()
        _run("ip", "netns", "add", SWITCH)
        if cluster.line:
            _run("ip", "netns", "exec", SWITCH, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            _run("ip", "-n", SWITCH, "link", "set", "lo", "up")
        else:
            _run("ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", SWITCH, "link", "set", "br0", "up")
        for i in range(1, cluster.nodes + 1):
            _node(cluster, i)
        if cluster.line:  # each node's half of the delay: a packet between two crosses two links
            nodes = range(1, cluster.nodes + 1)
            halves = {cluster.address(i): cluster.latency_us / 2 for i in nodes}
            DelayLine(SWITCH, [f"v{i}" for i in nodes], halves, detached=True).start()
        for i in range(1, cluster.nodes + 1):
            _start_sshd(cluster, i)
        _wait_for_sshd(cluster)
        (STATE_DIR / "state.json").write_text(json.dumps(asdict(cluster)))
    except BaseException:
        remove()
        raise


def _keys() -> None:
    for name in ("host_key", "client_key"):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"compbench-cluster-{name}",
             "-f", str(STATE_DIR / name))


def _node(cluster: Cluster, i: int) -> None:
    ns = cluster.namespace(i)
    _run("ip", "netns", "add", ns)
    join_switch(SWITCH, ns, f"v{i}", cluster.address(i), cluster.rate(i),
                0.0 if cluster.line else cluster.latency_us / 2, latency_key="--latency-us",
                routed=cluster.line, rtt_us=2 * cluster.latency_us)
    _node_etc(cluster, i)


def _node_etc(cluster: Cluster, i: int) -> None:
    etc = NETNS_ETC / cluster.namespace(i)
    ssh = etc / "ssh"
    ssh.mkdir(parents=True)
    peers = "".join(f"{cluster.address(j)}\t{cluster.host(j)}\n" for j in range(1, cluster.nodes + 1))
    (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n{peers}")
    for name in ("host_key", "client_key"):
        shutil.copy(STATE_DIR / name, ssh / name)
    shutil.copy(STATE_DIR / "client_key.pub", ssh / "authorized_keys")
    (ssh / "sshd_config").write_text(
        f"ListenAddress {cluster.address(i)}\nHostKey /etc/ssh/host_key\n"
        "AuthorizedKeysFile /etc/ssh/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PidFile {STATE_DIR}/sshd-{cluster.host(i)}.pid\n")
    # Host keys are made per cluster and thrown away with it: nothing to pin.
    (ssh / "ssh_config").write_text(
        "Host *\n  IdentityFile /etc/ssh/client_key\n  UserKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking no\n  BatchMode yes\n  LogLevel ERROR\n")


def _start_sshd(cluster: Cluster, i: int) -> None:
    if not PRIVSEP_DIR.exists():  # sshd's privilege-separation folder; removed with the cluster
        PRIVSEP_DIR.mkdir(mode=0o755)
        (STATE_DIR / "made-privsep-dir").touch()
    _run(*cluster.exec_prefix(i), SSHD, "-f", "/etc/ssh/sshd_config")


def _wait_for_sshd(cluster: Cluster) -> None:
    """Every node reaches every other by ssh (one hop from node 1 and back is enough per node)."""
    deadline = time.monotonic() + _SSH_READY_S
    for i in range(1, cluster.nodes + 1):
        while True:
            probe = subprocess.run([*cluster.exec_prefix(1 if i != 1 else cluster.nodes), "ssh",
                                    cluster.host(i), "true"], capture_output=True, text=True)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ssh to node {cluster.host(i)} failed: {probe.stderr.strip()}")
            time.sleep(0.2)


def remove() -> list[str]:
    """Delete every cbcl- namespace (after killing what runs in it) and the cluster's files."""
    gone = []
    for name in list_namespaces():
        if _NAME.match(name):
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
            for pid in pids.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            gone.append(name)
    for etc in NETNS_ETC.glob(f"{PREFIX}*"):
        shutil.rmtree(etc, ignore_errors=True)
    with contextlib.suppress(OSError):
        NETNS_ETC.rmdir()  # only when empty: made for the cluster
    if (STATE_DIR / "made-privsep-dir").exists():
        with contextlib.suppress(OSError):
            PRIVSEP_DIR.rmdir()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    return gone
