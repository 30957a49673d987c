"""User errors: one line that names the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a job stopped by Ctrl-C
# Set by compbench's launcher for each worker: the worker writes its `error:` text there instead of
# stderr, and the launcher prints it once (not once per rank).
ERROR_FILE_ENV = "COMPBENCH_ERROR_FILE"


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
