"""User errors: one line that names the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

USER_ERROR_EXIT = 2


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
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
