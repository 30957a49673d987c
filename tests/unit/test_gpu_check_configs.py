"""The GPU check's device-only logic on this CPU (issue 48): every configuration scripts/gpu_check.py
runs composes and passes the config check under a faked CUDA with Horovod unimportable (the lent GPU
machine has no Horovod), and the Horovod CUDA check asks for the capability that matters (NCCL)."""

from __future__ import annotations

import importlib.util
import sys
import time
import types
import warnings
from pathlib import Path

import pytest
import torch

from compbench.compose import config
from compbench.engines import device

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch sees one CUDA GPU with bf16 (nothing is placed on it: the config check only)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def _fake_horovod(monkeypatch, cuda: bool, nccl: bool) -> None:
    package, module = types.ModuleType("horovod"), types.ModuleType("horovod.torch")
    module.cuda_built = lambda: cuda  # type: ignore[attr-defined]
    module.nccl_built = lambda: nccl  # type: ignore[attr-defined]
    package.torch = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "horovod", package)
    monkeypatch.setitem(sys.modules, "horovod.torch", module)


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_configuration_of_the_check_composes_on_a_faked_gpu_without_horovod(fake_cuda, monkeypatch):
    """Sections 3, 4 and 6 with device=cuda on a machine like the lent one: one GPU, no Horovod (a
    configuration that reaches the default engine's CUDA check imports it and fails here)."""
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    gpu_check = _gpu_check()
    runs = gpu_check.configurations("cuda")
    jobs = gpu_check.real_jobs_config("cuda")
    assert len(runs) == len(gpu_check.METHODS) + len(jobs) + len(gpu_check.RESNET_METHODS)
    assert any("sharding=fsdp" in job for job in jobs.values())  # FSDP2 on the device
    refused = []
    for overrides in runs:
        assert "device=cuda" in overrides and "engine=torch" in overrides, overrides
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # device=cuda without CuPy here: a warning, not a refusal
                cfg = config.check(config.compose(overrides))
        except (ValueError, ImportError) as e:
            refused.append(f"{' '.join(overrides)}: {e}")
            continue
        assert cfg.device == "cuda" and cfg.choices["engine"] == "torch"
    assert not refused, "\n".join(refused)


def test_without_engine_torch_the_check_would_fail_on_the_gpu(fake_cuda, monkeypatch):
    """The mistake the test above catches: the default engine with device=cuda on a machine without
    Horovod is refused at the config check."""
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    overrides = [o for o in _gpu_check().configurations("cuda")[0] if o != "engine=torch"]
    with pytest.raises((ValueError, ImportError)):
        config.check(config.compose(overrides))


def test_device_specific_draws_are_listed_and_compared_on_statistics():
    """graddrop and SPARTA draw on the device's generator: their rows are named, with a reason, and
    compared on statistics; qsgd and terngrad join them only when a kernel is missing on a side."""
    gpu_check = _gpu_check()
    assert gpu_check.device_draws(["compressor=graddrop", "comm=allgather"], True)
    assert gpu_check.device_draws(["sync=sparta", "optim=adamw"], True)
    assert gpu_check.device_draws(["compressor=topk", "comm=allgather"], True) is None
    assert gpu_check.device_draws(["compressor=qsgd", "comm=allgather"], True) is None
    assert gpu_check.device_draws(["compressor=qsgd", "comm=allgather"], False)
    got = {"bytes": [100, 120], "loss": [1.0, 0.9], "params": [torch.zeros(3)]}
    near = {"bytes": [110, 118], "loss": [1.0, 0.9], "params": [torch.full((3,), 0.5)]}
    assert gpu_check._compare_row(got, near, "draws")[0]  # bytes within 25%, parameters not gated
    assert not gpu_check._compare_row(got, near, None)[0]  # exact rows: bytes and parameters gated
    assert gpu_check._compare_row(got, {**got, "params": [torch.full((3,), 1e-4)]}, None)[0]


@pytest.mark.parametrize("cuda,nccl,refused", [(True, False, True), (True, True, False),
                                               (False, True, False)])
def test_the_horovod_cuda_check_asks_for_nccl(monkeypatch, cuda, nccl, refused):
    """CUDA tensors reach Horovod's NCCL path: a CUDA build without NCCL is refused, an NCCL build
    taken, whatever `cuda_built` says."""
    _fake_horovod(monkeypatch, cuda, nccl)
    placement = device.Placement("cuda", 1, 1, "test")
    if refused:
        with pytest.raises(ValueError, match="^engine=horovod was built without NCCL"):
            device._check_horovod_cuda(placement)
    else:
        device._check_horovod_cuda(placement)


def test_the_ring_hop_pairs_each_send_with_its_receive(monkeypatch):
    """engines/torch_dist.py `shift`: the header round and the blob round each go out as one batch
    holding the send and the receive (NCCL pairs a batch; unpaired, two ranks' large blob sends wait
    for receives queued behind them). A loopback world: what a rank sends is what it receives."""
    import torch.distributed as dist

    from compbench.engines.torch_dist import TorchEngine

    batches: list[list[str]] = []

    class Done:
        def wait(self) -> None:
            pass

    def batch(ops):
        batches.append([op.op.__name__ for op in ops])
        sends = [op.tensor for op in ops if op.op is dist.isend]
        for op in ops:
            if op.op is dist.irecv:
                op.tensor.copy_(sends[0])
        return [Done() for _ in ops]

    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    def p2p(op, tensor, peer=None, group=None, tag=0, group_peer=None):
        return types.SimpleNamespace(op=op, tensor=tensor, peer=group_peer if peer is None else peer)

    monkeypatch.setattr(dist, "P2POp", p2p)
    engine = TorchEngine.__new__(TorchEngine)
    engine.backend = "gloo"
    payload = [torch.arange(5, dtype=torch.float32), torch.tensor([3, 1], dtype=torch.int64)]
    got = engine.shift(payload, 0, 0, "t")
    assert batches == [["isend", "irecv"], ["isend", "irecv"]]
    assert all(torch.equal(a, b) for a, b in zip(got, payload, strict=True))


def test_a_gpu_tier_that_only_skipped_fails_on_a_gpu():
    """Section 2 on a GPU: this CPU's run of the tier skips every test, which must read FAILED."""
    gpu_check = _gpu_check()
    assert gpu_check.gpu_tier(torch.device("cuda"), time.monotonic() + 60).startswith("FAILED")
    assert not gpu_check.gpu_tier(torch.device("cpu"), time.monotonic() + 60).startswith("FAILED")


def test_the_report_is_written_after_every_section_and_says_what_was_skipped(tmp_path):
    gpu_check = _gpu_check()
    report = gpu_check.Report(tmp_path / "report.md", "cpu")
    report.section(3, "rows past their deadline", lambda d: gpu_check.threaded_methods(torch.device("cpu"),
                                                                                       time.monotonic()))
    text = (tmp_path / "report.md").read_text()
    assert text.count(gpu_check.SPENT) == len(gpu_check.METHODS)
    assert "SKIPPED at their deadline: 3. rows past their deadline" in text.splitlines()[2]
    report.section(5, "a section that fails", lambda d: str(1 / 0))
    assert "## 5. a section that fails: FAILED" in (tmp_path / "report.md").read_text()
