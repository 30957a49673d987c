"""`compbench clean`: remove what compbench processes that are gone left on this machine, and say what.

A run removes what it made when it ends, and a SIGKILLed one's reaper right after; this is for what
neither could remove (the reaper was killed too). It removes only compbench's own things whose owner
pid is dead (compbench.base.leftovers): network namespaces `compbench-<pid>-*` and their
/etc/netns entries (as root), scratch folders `$TMPDIR/compbench-*` with an owner.pid file, an
emulated cluster whose `compbench cluster run` (or unfinished `up`) died. A live run's things, a
cluster up until `compbench cluster down` and other users' folders stay. Safe at any time; exit 0.
"""

from __future__ import annotations

import os
import shutil

from compbench.base.args import ArgumentParser


def main(argv: list[str]) -> int:
    ArgumentParser(prog="compbench clean", description=__doc__).parse_args(argv)
    from compbench.base.leftovers import remove_stale

    removed = remove_stale()
    for item in removed:
        print(f"clean: removed {item}")
    if not removed:
        print("clean: nothing left behind by a dead compbench process")
    for note in _notes():
        print(f"clean: {note}")
    return 0


def _notes() -> list[str]:
    """What stays that the user may want to know about (and how to remove it)."""
    if shutil.which("ip") is None:
        return []
    from compbench.cluster import nodes
    from compbench.network.netem import list_namespaces

    names = list_namespaces()
    if os.geteuid() != 0:
        mine = [n for n in names if n.startswith(("compbench-", nodes.PREFIX))]
        return [f"{len(mine)} network namespace(s) of compbench were not looked at (they need root): "
                "run `sudo compbench clean`"] if mine else []
    if nodes.load() is not None and nodes.owner_pid() is None:
        return ["kept the emulated cluster that is up (`compbench cluster down` removes it)"]
    if nodes.load() is None and nodes.owner_pid() is None and nodes.leftovers():
        return ["an emulated cluster of unknown owner (half-built) is left: `compbench cluster down` "
                "removes it"]
    return []
