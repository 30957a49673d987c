"""scheduler=bucket: the arithmetic of `layerwise` (each tensor compressed on its own: parameters
and bytes equal after a few steps, for every communicator that packs and compressors of every kind),
each bucket's payloads in one collective per stage of the exchange (counted on the engine), buckets
cut by size, and the combinations it cannot pack refused. Ranks are threads (tests/threaded_engine.py)."""

from __future__ import annotations

import pytest
import torch

from compbench.compose import config
from compbench.seam.build import build_model
from compbench.train.loop import Trainer
from tests.threaded_engine import ThreadWorld, count_collectives_per_step
from tests.unit.test_combinations import SMALL as WITH_SECOPA

SMALL = WITH_SECOPA[:-1]  # without secopa's setting

# (compressor, comm, stages of one packed exchange: collectives per bucket)
CASES = [
    ("none", "allreduce", 1),       # the gradients as one flat buffer
    ("fp16", "allreduce", 1),       # the payloads as one flat buffer
    ("topk", "allgather", 1),       # exact sizes: one allgather, no header
    ("dgc", "allgather", 1),        # sizes vary with the data: one framed allgather
    ("atomo", "allgather", 1),      # a matrix compressor keeps its matrices
    ("qsgd", "ps", 2),              # exact sizes: one all-to-all and one all-gather
    ("dgc", "ps", 3),               # sizes vary: the counts' all-to-all first
]


def _fit(tmp_path, compressor: str, comm: str, scheduler: list[str]):
    cfg = config.check(config.compose([*SMALL, f"compressor={compressor}", f"comm={comm}", *scheduler]))
    run_dir = tmp_path / "-".join([compressor, comm, *scheduler])
    torch.manual_seed(0)  # the same start in every run: the rank threads share torch's generator
    start = build_model(cfg).state_dict()
    out = ThreadWorld(2).run(lambda engine: _rank(cfg, engine, run_dir, start))
    for a, b in zip(out[0][0], out[1][0], strict=True):
        assert torch.equal(a, b)  # every rank applied the same average
    return out[0]


def _rank(cfg, engine, run_dir, start):
    trainer = Trainer(cfg, engine, run_dir)
    trainer.model.load_state_dict(start)
    per_step = count_collectives_per_step(engine, trainer)
    trainer.fit()
    params = [p.detach().clone() for p in trainer.model.parameters()]
    return params, per_step, trainer.stats.bytes_sent, len(trainer.scheduler.runs)


@pytest.mark.parametrize("compressor, comm, stages", CASES, ids=[f"{c}-{k}" for c, k, _ in CASES])
def test_bucket_is_layerwise_in_one_collective_per_stage(compressor, comm, stages, tmp_path):
    ref_params, ref_calls, ref_bytes, tensors = _fit(tmp_path, compressor, comm, [])
    params, calls, sent, buckets = _fit(tmp_path, compressor, comm, ["scheduler=bucket"])
    for a, b in zip(params, ref_params, strict=True):
        assert torch.equal(a, b)
    assert sent == ref_bytes
    assert buckets == 1 and tensors == 4  # the tiny MLP: 4 tensors, one bucket of 25 MB
    # DGC sends its 1-D tensors dense (its min_dims: 2): one flat allreduce for them
    dense = 1 if compressor == "dgc" else 0
    assert calls[1:] == [stages + dense] * (len(calls) - 1), calls  # step 0 records the ready order
    assert all(c > s for c, s in zip(ref_calls[1:], calls[1:], strict=True)), (ref_calls, calls)


def test_buckets_are_cut_by_size(tmp_path):
    # the MLP's 192x32 weight (24 KB) is a bucket of its own at 0.02 MB; the rest share one
    _, _, _, buckets = _fit(tmp_path, "topk", "allgather", ["scheduler=bucket", "scheduler.bucket_mb=0.02"])
    assert buckets == 2


@pytest.mark.parametrize("overrides, message", [
    (["comm=ring", "compressor=topk"], "scheduler=bucket sends a bucket's tensors in one exchange, which "
     "comm=ring cannot (it sends tensor by tensor); use scheduler=layerwise (or comm=allgather, ps or "
     "allreduce)"),
    (["comm=allreduce", "compressor=powersgd"], "scheduler=bucket sends a bucket's tensors in one exchange, "
     "and compressor=powersgd runs its own allreduce protocol per tensor over comm=allreduce; use "
     "scheduler=layerwise (or comm=allgather)"),
    (["scheduler.bucket_mb=0"], "scheduler.bucket_mb=0 must be a number > 0 (megabytes of gradients per "
     "bucket); pass e.g. scheduler.bucket_mb=25"),
])
def test_what_it_cannot_pack_is_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*SMALL, "scheduler=bucket", *overrides]))
    assert str(e.value) == message
