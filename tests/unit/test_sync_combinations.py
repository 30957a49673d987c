"""The synchronization axis of the combination test: every sync mode x compressor x comm (with the
compressor's recipe) either is refused by the config check (one line naming an alternative) or trains
a few steps: finite losses and every parameter updated. Ranks are threads (tests/threaded_engine.py);
the node swap is the combination test's (`tests/unit/test_combinations.py`)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import open_dict

from compbench.catalog import registry
from compbench.compose import config
from compbench.train.loop import Trainer
from tests.threaded_engine import ThreadWorld
from tests.unit.test_combinations import ALTERNATIVE, _compose

COMMS = ("allgather", "allreduce")  # the pipeline's two collective shapes; test_combinations has the rest
OPTIM = {"demo": "sgd", "onebit_adam": "adamw", "onebit_lamb": "adamw", "diloco": "adamw", "noloco": "adamw",
         "sparta": "adamw", "sparta_diloco": "adamw", "desloc": "adamw", "delayed_diloco": "adamw"}


def _with_sync(base, sync: str):
    cfg = base.copy()
    with open_dict(cfg):
        cfg.sync = registry.option_config("sync", sync)
        if sync in ("diloco", "noloco", "sparta_diloco"):
            cfg.sync.inner_steps = 2  # a round and a half in 3 steps
        if sync == "delayed_diloco":  # 3 rounds: round 0's average applied at round 1's end, and so on
            cfg.sync.inner_steps = 1
            cfg.engine = registry.option_config("engine", "torch")  # its only engine
            cfg.choices.engine = "torch"
        if sync == "desloc":  # parameters and first moment every 2 steps (a period and a half), v every 3
            cfg.sync.update(param_period=2, first_moment_period=2, second_moment_period=3)
        if sync == "onebit_adam":
            cfg.sync.freeze_step = 1  # compressed from the second step on
        if sync == "onebit_lamb":
            cfg.sync.freeze_step = 2  # its least: one LAMB step, compressed from the third step on
        cfg.optim = registry.option_config("optim", OPTIM[sync])
        cfg.optim.lr_schedule = "constant"
        cfg.choices.update(sync=sync, optim=OPTIM[sync])
    return cfg


def _train(cfg, run_dir) -> None:
    def rank(engine):
        trainer = Trainer(cfg, engine, run_dir)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.fit()
        losses = trainer.recorder.history["train/loss"] if trainer.recorder else []
        return before, dict(trainer.model.named_parameters()), losses

    for before, after, losses in ThreadWorld(2).run(rank):
        stale = [n for n, p in after.items() if torch.equal(p.detach(), before[n])]
        assert not stale, f"parameters not updated: {stale}"
        assert all(math.isfinite(v) for v in losses), losses


def _sweep(tmp_path, sync: str, compressors, max_steps: int | None = None, **settings) -> None:
    """Every compressor x COMMS under `sync` (its `settings` over _with_sync's, `max_steps` over the
    combination test's 3): each is refused at config time with one line naming an alternative, or
    trains (every parameter moves, finite losses); at least one of each."""
    ran = refused = 0
    for compressor in compressors:
        for comm in COMMS:
            combo = f"sync={sync} compressor={compressor} comm={comm}"
            cfg = _with_sync(_compose(compressor, comm), sync)
            with open_dict(cfg):
                cfg.sync.update(settings)
                cfg.max_steps = max_steps or cfg.max_steps
            try:
                cfg = config.check(cfg)
            except ValueError as e:
                assert "\n" not in str(e) and ALTERNATIVE.search(str(e)), (combo, str(e))
                refused += 1
                continue
            try:
                _train(cfg, tmp_path / f"{compressor}-{comm}")
            except Exception as e:
                raise AssertionError(f"{combo}: {type(e).__name__}: {e}") from e
            ran += 1
    assert ran > 0 and refused > 0, (ran, refused)


# The baselines wrap a real process group (DDP, Horovod's optimizer): tests/integration/test_baselines.py
# trains them; here they are checked for refusals only.
BASELINES = ("ddp", "horovod_optimizer")
# sync=quorum_diloco and sync=halos send point to point over torch.distributed groups of their own,
# which threaded ranks have not: tests/dist/test_quorum_diloco.py and test_halos.py train them on real
# process groups.
POINT_TO_POINT = ("quorum_diloco", "halos")


# DiLoCo's outer step with SPARTA's averaging in between: the same pipeline as sync=diloco's, swept
# with a few compressors (every one already goes through sync=diloco's sweep); 1-bit LAMB's exchange
# is 1-bit Adam's (every compressor goes through sync=onebit_adam's sweep); DES-LOC's parameters take
# DiLoCo's path through the pipeline.
SUBSETS = {"sparta_diloco": ("none", "topk", "qsgd", "fp16"),
           "onebit_lamb": ("none", "rms_sign", "onebit", "topk"),
           "desloc": ("none", "topk", "qsgd", "fp16", "powersgd"),
           # sync=diloco's exchange (swept there); its dense and top-k paths are test_delayed_diloco's
           "delayed_diloco": ("topk",)}


@pytest.mark.parametrize("sync", [s for s in registry.options("sync")
                                  if s not in ("step", *BASELINES, *POINT_TO_POINT)])
def test_every_sync_mode_is_refused_or_trains(sync, tmp_path):
    _sweep(tmp_path, sync, SUBSETS.get(sync, registry.options("compressor")))
