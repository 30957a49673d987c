"""Every compressor x memory x comm x scheduler x engine either is refused by the config check (one
line that names a valid alternative) or trains 3 steps: finite loss, every parameter updated, and
every chosen component used. Ranks are threads of this process (tests/threaded_engine.py); the real
engines run the same pipeline in tests/dist.

Composing with Hydra costs ~0.4 s, so each compressor x comm is composed once (with its recipe) and
the memory, scheduler and engine nodes are swapped in by hand, as Hydra would compose them."""

from __future__ import annotations

import math
import re

import pytest
import torch
from omegaconf import open_dict

from compbench.catalog import registry
from compbench.compose import config
from compbench.train.loop import Trainer
from tests.helpers import TINY
from tests.threaded_engine import ThreadWorld

STEPS = 3
ENGINES = ("horovod", "torch")
# A refusal names what to do instead.
ALTERNATIVE = re.compile(r"\b(use|add|pass|drop) \S+=")
# Small, quick runs: 2 ranks x 2 steps per epoch, no files but results.json and TensorBoard.
SMALL = [*TINY, "batch_size=32", f"max_steps={STEPS}", "eval=false", "checkpoint=false",
         "scheduler.gbps=0.001"]  # secopa plans from this slow link (no engine probe): it compresses


def _compose(compressor: str, comm: str):
    extra = ["compressor.start_iter=2"] if compressor == "powersgd" else []  # compressed by step 2
    return config.compose([*SMALL[:-1], f"compressor={compressor}", f"comm={comm}", "memory=none", *extra])


def _variant(base, memory: str, scheduler: str, engine: str):
    cfg = base.copy()
    with open_dict(cfg):
        cfg.memory = registry.option_config("memory", memory)
        cfg.scheduler = registry.option_config("scheduler", scheduler)
        cfg.engine = registry.option_config("engine", engine)
        if scheduler == "secopa":
            cfg.scheduler.gbps = 0.001
        cfg.choices.update(memory=memory, scheduler=scheduler, engine=engine)
    return cfg


def _train(cfg, run_dir) -> None:
    """3 steps on 2 thread ranks; checks loss, parameter updates and the components used."""

    def rank(engine):
        trainer = Trainer(cfg, engine, run_dir)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        calls = {"compress": 0, "compensate": 0, "reduce": 0, "synchronize": 0}
        _count(trainer.compressor, "compress_collective" if _collective(trainer) else "compress", calls,
               "compress")
        _count(trainer.memory, "compensate", calls)
        _count(trainer.pipeline.comm, "reduce", calls)
        if trainer.pipeline.comm.traits.packs:  # scheduler=bucket's exchanges
            _count(trainer.pipeline.comm, "reduce_many", calls, "reduce")
        _count(trainer.scheduler, "synchronize", calls)
        trainer.fit()
        after = dict(trainer.model.named_parameters())
        # A planning scheduler (secopa) sends a gradient through the compressed path only where
        # compressing pays: with a lossless compressor it plans every gradient dense.
        planned_dense = trainer.scheduler.traits.plans and trainer.scheduler.summary()["compressed"] == 0
        assert not planned_dense or trainer.compressor.caps.lossless, trainer.scheduler.summary()
        losses = trainer.recorder.history["train/loss"] if trainer.recorder else None
        return before, after, calls, losses, planned_dense

    # Two emulated machines of one worker each: comm=hierarchical exchanges between them.
    results = ThreadWorld(2, local_size=1).run(rank, name=cfg.choices["engine"])
    for before, after, calls, losses, planned_dense in results:
        stale = [n for n, p in after.items() if torch.equal(p.detach(), before[n])]
        assert not stale, f"parameters not updated: {stale}"
        assert calls["synchronize"] == STEPS, calls
        # compressor=none over comm=allreduce averages the gradient in place: nothing to encode
        in_place = cfg.choices["compressor"] == "none" and cfg.choices["comm"] == "allreduce"
        assert planned_dense or (calls["reduce"] > 0 and (calls["compress"] > 0 or in_place)), calls
        if cfg.choices["memory"] != "none":
            assert calls["compensate"] > 0, calls
        if losses is not None:
            assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), losses


def _collective(trainer) -> bool:
    return trainer.compressor.caps.collective and trainer.pipeline.comm.traits.needs_summable


def _count(obj, method: str, calls: dict, key: str | None = None) -> None:
    inner = getattr(obj, method)

    def counted(*args, **kwargs):
        calls[key or method] += 1
        return inner(*args, **kwargs)

    setattr(obj, method, counted)


# Suite time: the default tier runs a compressor of each kind (identity, cast, sparse, sparse with its
# own memory, stochastic quantizer, sign with a scale, low rank in two rounds, sampled SVD, DeMo's
# transform) over every memory, comm, scheduler and engine; the others' matrices are in the slow tier
# (their wire formats and contracts are in test_compressor_contract.py's default tier).
DEFAULT_TIER = {"none", "fp16", "topk", "dgc", "qsgd", "onebit", "powersgd", "atomo", "chunk_dct"}


@pytest.mark.parametrize("compressor", [c if c in DEFAULT_TIER else pytest.param(c, marks=pytest.mark.slow)
                                        for c in registry.options("compressor")])
def test_every_combination_is_refused_or_trains(compressor, tmp_path):
    ran = refused = 0
    for comm in registry.options("comm"):
        base = _compose(compressor, comm)
        for memory in registry.options("memory"):
            for scheduler in registry.options("scheduler"):
                accepted = []
                for engine in ENGINES:
                    combo = f"compressor={compressor} memory={memory} comm={comm} scheduler={scheduler} " \
                            f"engine={engine}"
                    try:
                        cfg = config.check(_variant(base, memory, scheduler, engine))
                    except ValueError as e:
                        message = str(e)
                        assert "\n" not in message and ALTERNATIVE.search(message), (combo, message)
                        refused += 1
                        continue
                    accepted.append(cfg)
                if accepted:  # the engine changes nothing in-process: run one
                    try:
                        _train(accepted[0], tmp_path / f"{comm}-{memory}-{scheduler}")
                    except Exception as e:
                        raise AssertionError(f"{combo}: {type(e).__name__}: {e}") from e
                    ran += 1
    assert ran > 0 and refused > 0, (ran, refused)
