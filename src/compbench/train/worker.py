"""One worker process: `python -m compbench.train.worker RUN_DIR` (started by compbench's launcher)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import NoReturn, cast

from compbench.base.errors import INTERRUPTED_EXIT


def main(argv: list[str] | None = None) -> int:
    from compbench.base.errors import PEER_LOST_EXIT, PeerLost, report_user_error, say_error

    try:
        # The launcher started this process with SIGINT blocked: a Ctrl-C of the start-up is
        # pending and lands here, inside the guard.
        signal.signal(signal.SIGINT, _stop_on_ctrl_c)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        # The heavy imports after the handler: Ctrl-C often lands while torch is being imported.
        from omegaconf import DictConfig, OmegaConf

        run_dir = Path((argv or sys.argv[1:])[0])
        cfg = cast(DictConfig, OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
        if cfg.get("nice") is not None:  # checked at compose time; before torch starts any thread,
            os.setpriority(os.PRIO_PROCESS, 0, int(cfg.nice))  # which inherit it (a thread's on Linux)

        from compbench.train.start import run_worker

        with report_user_error():
            run_worker(cfg, run_dir)
    except KeyboardInterrupt:  # only before the handler is in place (a worker started by hand)
        return INTERRUPTED_EXIT
    except PeerLost as e:  # another worker failed first; the launcher reports that one
        say_error(str(e))
        return PEER_LOST_EXIT
    except FloatingPointError as e:  # on_nonfinite=raise: the message names the tensor and the fix
        say_error(str(e))
        return 3
    return 0


def _stop_on_ctrl_c(signum: int, frame: object) -> None:
    """Ctrl-C reaches every worker (from the terminal, and again from the launcher, which forwards
    it) and the launcher reports it: end at once, quietly. A KeyboardInterrupt instead would surface
    wherever the signal lands: a traceback from an import (numpy then fails with "cannot load module
    more than once"), a weakref callback ("Exception ignored in"), or the second Ctrl-C while the
    first unwinds. Nothing needs unwinding: checkpoints and results are written atomically, and the
    worker ends with os._exit anyway (exit_now)."""
    os._exit(INTERRUPTED_EXIT)


def exit_now(code: int) -> NoReturn:
    """End a worker process that has finished (results written, engine shut down) without the
    interpreter's finalization: gloo work objects that outlive the process group can abort it
    there (std::terminate, SIGABRT) and turn a finished job into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
