"""End-to-end runs through the real CLI, launcher and engines (2 gloo ranks on CPU)."""

import math

import pytest
import torch

from compbench.compressors import build_compressor
from compbench.models.mlp import mlp
from tests.helpers import TINY, event_tags, params, results, train

pytestmark = pytest.mark.dist


# Suite time: torch's run in the slow tier (the engines' parity is tests/dist/test_engine_parity.py)
@pytest.mark.parametrize("engine", ["horovod", pytest.param("torch", marks=pytest.mark.slow)])
def test_two_workers_equal_one_worker_with_double_batch(tmp_path, engine):
    common = [*TINY, "compressor=none", "eval=false", "max_steps=5", "epochs=1", f"engine={engine}"]
    two, _ = train(tmp_path, *common, "engine.np=2", "batch_size=8", name="two")
    one, _ = train(tmp_path, *common, "engine.np=1", "batch_size=16", name="one")
    p2, p1 = params(two), params(one)
    assert results(two)["summary"]["steps"] == results(one)["summary"]["steps"] == 5
    for k in p1:
        torch.testing.assert_close(p2[k], p1[k], atol=1e-5, rtol=0)
    # The comparison is not vacuous: 5 steps moved the weights away from their shared start.
    torch.manual_seed(0)
    start = mlp(num_classes=10, image_size=8, in_chans=3, hidden=[32]).state_dict()
    assert max((p1[k] - start[k]).abs().max().item() for k in start) > 1e-3


@pytest.mark.parametrize("comm", ["allgather", "ps"])
def test_every_communicator_averages_like_allreduce(tmp_path, comm):
    common = [*TINY, "compressor=none", "eval=false", "max_steps=4", "epochs=1", "engine.np=2"]
    ref, _ = train(tmp_path, *common, "comm=allreduce", name="allreduce")
    other, _ = train(tmp_path, *common, f"comm={comm}", name=comm)
    p_ref, p_other = params(ref), params(other)
    for k in p_ref:
        torch.testing.assert_close(p_other[k], p_ref[k], atol=1e-6, rtol=0)


def test_fp16_sends_half_the_bytes_of_none(tmp_path):
    common = [*TINY, "max_steps=3", "epochs=1", "eval=false", "engine.np=2"]
    none, _ = train(tmp_path, *common, "compressor=none", name="none")
    half, _ = train(tmp_path, *common, "compressor=fp16", name="fp16")
    numel = sum(v.numel() for v in params(none).values())
    s_none, s_half = results(none)["summary"], results(half)["summary"]
    assert s_none["bytes_sent_per_step"] == 4 * numel == s_none["bytes_dense_per_step"]
    assert s_half["bytes_sent_per_step"] == 2 * numel
    assert s_half["ratio_effective"] == 2.0


def test_bytes_and_calls_are_booked_per_path(tmp_path):
    """min_dims=2: biases travel dense through the allreduce, weights compressed through allgather;
    results.json splits bytes and collective counts by path (the what-if model reads them)."""
    out, _ = train(tmp_path, *TINY, "max_steps=3", "epochs=1", "eval=false", "engine.np=2", "compressor=topk",
                   "ratio=0.5", "memory=residual", "comm=allgather", "+compressor.min_dims=2")
    p = params(out)
    dense = [v for v in p.values() if v.dim() < 2]
    sparse = [v for v in p.values() if v.dim() >= 2]
    s = results(out)["summary"]
    assert s["bytes_allreduce_per_step"] == 4 * sum(v.numel() for v in dense) > 0
    assert s["dense_calls_per_step"] == len(dense) and s["compressed_calls_per_step"] == len(sparse) > 0
    topk_bytes = sum(8 * math.ceil(0.5 * v.numel()) for v in sparse)
    assert s["bytes_sent_per_step"] == s["bytes_allreduce_per_step"] + topk_bytes


def test_a_uniform_sample_is_booked_and_priced_in_the_compress_floor(tmp_path):
    """dragonn draws its threshold from a uniform sample: the pipeline books its reads per step
    (the compressed tensors' `sampled_reads`), and the run's floors price them."""
    out, _ = train(tmp_path, *TINY, "max_steps=3", "epochs=1", "eval=false", "engine.np=2",
                   "compressor=dragonn", "ratio=0.01", "comm=allgather", "memory=none")
    comp = build_compressor("dragonn", ratio=0.01)
    want = sum(comp.sampled_reads(v.numel()) for v in params(out).values())
    r = results(out)
    assert r["summary"]["sampled_reads_per_step"] == want > 0
    assert r["floors"]["sampled_read_ns"] > 0
    assert f"{want:,} sampled reads" in r["floors"]["phases"]["compress"]["basis"]


@pytest.mark.slow
def test_default_run_meets_accuracy(tmp_path):
    out, proc = train(tmp_path, "progress=false")
    summary = results(out)["summary"]
    assert summary["final_acc1"] >= 95.0, summary  # its time is a benchmark's business, not a test's
    assert str(out) in proc.stdout
    tags = event_tags(out)
    expected = {"train/loss", "train/throughput", "eval/acc1", "comm/bytes_sent", "comm/bytes_dense",
                "comm/ratio_effective",
                *(f"time/{p}_ms" for p in ("compute", "compress", "comm", "decompress", "step"))}
    assert expected <= tags, expected - tags
    assert (out / ".hydra" / "config.yaml").is_file()
    env = results(out)["environment"]
    assert env["world_size"] == 2 and env["engine"] == "horovod" and not math.isnan(summary["throughput"])
