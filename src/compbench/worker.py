"""One worker process: `python -m compbench.worker RUN_DIR` (started by compbench's launcher)."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf


def main(argv: list[str] | None = None) -> int:
    from compbench.errors import report_user_error
    from compbench.train.loop import run_worker

    run_dir = Path((argv or sys.argv[1:])[0])
    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    try:
        with report_user_error():
            run_worker(cfg, run_dir)
    except KeyboardInterrupt:  # Ctrl-C reaches every worker: stop quietly, the launcher reports it
        return 130
    except FloatingPointError as e:  # on_nonfinite=raise: the message names the tensor and the fix
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
