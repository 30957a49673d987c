"""One training run from a list of overrides: compose and check the config, then start the workers
(or, under horovodrun / torchrun, be one of them). Library code shared by `compbench train`, the
sweep (`compbench.cli.sweep`) and the claims suite (`compbench.claims.runner`)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from compbench.base.errors import PEER_LOST_EXIT, PeerLost, say_error


def train(overrides: list[str], run_dir: Path | None = None) -> int:
    """One run: compose + check, then start the workers (or join an external launcher's job)."""
    from compbench.compose import config
    from compbench.engines import device
    from compbench.launch.processes import external_engine, spawn_workers
    from compbench.records.rundir import prepare_run_dir

    cfg = config.check(config.compose(overrides))
    joined = external_engine()
    if joined is not None:
        if joined != cfg.choices["engine"]:
            raise ValueError(f"this job was started by the {joined} launcher; add engine={joined}")
        from compbench.train.start import run_worker

        for key in ("emulate_gbps", "emulate_rank_gbps", "trace"):
            if cfg.net.get(key) is not None:
                warnings.warn(f"net.{key} is ignored under the {joined} launcher (it shapes jobs compbench "
                              "starts; compbench cluster run --gbps shapes the nodes' links)", stacklevel=1)
        try:
            run_worker(cfg, None)
        except PeerLost as e:
            say_error(str(e))
            return PEER_LOST_EXIT
        return 0
    placement = device.place(cfg.device, cfg.engine.np)  # checked above: says where it trains
    run_dir = run_dir or prepare_run_dir(cfg, overrides)
    print(f"compbench: {cfg.engine.np} worker(s) on engine={cfg.choices['engine']}, {placement.describe()}, "
          f"output in {run_dir}", flush=True)
    if cfg.recipe:
        settings = " ".join(f"{k}={v}" for k, v in cfg.recipe.items())
        print(f"compbench: from the recipe of {config.recipe_sources(cfg)}: {settings} "
              "(set a key to choose otherwise)", flush=True)
    if cfg.engine.get("elastic"):
        from compbench.catalog import registry
        from compbench.launch.elastic import spawn_elastic

        faults = registry.build(cfg.fault)
        code, message = spawn_elastic(cfg.choices["engine"], run_dir, cfg.engine.np, cfg.threads,
                                      cfg.net.get("emulate_gbps"), cfg.net.get("emulate_latency_us") or 0,
                                      faults.rejoin_due(run_dir) if faults.rejoins else None)
    else:
        code, message = spawn_workers(run_dir, cfg.choices["engine"], cfg.engine.np, cfg.threads)
    if code != 0:
        from compbench.records.rundir import record_failure

        record_failure(run_dir, cfg, message)
        # The worker's own line, once; where the partial output is goes to stdout.
        print(f"error: {message}", file=sys.stderr, flush=True)
        print(f"compbench: failed; partial output kept in {run_dir}", flush=True)
        return code
    return 0  # rank 0 ended with the run's summary and paths (compbench.records.results.format_summary)
