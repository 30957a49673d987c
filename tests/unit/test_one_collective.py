"""One collective (or one set) per exchange, counted on the engine for every mode that exchanges in
one: DeMo's recipe (every tensor's DCT top-k in one allgather), 1-bit Adam's (the whole momentum as
one flat buffer: one all-to-all and one all-gather, their sizes known), DiLoCo's outer exchange
(one allreduce of the whole outer gradient, or one allgather of its payloads) and Streaming DiLoCo's
(one per fragment). Ranks are threads; the collectives of a step are those between its start and
the next's (no evaluation, no checkpoint)."""

from __future__ import annotations

import pytest

from compbench.compose import config
from compbench.train.loop import Trainer
from tests.helpers import TINY
from tests.threaded_engine import ThreadWorld, count_collectives_per_step

STEPS = 8
RUN = [*TINY, "batch_size=16", f"max_steps={STEPS}", "eval=false", "checkpoint=false"]


def _collectives_per_step(tmp_path, overrides: list[str]) -> list[int]:
    cfg = config.check(config.compose([*RUN, *overrides]))

    def rank(engine):
        trainer = Trainer(cfg, engine, tmp_path)
        per_step = count_collectives_per_step(engine, trainer)
        trainer.fit()
        return per_step

    return ThreadWorld(2).run(rank)[0]


@pytest.mark.parametrize("overrides, expected", [
    # the recipe's bucket: every tensor's payload in one allgather (step 0 records the ready order)
    (["sync=demo", "optim=sgd", "optim.lr=1e-3"], [2] + [1] * (STEPS - 1)),
    # step 0 sends nothing; the dense warm-up: step 1 tensor by tensor while mergecomp records the
    # order (4 tensors and the order's broadcast), step 2 one flat allreduce; then the flat momentum:
    # one all-to-all and one all-gather
    (["sync=onebit_adam", "optim=adamw", "sync.freeze_step=3"], [0, 5, 1] + [2] * (STEPS - 3)),
    # one round every 4 steps: the whole outer gradient in one allreduce
    (["sync=diloco", "optim=adamw", "sync.inner_steps=4"], [0, 0, 0, 1] * 2),
    (["sync=diloco", "optim=adamw", "sync.inner_steps=4", "compressor=qsgd", "comm=allgather"],
     [0, 0, 0, 1] * 2),
    # two fragments, one every 2 steps, each in one exchange
    (["sync=diloco", "optim=adamw", "sync.inner_steps=4", "sync.fragments=2", "sync.eager=true"], [0, 1] * 4),
])
def test_one_collective_per_exchange(tmp_path, overrides, expected):
    assert _collectives_per_step(tmp_path, overrides) == expected
