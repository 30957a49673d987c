"""User errors: one line that names the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a job stopped by Ctrl-C
# Set by compbench's launcher for each worker: the worker writes its `error:` text there instead of
# stderr, and the launcher prints it once (not once per rank).
ERROR_FILE_ENV = "COMPBENCH_ERROR_FILE"
PEER_LOST_EXIT = 4  # a launcher that sees it waits for the failure that caused it
# How gloo (torch's and Horovod's) and Horovod report that another rank's process is gone.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "Horovod has been shut down")


class PeerLost(RuntimeError):
    """Another rank is gone (killed, crashed, its machine down): the worker says so in one line and
    exits with PEER_LOST_EXIT (compbench.train.worker, and cli.train under an external launcher)."""


def as_peer_lost(e: BaseException) -> PeerLost | None:
    """The one-line form of a collective's error when it means a peer is gone, else None."""
    text = str(e)
    if not isinstance(e, RuntimeError) or not any(s in text for s in _PEER_GONE):
        return None
    where = re.search(r"peer \[([0-9a-fA-F.:]+)\]", text)
    at = f" at {where.group(1)}" if where else ""
    return PeerLost(f"lost the connection to another worker{at} (it crashed, was killed or its machine is "
                    f"down): stopped; that worker's log says why")


def say_error(message: str) -> None:
    """Print `error: MESSAGE` (its first line), or hand it to the launcher when it asked for it."""
    line = message.splitlines()[0] if message else "unknown error"
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
            return
        except OSError:
            pass  # the launcher's scratch folder is gone: stderr still reaches the user
    print(f"error: {line}", file=sys.stderr, flush=True)


@contextmanager
def report_user_error() -> Iterator[None]:
    """Turn a ValueError (bad user input, by convention) into `error: ...` on stderr and exit 2.

    COMPBENCH_DEBUG=1 shows the traceback instead.
    """
    try:
        yield
    except ValueError as e:
        if os.environ.get("COMPBENCH_DEBUG"):
            raise
        say_error(str(e) or type(e).__name__)
        sys.exit(USER_ERROR_EXIT)
