"""Nothing is left behind when a run's parent is SIGKILLed (compbench.base.reaper, .leftovers): a
joblib sweep's pool and its jobs' workers, a delay-line run's workers, line, namespaces and folders,
a cluster run's commands, sshd, line and namespaces are all gone within a bounded wait; `compbench
clean` removes what dead runs left and nothing of a live one."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from compbench.base.leftovers import OWNER_FILE, remove_stale
from compbench.cluster import nodes
from compbench.network import delay
from compbench.network.netem import NETNS_ETC, can_shape, list_namespaces
from tests.helpers import TINY, compbench, default_sigint

needs_root = pytest.mark.skipif(not can_shape(), reason="needs root and iproute2 (ip, tc)")
GONE_S = 20.0  # the bound on what a dead parent's things take to go
LONG = ["max_steps=100000", "epochs=1000", "checkpoint=false", "eval=false", "engine=torch"]


def _start(log: Path, *args: str) -> subprocess.Popen:
    """`compbench ARGS` in a session of its own, its output in `log` (no pipe to fill), with a
    default SIGINT (the suite may run in the background, where SIGINT is ignored)."""
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "compbench", *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=default_sigint,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _named(procs: list[psutil.Process], text: str) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if text in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _wait_until(ready: Callable[[], bool], job: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _things_of(pids: set[int]) -> list[str]:
    """Namespaces, /etc/netns entries and scratch folders that name one of `pids` as their owner."""
    prefixes = tuple(f"compbench-{pid}-" for pid in pids)
    found = [f"namespace {n}" for n in list_namespaces() if n.startswith(prefixes)]
    found += [f"entry {e}" for e in NETNS_ETC.glob("compbench-*") if e.name.startswith(prefixes)]
    for folder in Path(tempfile.gettempdir()).glob("compbench-*"):
        try:
            if int((folder / OWNER_FILE).read_text()) in pids:
                found.append(f"folder {folder}")
        except (OSError, ValueError):
            pass
    return found


def _kill_and_find_nothing(job: subprocess.Popen, procs: list[psutil.Process],
                           extra: Callable[[], list[str]] = list) -> None:
    """SIGKILL the parent; within GONE_S every process seen, and everything they own, is gone."""
    pids = {p.pid for p in procs}
    job.kill()
    job.wait()
    deadline = time.monotonic() + GONE_S
    while True:
        left = [f"process {p.pid} {' '.join(p.cmdline()[:4])}" for p in procs if _running(p)]
        left += _things_of(pids) + extra()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == [], left


def _tidy(job: subprocess.Popen, procs: list[psutil.Process]) -> None:
    """After a failed test: kill what it started (by pid) and remove what they made."""
    if job.poll() is None:
        job.kill()
        job.wait()
    for p in procs:
        if _running(p):
            p.kill()
    for p in procs:
        remove_stale(owner=p.pid)


@pytest.mark.dist
def test_a_killed_joblib_sweep_leaves_no_pool_worker_or_folder(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    log = tmp_path / "log"
    job = _start(log, "train", "-m", *TINY, *LONG, "compressor=none,fp16", "hydra/launcher=joblib",
                 "hydra.launcher.n_jobs=2", f"outputs_root={tmp_path}",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}")
    procs: list[psutil.Process] = []
    try:
        # both jobs training: two loky workers, each with its job's two workers
        _wait_until(lambda: len(_named(_tree(job.pid), "compbench.train.worker")) == 4, job, log)
        procs = _tree(job.pid)
        assert len(_named(procs, "loky")) >= 2, [p.cmdline() for p in procs]
        _kill_and_find_nothing(job, procs)
    finally:
        _tidy(job, procs)


@pytest.mark.dist
@pytest.mark.skipif(not (can_shape() and delay.has_tun()), reason="needs root, iproute2 and /dev/net/tun")
def test_a_killed_delay_line_run_leaves_no_worker_line_namespace_or_folder(tmp_path):
    log = tmp_path / "log"
    job = _start(log, "train", *TINY, *LONG, "engine.np=2", "net.emulate_gbps=1",
                 "net.emulate_latency_us=1000", "net.delay_line=line", f"output_dir={tmp_path / 'run'}")
    procs: list[psutil.Process] = []
    try:
        def up() -> bool:
            tree = _tree(job.pid)
            return len(_named(tree, "compbench.train.worker")) == 2 and bool(_named(tree, "delay_line"))

        _wait_until(up, job, log)
        procs = _tree(job.pid)
        assert _named(procs, "compbench.base.reaper")
        assert len(_things_of({job.pid})) >= 6, _things_of({job.pid})  # 3 namespaces, 2 entries, a folder
        _kill_and_find_nothing(job, procs)
    finally:
        _tidy(job, procs)


def _cluster_left() -> list[str]:
    return [f"cluster namespace {n}" for n in list_namespaces() if n.startswith(nodes.PREFIX)] + (
        [f"cluster state {nodes.STATE_DIR}"] if nodes.STATE_DIR.exists() else [])


@pytest.mark.dist
@needs_root
@pytest.mark.skipif(not os.access(nodes.SSHD, os.X_OK), reason="needs openssh-server")
def test_a_killed_cluster_run_leaves_no_command_sshd_line_or_namespace(tmp_path):
    if nodes.leftovers():
        pytest.skip("an emulated cluster is up on this machine")
    log = tmp_path / "log"
    # n1's command holds a session on n2 through n2's sshd: processes outside the parent's tree
    job = _start(log, "cluster", "run", "--nodes", "2", "--gbps", "1", "--latency-us", "2000", "--",
                 "ssh", "n2", "sleep", "300")
    procs: list[psutil.Process] = []
    try:
        def inside() -> list[psutil.Process]:
            pids = []
            for name in list_namespaces():
                if name.startswith(nodes.PREFIX):
                    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
                    pids += [int(p) for p in out.split()]
            return [p for pid in pids if (p := _process(pid))]

        _wait_until(lambda: bool(_named(inside(), "sleep 300")), job, log)
        procs = _tree(job.pid) + inside()
        assert _named(procs, "sshd") and _named(procs, "ssh n2"), [p.cmdline() for p in procs]
        _kill_and_find_nothing(job, procs, _cluster_left)
    finally:
        _tidy(job, procs)
        if nodes.owner_pid() == job.pid:
            nodes.remove()


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@needs_root
def test_clean_removes_what_dead_runs_left_and_keeps_a_live_ones(tmp_path):
    dead, live = _dead_pid(), os.getpid()
    names = [f"compbench-{dead}-abcdef-sw", f"compbench-{dead}-probe", f"compbench-{live}-fedcba"]
    orphan_entry = NETNS_ETC / f"compbench-{dead}-abcdef-r0"  # its namespace went without it
    folders = {}
    try:
        for name in names:
            subprocess.run(["ip", "netns", "add", name], check=True)
        orphan_entry.mkdir(parents=True)
        (orphan_entry / "hosts").write_text("127.0.0.1\tlocalhost\n")
        for pid in (dead, live):
            folders[pid] = Path(tempfile.mkdtemp(prefix="compbench-"))
            (folders[pid] / OWNER_FILE).write_text(str(pid))
        proc = compbench("clean")
        assert proc.returncode == 0, proc.stderr
        said = proc.stdout.splitlines()
        for gone in (f"namespace {names[0]}", f"namespace {names[1]}", f"entry {orphan_entry}",
                     f"folder {folders[dead]}"):
            assert f"clean: removed {gone}" in said, proc.stdout
        assert not any(names[2] in line or str(folders[live]) in line for line in said), proc.stdout
        assert names[2] in list_namespaces() and folders[live].is_dir()
        assert _things_of({dead}) == []
        again = compbench("clean")  # safe to run any time
        assert again.returncode == 0 and not any(f"compbench-{dead}-" in line or str(folders[dead]) in line
                                                 for line in again.stdout.splitlines())
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        remove_stale(owner=dead)
        for folder in folders.values():
            subprocess.run(["rm", "-rf", str(folder)])
