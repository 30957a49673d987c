"""Baselines inside compbench: sync=ddp (torch DistributedDataParallel and its hooks) and
sync=horovod_optimizer (hvd.DistributedOptimizer) train exactly like compbench's own dense path and
record the bytes they really send."""

import math

import pytest
import torch

from compbench.models.mlp import mlp
from compbench.sync import ddp, horovod_optimizer
from tests.helpers import TINY, params, results, train

COMMON = [*TINY, "compressor=none", "eval=false", "max_steps=3", "epochs=1", "engine.np=2"]
NUMEL = 3 * 8 * 8 * 32 + 32 + 32 * 10 + 10  # the tiny MLP: 192 -> 32 -> 10


# slow tier: ~15 s of external baselines (DDP, Horovod) training; the e2e bench's small matrix runs them
@pytest.mark.slow
@pytest.mark.dist
def test_baselines_train_like_compbench_none(tmp_path):
    ref, _ = train(tmp_path, *COMMON, "engine=torch", "comm=allreduce", name="compbench")
    runs = {
        "ddp": train(tmp_path, *COMMON, "engine=torch", "sync=ddp", name="ddp")[0],
        "horovod_optimizer": train(tmp_path, *COMMON, "engine=horovod", "sync=horovod_optimizer",
                                   name="hvd")[0],
    }
    p_ref = params(ref)
    assert sum(v.numel() for v in p_ref.values()) == NUMEL
    for name, run in runs.items():
        p = params(run)
        assert p.keys() == p_ref.keys(), name  # checkpoints keep the plain model's keys (no "module.")
        for k in p_ref:
            torch.testing.assert_close(p[k], p_ref[k], atol=1e-5, rtol=0, msg=f"{name}: {k}")
        res = results(run)
        s = res["summary"]
        assert s["steps"] == 3, (name, s)
        assert s["bytes_sent_per_step"] == s["bytes_dense_per_step"] == 4 * NUMEL, (name, s)
        assert res["scheduler"]["name"] == name
        assert math.isfinite(s["comm_ms"]) and s["comm_ms"] >= 0 and s["compute_ms"] > 0, (name, s)
    # Not vacuous: three steps moved the weights away from their shared start.
    torch.manual_seed(0)
    start = mlp(num_classes=10, image_size=8, in_chans=3, hidden=[32]).state_dict()
    assert max((p_ref[k] - start[k]).abs().max().item() for k in start) > 1e-3


def _powersgd_elements(shapes: list[tuple[int, ...]], rank: int) -> int:
    """What torch's PowerSGD hook sends: q(rows+cols) per matrix worth compressing, else dense."""
    total = 0
    for shape in shapes:
        rows, cols = shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1
        q = min(rows, cols, rank)
        total += q * (rows + cols) if 2 * q * (rows + cols) < rows * cols else rows * cols
    return total


@pytest.mark.dist
def test_ddp_powersgd_records_its_wire_bytes(tmp_path):
    # 4 steps: PowerSGD starts at step 2 (start_powersgd_iter), the summary is the last step's.
    common = [*COMMON, "max_steps=4"]
    psgd, _ = train(tmp_path, *common, "engine=torch", "sync=ddp", "sync.hook=powersgd", name="powersgd")
    shapes = [tuple(v.shape) for v in params(psgd).values()]
    s = results(psgd)["summary"]
    assert s["bytes_sent_per_step"] == 4 * _powersgd_elements(shapes, 1) == 4 * (224 + 42 + 32 + 10), s
    assert s["bytes_dense_per_step"] == 4 * NUMEL
    assert results(psgd)["scheduler"]["hook"] == "powersgd"
    assert math.isfinite(s["final_loss"])


def test_baseline_checks_name_the_fix():
    from compbench.compose import config

    for overrides, fix in ((["sync=ddp", "engine=horovod"], "add engine=torch"),
                           (["sync=horovod_optimizer", "engine=torch"], "add engine=horovod"),
                           (["sync=ddp", "engine=torch", "compressor=dgc"], "drop compressor="),
                           (["sync=ddp", "engine=torch", "scheduler=mergecomp"], "drop scheduler="),
                           (["sync=ddp", "engine=torch", "comm=allgather"], "drop comm="),
                           (["comm=ddp", "engine=torch"], "pass sync=ddp"),
                           (["sync=ddp", "engine=torch", "comm.hook=fp16"], "pass sync=ddp sync.hook=fp16"),
                           (["comm=horovod_optimizer"], "pass sync=horovod_optimizer")):
        with pytest.raises(ValueError, match=fix):
            config.check(config.compose([*COMMON, *overrides]))
    with pytest.raises(ValueError, match="sync.hook=randk is unknown"):
        ddp.check_options(hook="randk")
    with pytest.raises(ValueError, match="sync.topk_ratio=0 is outside"):
        ddp.check_options(hook="topk", topk_ratio=0)
    with pytest.raises(ValueError, match="start_powersgd_iter=1 must be >= 2"):
        ddp.check_options(hook="powersgd", start_powersgd_iter=1)
    with pytest.raises(ValueError, match="sync.compression=bf16 is unknown"):
        horovod_optimizer.check_options(compression="bf16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="use sync.hook=fp16"):
            ddp.check_options(hook="bf16")


@pytest.mark.dist
def test_ddp_topk_hook_sends_padded_top_k(tmp_path):
    # One DDP bucket holds every gradient: 1.5k padded fp32 values + int64 indices per rank.
    run, _ = train(tmp_path, *COMMON, "engine=torch", "sync=ddp", "sync.hook=topk", "sync.topk_ratio=0.05",
                   name="topk")
    s = results(run)["summary"]
    k = math.ceil(NUMEL * 0.05)
    assert s["bytes_sent_per_step"] == 12 * math.ceil(1.5 * k), s
    assert s["bytes_dense_per_step"] == 4 * NUMEL and math.isfinite(s["final_loss"])
    assert results(run)["scheduler"] == {"name": "ddp", "hook": "topk", "bucket_cap_mb": 25.0,
                                         "broadcast_buffers": True, "topk_ratio": 0.05}
