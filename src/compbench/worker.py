"""One worker process: `python -m compbench.worker RUN_DIR` (started by compbench's launcher)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NoReturn


def main(argv: list[str] | None = None) -> int:
    from compbench.errors import PEER_LOST_EXIT, PeerLost, report_user_error, say_error

    try:
        # Imports inside the guard: Ctrl-C often lands while torch is still being imported.
        from omegaconf import OmegaConf

        from compbench.train.loop import run_worker

        run_dir = Path((argv or sys.argv[1:])[0])
        cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
        with report_user_error():
            run_worker(cfg, run_dir)
    except KeyboardInterrupt:  # Ctrl-C reaches every worker: stop quietly, the launcher reports it
        return 130
    except PeerLost as e:  # another worker failed first; the launcher reports that one
        say_error(str(e))
        return PEER_LOST_EXIT
    except FloatingPointError as e:  # on_nonfinite=raise: the message names the tensor and the fix
        say_error(str(e))
        return 3
    return 0


def _interrupt_once(signum: int, frame: object) -> None:
    """Ctrl-C reaches a worker twice: from the terminal (the whole process group) and again from
    the launcher, which forwards it. The first stops the worker; a second landing while it winds
    down (or in exit_now) would print a KeyboardInterrupt traceback over the launcher's message."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def exit_now(code: int) -> NoReturn:
    """End a worker process that has finished (results written, engine shut down) without the
    interpreter's finalization: gloo work objects that outlive the process group can abort it
    there (std::terminate, SIGABRT) and turn a finished job into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _interrupt_once)
    exit_now(main())
