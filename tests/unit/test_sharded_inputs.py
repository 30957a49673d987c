"""A sharded run's bad inputs (sharding=fsdp|hsdp): each refused at compose time in one line that names
the key and the fix, before anything is written or allocated; and the memory-fit refusal of a model
that unsharded workers cannot hold."""

from __future__ import annotations

import re

import pytest
import torch

from compbench.compose import config
from compbench.compose.sharded import check_fits
from compbench.records.memory import predict_worker_bytes
from compbench.sync.sharded import shard_units
from compbench.sync.sharding import Sharding, groups_of

GPT = ["model=gpt", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "dataset=shakespeare",
       "optim=adamw", "engine=torch"]


@pytest.mark.parametrize("overrides, message", [
    (["engine=horovod", "sharding=fsdp"], "sharding=fsdp runs on torch.distributed (FSDP2's fully_shard): "
                                          "add engine=torch"),
    (["sharding=hsdp", "engine.np=4", "sharding.group_size=3"],
     "sharding.group_size=3 must divide the 4 workers into 2 or more groups "
     "(e.g. sharding.group_size=2)"),
    (["sharding=hsdp", "engine.np=4"], "sharding=hsdp shards inside each node and replicates across "
                                       "nodes, and this job has one node (4 workers): run it on `compbench "
                                       "cluster`"),
    (["sharding=fsdp", "sharding.scatter=topk"], "sharding.scatter=topk is not one of none, fp16, bf16, "
                                                 "int8, int4, loco4"),
    (["sharding=fsdp", "sharding.stage=1"], "sharding.stage=1 must be 3"),
    (["sharding=fsdp", "sharding.gather_stochastic=true"], "sharding.gather_stochastic=true rounds int8 "
                                                           "codes (QSDP)"),
    (["sharding=fsdp", "sharding.scatter=int4", "sharding.scatter_block=0"], "sharding.scatter=int4 needs "
                                                                              "blocks"),
    (["sharding=fsdp", "sharding.gather_block=-1"], "sharding.gather_block=-1 must be a whole number"),
    (["sharding=fsdp", "sharding.group_size=2"], "sharding.group_size shapes HSDP's groups"),
    (["sharding=fsdp", "sharding.hpz=true"], "sharding.hpz=true keeps a secondary shard per node"),
    (["sharding=fsdp", "compressor=fp16"], "sharding=fsdp makes one shard group of all 2 workers: nothing "
                                           "crosses groups, so compressor=fp16 would not be used"),
    (["sharding=hsdp", "engine.np=4", "sharding.group_size=2", "sync=ddp"],
     "sync=ddp does not run across shard groups"),
    (["sharding=hsdp", "engine.np=4", "sharding.group_size=2", "optim=muon"],
     "optim=muon reads whole tensors"),
    (["sharding=hsdp", "engine.np=4", "sharding.group_size=2", "scheduler=mergecomp"],
     "scheduler=mergecomp fuses gradients"),
    (["sharding=fsdp", "sharding.hpz=true", "sharding.stage=2"], "sharding.hpz=true is a secondary shard "
                                                                 "kept after forward"),
    (["sharding=fsdp", "engine.elastic=true"], "sharding=fsdp with engine.elastic=true"),
    (["sharding=fsdp", "+sharding.foo=1"], "sharding.foo is not a setting of sharding=fsdp"),
    (["sharding.gather=int8"], "sharding.gather is not a setting of sharding=none"),
])
def test_a_bad_sharded_setting_is_one_line(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        config.check(config.compose([*GPT, "engine.np=2", *overrides]))
    assert "\n" not in str(refused.value)


def test_the_good_layouts_compose():
    config.check(config.compose([*GPT, "engine.np=2", "sharding=fsdp", "sharding.gather=fp8",
                                 "sharding.scatter=loco4"]))
    config.check(config.compose([*GPT, "engine.np=4", "sharding=hsdp", "sharding.group_size=2",
                                 "sync=diloco", "sync.inner_steps=2", "compressor=topk", "comm=allgather",
                                 "ratio=0.1"]))


def test_a_model_unsharded_workers_cannot_hold_is_refused_with_the_sharded_figure(monkeypatch):
    """The refusal names the per-worker bytes of each part and the sharded alternative, from the
    model built on the meta device (nothing allocated)."""
    cfg = config.compose([*GPT, "engine.np=2", "model.n_layer=8", "model.n_embd=1024", "model.n_head=8"])
    with torch.device("meta"):
        from compbench.seam.build import build_model

        model = build_model(cfg)
    numel = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr("compbench.compose.sharded._available_bytes", lambda: 16 * numel * 2 - 1)
    refusal = (r"needs at least .* GB per worker \(parameters .* \+ gradients .* \+ optim=adamw state .*\), "
               r".* for 2 workers on this machine, which has .* available; shard it: sharding=fsdp "
               r"engine=torch holds")
    with pytest.raises(ValueError, match=refusal):
        check_fits(cfg, model, Sharding())
    check_fits(cfg, model, Sharding(layout="fsdp"))  # half of it fits


def test_the_memory_prediction_counts_shards_and_the_optimizers_state():
    assert predict_worker_bytes(10, "adamw", {}, 1) == {"parameters": 40, "gradients": 40, "optimizer": 80,
                                                        "total": 160}
    assert predict_worker_bytes(10, "adamw", {}, 2)["total"] == 80
    assert predict_worker_bytes(10, "sgd", {"momentum": 0.9}, 1)["optimizer"] == 40
    assert predict_worker_bytes(10, "sgd", {"momentum": 0.0}, 1)["optimizer"] == 0


def test_groups_shard_consecutive_ranks_and_replicate_across_them():
    assert groups_of(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert groups_of(2, 2) == ([[0, 1]], [[0], [1]])


def test_the_units_are_a_models_repeated_blocks():
    from compbench.models.gpt import gpt

    model = gpt(vocab_size=8, n_layer=3, n_embd=8, n_head=2)
    assert shard_units(model) == list(model.blocks)
