"""The optimizer-level modes (sync=demo, sync=onebit_adam) in the trainer: refused where a setting
would not be used (from their declared `sync_traits`), and exact resume of every rank's own
state (1-bit Adam's worker and server errors differ between ranks: the memories')."""

from __future__ import annotations

import pytest
import torch

from compbench.compose import config
from tests.helpers import TINY, train
from tests.integration.test_resume import _assert_equal


@pytest.mark.parametrize("overrides, message", [
    (["sync=demo", "compressor=topk", "comm=allreduce"],
     "compressor=topk sends rank-dependent indices; use comm=allgather or comm=ps"),
    (["sync=demo", "optim=adamw"],
     "sync=demo builds its own optimizer from optim=sgd's settings, not optim=adamw's; add optim=sgd"),
    (["sync=demo", "optim.momentum=0.5"],
     "sync=demo takes only optim.lr, optim.weight_decay and the schedule from optim=sgd, so "
     "optim.momentum=0.5 would not be used; drop optim.momentum"),
    (["sync=onebit_adam", "optim=adamw", "comm=ring", "scheduler=bucket"],
     "scheduler=bucket sends a bucket's tensors in one exchange, which comm=ring cannot (it sends tensor "
     "by tensor); use scheduler=layerwise (or comm=allgather, ps or allreduce)"),
    (["sync=onebit_adam", "optim=adamw", "sync.freeze_step=-1"],
     "sync.freeze_step=-1 must be an integer >= 0 (dense warm-up steps)"),
    (["sync=demo", "sync.compression_decay=1"],
     "sync.compression_decay is memory.beta now (sync=demo sends through compressor=chunk_dct and "
     "memory=residual); pass memory.beta=1"),
])
def test_settings_that_would_not_be_used_are_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, *overrides]))
    assert str(e.value) == message


# slow tier: 1-bit Adam's state survives a restart in place in the default tier (test_elastic)
@pytest.mark.slow
@pytest.mark.dist
def test_onebit_adam_resumes_every_ranks_errors_exactly(tmp_path):
    """2 epochs == 1 epoch + resume after the freeze: each rank's worker and server errors."""
    setup = [*TINY, "engine.np=2", "batch_size=16", "epochs=2", "eval=false", "optim=adamw", "optim.lr=3e-3",
             "sync=onebit_adam", "sync.freeze_step=3"]
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, "max_steps=8", name="half")
    resumed, _ = train(tmp_path, *setup, f"resume={half}", name="resumed")
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    for key in ("model", "optimizer", "per_rank"):
        _assert_equal(a[key], b[key], key)
    errors = [next(iter(r["memory"]["residuals"].values())) for r in b["per_rank"]]
    assert not torch.equal(*errors)  # per rank, not rank 0's copied
