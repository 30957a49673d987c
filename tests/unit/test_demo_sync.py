"""sync=demo through compbench's pipeline (chunk_dct, memory=residual, allgather) against its oracle,
the former DeMo optimizer that exchanged inside its own step (tests/oracles/demo.py): parameters
and momenta bit for bit on fixed gradients of 2 thread ranks, with the recipe's bucket (one
allgather a step) and per tensor; the same bytes; the learning rate following the schedule."""

from __future__ import annotations

import functools

import pytest
import torch

from compbench.compose import config
from tests.oracles.demo import DeMo
from tests.oracles.runs import run_mode, run_oracle
from tests.unit.test_demo_optim import HP, SHAPES, grad, init_params

STEPS = 4
MODE = ["sync=demo", "optim=sgd", f"optim.lr={HP['lr']}", f"optim.weight_decay={HP['weight_decay']}",
        "optim.lr_schedule=constant", f"memory.beta={HP['compression_decay']}",
        f"compressor.topk={HP['compression_topk']}", f"compressor.chunk={HP['compression_chunk']}"]


def _momenta(engine, sync, optimizer):
    return dict(sync.pipeline.memory.residuals)


@pytest.mark.parametrize("scheduler", [[], ["scheduler=layerwise"]], ids=["bucket", "layerwise"])
def test_matches_the_oracle_bit_for_bit(scheduler):
    start = init_params()
    ref = run_oracle(functools.partial(DeMo, **HP), start, grad, STEPS)
    out = run_mode([*MODE, *scheduler], start, grad, STEPS, inspect=_momenta)
    for r in range(2):
        params, sent, momenta = out[r]
        ref_params, ref_sent, ref_state = ref[r]
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True)), r
        assert all(torch.equal(momenta[str(j)], ref_state[j]["delta"]) for j in range(len(SHAPES))), r
        assert sent == ref_sent  # chunks * k * (2 + 4) bytes per tensor


def test_recipe_composes_demo_from_the_pipeline():
    cfg = config.compose(["sync=demo"])
    assert dict(cfg.recipe) == {"compressor": "chunk_dct", "memory": "residual", "memory.beta": 0.999,
                                "comm": "allgather", "scheduler": "bucket", "optim.weight_decay": 0.0}
    assert cfg.optim.weight_decay == 0.0  # the reference's default, not optim=sgd's 5e-4
    assert config.recipe_sources(cfg) == "sync=demo"
    mine = config.compose(["sync=demo", "compressor=topk", "memory.beta=0.9"])  # a user's setting wins
    assert mine.choices.compressor == "topk" and mine.memory.beta == 0.9
    assert config.compose(["sync=demo", "optim.weight_decay=1e-4"]).optim.weight_decay == 1e-4
    assert config.recipe_sources(mine) == "sync=demo"


def test_the_learning_rate_enters_the_momentum_each_step():
    """A schedule changes lr between steps: the memory takes lr_t * g_t, as the reference's delta."""
    start, lrs = init_params(), [0.01, 0.02, 0.005]
    out = run_mode([*MODE, "scheduler=layerwise"], start, lambda r, s, j, shape: torch.ones(shape), 1,
                   inspect=lambda e, sync, opt: sync)
    sync = out[0][2]
    memory = sync.pipeline.memory
    for lr in lrs:
        sync.optimizer.param_groups[0]["lr"] = lr
        sync.begin_step(1, 0.0)
        assert memory.scale == lr


@pytest.mark.parametrize("old, new", [("sync.compression_decay=0.9", "memory.beta=0.9"),
                                      ("sync.compression_topk=8", "compressor.topk=8"),
                                      ("sync.compression_chunk=32", "compressor.chunk=32")])
def test_old_settings_are_refused_with_the_new_ones(old, new):
    with pytest.raises(ValueError, match=f"pass {new}$"):
        config.compose(["sync=demo", old])
