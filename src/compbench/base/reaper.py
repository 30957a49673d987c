"""A process's reaper: what a compbench process made on this machine (compbench.base.leftovers:
network namespaces, /etc/netns entries, scratch folders, an emulated cluster it owns) goes when that
process ends, however it ends. SIGKILL runs no handler and no `finally`, so the removal cannot be
the process's own.

`compbench.base.leftovers.guard()` starts, once per process and before the first thing is made,
`python -m compbench.base.reaper PID`: a small process in a session of its own (a terminal's Ctrl-C or a kill
of the job's process group does not reach it) that waits on a pidfd of PID, then removes what carries
PID and exits. After a clean end it finds nothing. The processes a run starts end with it by
themselves (PR_SET_PDEATHSIG, the delay line's closed input); what still runs in a namespace that
goes is killed first. Where the reaper itself was killed, the next run and `compbench clean` remove
what it would have.
"""

from __future__ import annotations

import os
import select
import signal
import sys


def wait_for(pid: int) -> None:
    """Return once process `pid` has ended (at once if it has already)."""
    try:
        fd = os.pidfd_open(pid)  # readable once the process has ended; immune to the pid's reuse
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the run; the reaper comes after it
    pid = int(argv[0])
    wait_for(pid)
    from compbench.base.leftovers import remove_stale

    remove_stale(owner=pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
