"""What a compbench process leaves on this machine when it dies without cleaning up (SIGKILL, a crash,
a power cut of the process), and how it is found and removed.

Everything compbench makes outside a run's folder carries its owner's pid, so that it can be told
apart from what others made and from what a live run still uses:
- network namespaces `compbench-<pid>-<hex>[-sw|-rK]` (a job's links) and `compbench-<pid>-probe` (the
  netem probe), with their /etc/netns/<name> entries (compbench.network.netem);
- scratch folders `$TMPDIR/compbench-*` holding an `owner.pid` file (`scratch_dir`);
- the emulated cluster `cbcl-*` of `compbench cluster run`, or of an `up` that did not finish, with its
  owner's pid in /run/compbench-cluster (compbench.cluster.nodes); a cluster `up` until `down` has no
  owner and is never removed here.

`remove_stale()` removes what belongs to dead pids (every run that makes such things calls it first,
and so does `compbench clean`); `remove_stale(owner=PID)` what belongs to PID, dead or a zombie (the
reaper of PID, compbench.base.reaper, once PID has ended). Processes still running in a namespace
that goes are killed first."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

SCRATCH_PREFIX = "compbench-"
OWNER_FILE = "owner.pid"
_guarded: set[int] = set()  # the pids that have a reaper (a forked child is a process of its own)


class _Reaper(subprocess.Popen):
    """The reaper's process, which outlives this one by design: no "still running" ResourceWarning when
    the object goes (a Popen's __del__ warns; a documented command's config check failed on it)."""

    def __del__(self) -> None:
        pass


def guard() -> None:
    """Start this process's reaper, once."""
    pid = os.getpid()
    if pid in _guarded:
        return
    _guarded.add(pid)
    # Its own session, no terminal, no pipes of ours: a caller reading this process's output to its
    # end must not wait for the reaper as well.
    _Reaper([sys.executable, "-m", "compbench.base.reaper", str(pid)], cwd="/",
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def is_stale(pid: int, owner: int | None) -> bool:
    """Whether what `pid` made goes: it is `owner`'s, or (no owner given) `pid` is dead."""
    return pid == owner if owner is not None else not pid_alive(pid)


@contextlib.contextmanager
def scratch_dir(prefix: str = SCRATCH_PREFIX) -> Iterator[str]:
    """A temporary folder (`$TMPDIR/<prefix>XXXX`, prefix starting with `compbench-`) that names its
    owner: removed on exit, or by this process's reaper, the next run or `compbench clean` once the
    owner is dead."""
    assert prefix.startswith(SCRATCH_PREFIX), prefix
    guard()
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        Path(folder, OWNER_FILE).write_text(str(os.getpid()))
        yield folder


def remove_stale_scratch(owner: int | None = None) -> list[str]:
    """Remove this user's scratch folders whose owner is gone (or is `owner`); returns them. A folder
    without an owner file (another tool's, or one being made) is left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not a folder of ours, or a half-written pid
        if is_stale(pid, owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


# Who removes which leftovers, as "module:function(owner) -> list[str]" (the lazy registry's form,
# compbench.catalog.registry): the namespaces' and the cluster's owners sit in higher layers than
# this one, which every layer that makes leftovers imports. Both need root (namespaces).
REMOVERS = ("compbench.network.netem:remove_stale", "compbench.cluster.nodes:remove_orphaned")


def remove_stale(owner: int | None = None) -> list[str]:
    """Remove everything compbench made whose owner is dead (or is `owner`): namespaces and their
    /etc/netns entries, scratch folders, an owned emulated cluster. Returns what went, one item a
    line ("namespace NAME", "folder PATH", ...). Namespaces only as root (they need it)."""
    import importlib

    removed = [f"folder {path}" for path in remove_stale_scratch(owner)]
    if os.geteuid() == 0 and shutil.which("ip") is not None:
        for target in REMOVERS:
            module, _, function = target.partition(":")
            removed += getattr(importlib.import_module(module), function)(owner)
    return removed
