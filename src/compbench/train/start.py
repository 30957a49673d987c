"""Start training on this rank (compbench.train.worker, or an external launcher's process): the engine,
the run folder, then the trainer (compbench.train.loop), or the engine's elastic loop around it
(compbench.train.elastic_horovod, elastic_torch) when engine.elastic is set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from compbench.base.errors import as_peer_lost
from compbench.base.settings import RunSettings
from compbench.catalog import registry
from compbench.engines import device
from compbench.train.loop import Trainer


def run_worker(cfg: DictConfig, run_dir: Path | None) -> dict[str, Any] | None:
    """Train on this rank. `run_dir` is None under an external launcher: rank 0 then picks it."""
    settings = RunSettings.of(cfg)
    threads = int(os.environ.get("COMPBENCH_THREADS", settings.threads or 0) or 0)
    if threads:
        torch.set_num_threads(threads)
    # A model that has learned its data drives activations and gradients into the denormal range,
    # where x86 arithmetic is ~100x slower: the MLP of bench_e2e took 216 ms a step instead of 117.
    torch.set_flush_denormal(settings.flush_denormal)
    # Where this machine's workers train (compbench.engines.device): the engine puts this rank on its device.
    placement = device.place(settings.device, device.local_workers(int(cfg.engine.get("np", 1))))
    engine = registry.build(cfg.engine, drop=("np",), placement=placement)
    elastic = bool(cfg.engine.get("elastic"))
    if run_dir is None:
        from compbench.records.rundir import prepare_run_dir

        if elastic:  # a worker that joins later meets no one to agree with: the folder is named
            run_dir = Path(cfg.output_dir)
            if engine.rank == 0 and not (run_dir / ".hydra").exists():
                prepare_run_dir(cfg)
        else:
            run_dir = Path(engine.broadcast_object(str(prepare_run_dir(cfg)) if engine.rank == 0 else None))
    if elastic:  # survives failed and joining workers: the engine's own elastic mode
        if engine.name == "horovod":
            from compbench.train.elastic_horovod import run_horovod_elastic as run_elastic
        else:
            from compbench.train.elastic_torch import run_torch_elastic as run_elastic
        results = run_elastic(cfg, engine, run_dir)
        engine.shutdown()
        return results
    # No teardown handshake when this rank fails or is interrupted: its peers may be gone already
    # (Ctrl-C reaches every rank), and the barrier would raise a connection error over the Ctrl-C.
    try:
        results = Trainer(cfg, engine, run_dir).fit()
    except RuntimeError as e:
        lost = as_peer_lost(e)
        if lost is None:
            raise
        raise lost from e
    engine.shutdown()
    return results
