"""Sharded training (sharding=fsdp|hsdp, torch FSDP2 over gloo): uncompressed FSDP trains as DDP does,
the byte counter reproduces ZeRO++'s volume arithmetic, HSDP carries a synchronization mode across
its groups, and the records hold bytes per direction and memory per worker."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.helpers import event_tags, results, train

GPT = ["model=gpt", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "dataset=shakespeare",
       "dataset.eval_windows=32", "dataset.ood=null", "optim=adamw", "optim.warmup_epochs=0", "engine=torch",
       "progress=false", "checkpoint=false", "eval_points=1", "loggers=[tensorboard,csv]"]
STEPS = 6


def _losses(run: Path) -> list[float]:
    rows = csv.DictReader((run / "scalars.csv").open())
    return [float(r["value"]) for r in rows if r["tag"] == "train/loss"]


@pytest.mark.dist
def test_fsdp_trains_as_ddp_and_records_directions(tmp_path):
    """Uncompressed FSDP = torch DDP (the same losses step by step, within float reassociation: a
    reduce-scatter sums in another order than DDP's allreduce); each worker holds half of the
    parameters, gradients and AdamW state; the weights travel twice per step (forward, backward) and
    the gradients once, all booked per direction."""
    common = [*GPT, f"max_steps={STEPS}", "engine.np=2"]
    ddp, _ = train(tmp_path, *common, "sync=ddp", name="ddp")
    fsdp, _ = train(tmp_path, *common, "sharding=fsdp", name="fsdp")
    ref, got = _losses(ddp), _losses(fsdp)
    assert len(ref) == len(got) == STEPS
    assert ref[0] != ref[-1]  # not vacuous: training moved the loss
    for step, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert abs(a - b) <= 1e-5 * abs(a), (step, a, b)
    s_ddp, s = results(ddp)["summary"], results(fsdp)["summary"]
    assert abs(s["final_eval_loss"] - s_ddp["final_eval_loss"]) <= 1e-4 * s_ddp["final_eval_loss"]

    weights = s_ddp["bytes_dense_per_step"]  # DDP allreduces the fp32 gradients: the model's bytes
    sharded = s["sharded"]
    assert sharded["layout"] == "fsdp" and sharded["shard_group"] == 2 and sharded["replicas"] == 1
    # FSDP pads a tensor's first dimension to a multiple of the workers: the padding travels too
    padded = sharded["bytes_scattered_per_step"]
    assert weights <= padded <= 1.01 * weights
    assert sharded["bytes_gathered_per_step"] == 2 * padded  # stage 3: forward and backward
    assert sharded["bytes_replica_per_step"] == 0
    assert s["bytes_sent_per_step"] == 3 * padded
    for whole, half in zip(s_ddp["memory_mb"], s["memory_mb"], strict=True):
        for part in ("parameters", "gradients", "optimizer"):
            assert half[part] == pytest.approx(whole[part] / 2, rel=0.02), part
        assert half["gathered"] > 0 and whole["gathered"] == 0  # forward saved gathered weights
        assert half["activations"] > 0 and half["peak"] > half["activations"]
    tags = event_tags(fsdp)
    assert {"comm/bytes_gathered", "comm/bytes_scattered", "time/gathered_ms", "time/scattered_ms"} <= tags


# slow tier: two runs, ~8 s; the default tier checks fp32's volume (test above) and each format's bytes
# (tests/unit/test_blockquant.py), the slow tier's cluster test ZeRO++'s cross-node quarter
@pytest.mark.slow
@pytest.mark.dist
def test_byte_counter_reproduces_zeropp_volume(tmp_path):
    """ZeRO++'s arithmetic, from what the collectives booked: qwZ's int8 weights halve an fp16
    all-gather (plus one fp32 scale per 2048 elements), qgZ's int4 gradients quarter an fp16
    reduce-scatter; ZeRO-2 (stage=2) gathers the weights once per step."""
    common = [*GPT, "max_steps=3", "eval=false", "engine.np=2", "sharding=fsdp"]
    fp16, _ = train(tmp_path, *common, "sharding.gather=fp16", "sharding.scatter=fp16", name="fp16")
    zpp, _ = train(tmp_path, *common, "sharding.gather=int8", "sharding.scatter=int4", "sharding.stage=2",
                   name="zeropp")
    base, q = results(fp16)["summary"]["sharded"], results(zpp)["summary"]["sharded"]
    scales = 1 + 2 * 4 / 2048  # int8: one fp32 scale (4 bytes) per block of 2048 one-byte codes
    assert q["bytes_gathered_per_step"] == pytest.approx(base["bytes_gathered_per_step"] / 2 / 2 * scales,
                                                         rel=0.01)  # half the bytes, half the gathers
    assert q["bytes_scattered_per_step"] == pytest.approx(base["bytes_scattered_per_step"] / 4, rel=0.01)
    # the losses stay close to fp16's: the quantizers are unbiased enough for a few steps
    assert results(zpp)["summary"]["final_loss"] == pytest.approx(results(fp16)["summary"]["final_loss"],
                                                                   rel=0.02)


@pytest.mark.dist
def test_hsdp_diloco_across_groups(tmp_path):
    """HSDP on 4 workers in 2 shard groups: DiLoCo's outer step runs across the groups on the shards
    (its bytes once per round), FSDP's collectives inside them, compressed both ways; the replicas'
    distance and averaged loss are recorded."""
    out, _ = train(tmp_path, *GPT, "max_steps=4", "engine.np=4", "sharding=hsdp", "sharding.group_size=2",
                   "sharding.gather=fp8", "sharding.scatter=loco4", "sync=diloco", "sync.inner_steps=2")
    res = results(out)
    s = res["summary"]
    assert s["sharded"]["shard_group"] == 2 and s["sharded"]["replicas"] == 2
    assert s["sharded"]["bytes_replica_per_step"] > 0  # a round's outer gradient, averaged over its steps
    assert "final_loss_averaged" in s and len(s["memory_mb"]) == 4
    rows = list(csv.DictReader((out / "scalars.csv").open()))
    replica = [float(r["value"]) for r in rows if r["tag"] == "comm/bytes_replica"]
    assert replica[0] == 0 and replica[1] > 0  # step 0 is inside a round; step 1 ends it
