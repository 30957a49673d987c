"""The `compbench` command's entry point (`compbench.cli.main:main`; the commands are compbench.cli.commands).

Ctrl-C must end compbench with one `error:` line and exit 130 wherever it lands, also while the
interpreter is still loading compbench's modules (on a loaded 2-core machine that takes over a second,
and a KeyboardInterrupt outside this guard would print a traceback and kill the process by SIGINT).
So this module imports nothing of compbench's at module level, and the guard covers the imports.
One part of start-up must not be interrupted at all: the C extensions of torch and numpy lose a
KeyboardInterrupt raised while they initialize (the run then goes on) or turn it into an ImportError,
so a Ctrl-C during `import torch` is held and raised as soon as the import is done.
"""

import gc
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# The exit status of a process a closed pipe stopped (128 + SIGPIPE), as `yes | head` reports it.
_BROKEN_PIPE_EXIT = 141
# The commands whose start-up imports torch (`cluster` and `--help` do not: they stay instant).
_LOADS_TORCH = ("train", "list", "launch", "bench", "gen", "plan", "report", "claims")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; Ctrl-C and a closed output pipe end it with one line at most."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in _LOADS_TORCH:
            with _ctrl_c_held():
                import torch  # noqa: F401

        from compbench.cli.commands import run_command

        code = run_command(args)
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe cannot be caught
        return code
    except KeyboardInterrupt:
        from compbench.base.errors import INTERRUPTED_EXIT

        # Workers, when running, were stopped by the launcher (it reports them itself).
        print("error: interrupted by Ctrl-C; stopped", file=sys.stderr, flush=True)
        _forget_unhandled_interrupt()
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        # `compbench list | head`: the reader left. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return _BROKEN_PIPE_EXIT
    finally:
        # The interpreter's last garbage collections walk every object torch's import made: half a
        # second of every command's exit (a user error's exit 2 too) on a 2-core machine, for
        # nothing (the process ends; atexit handlers and finalizers still run). Frozen objects are
        # left out of them.
        gc.freeze()


@contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold SIGINT inside the block and raise KeyboardInterrupt after it if one came. A process that
    ignores SIGINT (started in the background) keeps ignoring it."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if came:
        raise KeyboardInterrupt


def _forget_unhandled_interrupt() -> None:
    """CPython 3.11 marks a KeyboardInterrupt "unhandled" for good when it leaves code run by `exec`
    of a string (dataclasses and namedtuple build their methods so: a Ctrl-C while a module defines a
    dataclass lands there), and then kills the process by SIGINT at exit, whatever it returns. This
    one was handled: clear the mark, a private int of CPython 3.10 and 3.11 (3.12 keeps it in a
    structure ctypes cannot name: there this clears nothing)."""
    import ctypes

    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except ValueError:  # the symbol does not exist in this interpreter
        pass


if __name__ == "__main__":
    sys.exit(main())
