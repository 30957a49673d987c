"""The GPU path kept honest on a machine without one (compbench.engines.device; the GPU tier and
scripts/gpu_check.sh run it on a GPU):

- no tensor of the training path is created without naming its device: every factory call from
  compbench's code during a few steps of every compressor, memory, communicator, scheduler and
  synchronization mode names one (`device=` a tensor's, or "cpu" for the host-side ones: sizes,
  headers, draws made on the host), except where the model and the data are built on the host and
  moved there by the trainer and the loader (HOST_BUILT);
- the fused memory+encode passes and the one-pass optimizer steps take their CUDA branch where CUDA
  kernels run (the launchers replaced by twins on the CPU kernels), with the CPU's bytes;
- the placement and the engines' backends by device, with a faked torch.cuda;
- a checkpoint written on a GPU resumes on the CPU."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict
from torch.overrides import TorchFunctionMode

from compbench.catalog import registry
from compbench.compose import config
from compbench.engines import device
from compbench.train.loop import Trainer
from tests.helpers import TINY, compbench
from tests.threaded_engine import ThreadWorld

SRC = str(Path(registry.__file__).parents[1]) + "/"  # the package: every module of the training path
TORCH = str(Path(torch.__file__).parent) + "/"
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor, torch.rand,
             torch.randn, torch.randint, torch.randperm, torch.linspace, torch.eye, torch.as_tensor,
             torch.empty_strided, torch.scalar_tensor, torch.normal, torch.logspace}
# Built on the host by design, then moved by the trainer (`model.to`) and the loader (resident or
# pinned batches).
HOST_BUILT = ("models/", "data/")


class DevicelessFactories(TorchFunctionMode):
    """Records compbench's factory calls that name no device (file:line), while active in a thread."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH):
                frame = frame.f_back
            path = frame.f_code.co_filename if frame is not None else ""
            if path.startswith(SRC) and not path[len(SRC):].startswith(HOST_BUILT):
                self.sites.add(f"{path[len(SRC):]}:{frame.f_lineno}")  # type: ignore[union-attr]
        return func(*args, **kwargs)


SMALL = [*TINY, "batch_size=32", "max_steps=3", "eval_points=1", "checkpoint=false"]
# Each component at least once: every compressor on a communicator it takes, every memory, every
# communicator, scheduler and synchronization mode that runs on the threaded engine.
RUNS = [
    *([f"compressor={c}", "comm=allgather"] for c in ("topk", "dgc", "dragonn", "randk", "graddrop", "qsgd",
                                                      "terngrad", "onebit", "signsgd", "signum", "tbq",
                                                      "atomo", "natural", "rms_sign", "chunk_dct")),
    ["compressor=fp16", "comm=allreduce"],
    ["compressor=powersgd", "comm=allreduce", "compressor.start_iter=2"],
    ["compressor=sparseloco", "comm=allgather"],
    ["compressor=topk", "comm=allgather", "memory=residual"],
    ["compressor=dragonn", "comm=allgather", "memory=residual"],
    ["compressor=dgc", "comm=allgather", "memory=dgc", "memory.gradient_clipping=1.0"],
    ["compressor=efsignsgd", "comm=ps"], ["compressor=fp16", "comm=ring"],
    ["compressor=topk", "comm=hierarchical"],
    ["compressor=topk", "comm=allgather", "scheduler=mergecomp"],
    ["compressor=topk", "comm=allgather", "scheduler=bucket"],
    ["compressor=fp16", "comm=ring", "scheduler=secopa", "scheduler.gbps=0.001"],
    ["compressor=topk", "comm=allgather", "optim=adamw"],
    *([f"sync={s}", "optim=adamw", "sync.inner_steps=2"] for s in ("diloco", "noloco", "sparta_diloco")),
    ["sync=delayed_diloco", "engine=torch", "optim=adamw", "sync.inner_steps=1"],  # 3 rounds, 1 in flight
    # per-worker steps: rank 1 idles a round's second step; adaptive's allgather at each round's end
    *(["sync=diloco", "optim=adamw", "sync.inner_steps=2", f"sync.inner_steps_per_worker={s}"]
      for s in ("[2,1]", "adaptive")),
    ["sync=sparta", "optim=adamw"],
    ["sync=desloc", "optim=adamw", "sync.param_period=1", "sync.first_moment_period=1",
     "sync.second_moment_period=1"],
    ["sync=demo", "optim=sgd"], ["sync=onebit_adam", "optim=adamw", "sync.freeze_step=1"],
    ["sync=onebit_lamb", "optim=adamw", "sync.freeze_step=2"],
    ["experiment=sparseloco", "sync.inner_steps=2"],
]


def _known(run: list[str]) -> bool:
    """Options this checkout has (a compressor another test file adds is not here)."""
    for item in run:
        group, _, option = item.partition("=")
        if "." not in group and group in ("compressor", "memory", "comm", "scheduler", "sync", "experiment") \
                and option not in registry.options(group):
            return False
    return True


@pytest.mark.parametrize("run", [r for r in RUNS if _known(r)], ids=lambda r: " ".join(r))
def test_the_training_path_names_the_device_of_every_tensor_it_creates(run, tmp_path):
    # comm=hierarchical compresses between machines only: checked as allgather, swapped in as the
    # config check would let a multi-machine job (the ranks below are two emulated machines)
    cfg = config.check(config.compose([*SMALL, *(r.replace("hierarchical", "allgather") for r in run)]))
    if "comm=hierarchical" in run:
        with open_dict(cfg):
            cfg.comm = registry.option_config("comm", "hierarchical")
            cfg.choices.comm = "hierarchical"

    def rank(engine):
        with DevicelessFactories() as mode:
            Trainer(cfg, engine, tmp_path).fit()
        return mode.sites

    sites = set().union(*ThreadWorld(2, local_size=1).run(rank, name=cfg.choices["engine"]))
    assert not sites, f"tensors created without a device (name the data's, or 'cpu' host-side): {sites}"


def test_the_recorder_sees_a_factory_without_a_device():
    """The check itself: a call from compbench's code without a device is recorded, with one is not."""
    from compbench.engines import wire

    with DevicelessFactories() as mode:
        wire.header([torch.zeros(3, device="cpu")])  # names "cpu": not recorded
        exec(compile("torch.zeros(2)", SRC + "stats.py", "exec"), {"torch": torch})  # as if stats.py did
    assert mode.sites == {"stats.py:1"}


# -- placement, backends and refusals with a faked torch.cuda --------------------------------------


@pytest.fixture
def fake_gpus(monkeypatch):
    """fake_gpus(n, bf16=True): torch sees n CUDA GPUs (none is used: nothing is placed on them)."""

    def visible(n: int, bf16: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)

    return visible


def test_auto_takes_a_gpu_per_worker_or_the_cpu_and_says_why(fake_gpus):
    fake_gpus(0)
    assert device.place("auto", 2).describe() == "device cpu (auto: no CUDA GPU)"
    fake_gpus(1)
    cpu = device.place("auto", 2)
    assert (cpu.kind, cpu.why) == ("cpu", "auto: 1 GPU(s) for 2 workers, one each is needed")
    fake_gpus(2)
    auto = device.place("auto", 2)
    assert auto.describe() == "device cuda (auto: 2 worker(s) on 2 GPU(s), one each)"
    assert [auto.device(r) for r in (0, 1)] == [torch.device("cuda", 0), torch.device("cuda", 1)]
    fake_gpus(1)
    shared = device.place("cuda", 3)
    assert shared.shares_gpu and {shared.device(r) for r in range(3)} == {torch.device("cuda", 0)}
    assert device.place("cpu", 2).device(1) == torch.device("cpu")


UNUSED = "device=auto: {} for {} workers, so they train on the CPU; to train on the {}, pass "


@pytest.mark.parametrize("gpus, overrides, said", [
    (1, [], UNUSED.format("1 GPU", 2, "GPU") + "device=cuda engine=torch to share it (Horovod's NCCL takes "
                                               "one worker per GPU), or engine.np=1 (a GPU each)"),
    (1, ["engine=torch"], UNUSED.format("1 GPU", 2, "GPU") + "device=cuda to share it (gloo's CUDA "
                                                             "collectives), or engine.np=1 (a GPU each)"),
    (2, ["engine=torch", "engine.np=3"], UNUSED.format("2 GPUs", 3, "GPUs") + "device=cuda to share them "
                                         "(gloo's CUDA collectives), or engine.np=2 (a GPU each)"),
])
def test_auto_on_the_cpu_beside_fewer_gpus_than_workers_says_so_and_how(fake_gpus, gpus, overrides, said):
    """The default 2 workers on a machine with one GPU train on its CPU: one warning line at the config
    check says it, with the two ways to the GPU; the start line's reason stays."""
    fake_gpus(gpus)
    with pytest.warns(UserWarning) as caught:
        config.check(config.compose([*TINY, *overrides]))
    assert [str(w.message) for w in caught if str(w.message).startswith("device=")] == [said]


@pytest.mark.parametrize("gpus, setting, env", [
    (0, "auto", {}),  # no GPU: the CPU is the only choice
    (2, "auto", {}),  # a GPU each: CUDA
    (1, "cpu", {}),  # the CPU, chosen
    (1, "auto", {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}),  # a launcher's local rank 1: rank 0 says it
])
def test_auto_warns_only_where_it_left_gpus_unused(fake_gpus, monkeypatch, gpus, setting, env):
    fake_gpus(gpus)
    monkeypatch.setattr(device, "cupy_importable", lambda: True)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        device.check(setting, "fp32", 2, "torch", None)
    assert [str(w.message) for w in caught] == []


def test_under_a_launcher_the_fix_is_the_launchers_number_of_workers(fake_gpus, monkeypatch):
    fake_gpus(1)
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "4")
    with pytest.warns(UserWarning) as caught:
        device.check("auto", "fp32", 4, "horovod", None)
    assert [str(w.message) for w in caught] == [
        "device=auto: 1 GPU for 4 workers, so they train on the CPU; to train on the GPU, start 1 worker(s) "
        "per machine (a GPU each)"]


def test_the_torch_backend_follows_the_device():
    cuda, cpu = torch.device("cuda", 1), torch.device("cpu")
    assert device.torch_backend("auto", cpu, False) == "gloo"
    assert device.torch_backend("auto", cuda, False) == "cpu:gloo,cuda:nccl"  # host sizes over gloo
    assert device.torch_backend("nccl", cuda, False) == "cpu:gloo,cuda:nccl"
    assert device.torch_backend("auto", cuda, True) == "gloo"  # a shared GPU: gloo's CUDA collectives
    assert device.torch_backend("gloo", cuda, False) == "gloo"


def test_the_torch_engine_puts_its_rank_on_its_gpu_with_the_backend(fake_gpus, monkeypatch):
    import torch.distributed as dist

    from compbench.engines.torch_dist import TorchEngine

    fake_gpus(2)
    started, current = [], []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: started.append(backend))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    for key, value in (("LOCAL_RANK", "1"), ("RANK", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    for gpus, backend, gpu in ((2, "cpu:gloo,cuda:nccl", 1), (1, "gloo", 0)):
        engine = TorchEngine(placement=device.Placement("cuda", gpus, 2, "test"))
        assert (engine.backend, engine.device, started[-1], current[-1]) == \
            (backend, torch.device("cuda", gpu), backend, torch.device("cuda", gpu))


@pytest.mark.parametrize("overrides, gpus, message", [
    (["device=cuda"], 0, "device=cuda but torch sees no CUDA GPU here (torch.cuda.is_available() is false); "
                         "use device=cpu or device=auto"),
    (["engine=torch", "engine.backend=nccl"], 0,
     "engine.backend=nccl reduces CUDA tensors and this run trains on the CPU (auto: no CUDA GPU); use "
     "device=cuda, or engine.backend=gloo (or auto)"),
    (["engine=torch", "engine.backend=nccl", "device=cuda"], 1,
     "engine.backend=nccl needs a GPU per worker: 2 workers on 1 GPU(s); use engine.np<=1, or "
     "engine.backend=gloo (workers share a GPU over gloo's CUDA collectives)"),
    (["engine=torch", "device=cuda", "precision=bf16"], (2, False),
     "precision=bf16: this CUDA has no bfloat16 arithmetic; use precision=fp32"),
    (["engine=horovod", "device=cuda"], 2,
     "engine=horovod was built without NCCL and device=cuda hands it CUDA tensors; rebuild it with `make "
     "setup` where CUDA and NCCL are present, or use engine=torch, or device=cpu"),
    (["device=gpu"], 0, "device=gpu is unknown; use auto, cpu or cuda"),
    (["engine=torch", "budget_clock=unloaded", "max_train_s=60"], 2,
     "budget_clock=unloaded estimates a CPU step from its CPU time and this run trains on a GPU (auto: 2 "
     "worker(s) on 2 GPU(s), one each); use budget_clock=wall or device=cpu"),
])
def test_device_settings_that_cannot_hold_are_refused(fake_gpus, overrides, gpus, message):
    import horovod.torch as hvd

    if "engine=horovod" in overrides and hvd.nccl_built():
        pytest.skip("this Horovod was built with NCCL")
    fake_gpus(*(gpus if isinstance(gpus, tuple) else (gpus,)))
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, "engine.np=2", *overrides]))
    assert str(e.value) == message


def test_bf16_on_a_cpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match=r"^precision=bf16: this CPU has no bfloat16 arithmetic; use "
                                         r"precision=fp32$"):
        config.check(config.compose([*TINY, "precision=bf16"]))


def test_cuda_on_this_machine_is_one_line_and_writes_nothing(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = compbench("train", *TINY, "device=cuda", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: device=cuda but torch sees no CUDA GPU here (torch.cuda.is_available() is false); use "
        "device=cpu or device=auto"]
    assert not (tmp_path / "run").exists()


# -- checkpoints across devices -------------------------------------------------------------------


def test_a_checkpoint_written_on_a_gpu_resumes_on_the_cpu(tmp_path, monkeypatch):
    """Storages tagged cuda:0 (as a GPU run writes them) load onto the rank's device; the GPU's random
    state is kept for a GPU and ignored on the CPU."""
    import torch.serialization as serialization

    from compbench.train.checkpoint import FORMAT, read_checkpoint, restore_rng

    registry_before = list(serialization._package_registry)
    on_cpu = torch.device("cpu")

    def as_gpu(obj):  # where torch.save records a storage: cuda:0, as a GPU run would
        return "cuda:0" if getattr(obj, "device", None) == on_cpu else None

    serialization.register_package(1, as_gpu, lambda obj, location: None)
    try:
        rng = torch.get_rng_state()
        saved = {"format": FORMAT, "config": {}, "position": {"epoch": 0, "batch": 1},
                 "model": {"w": torch.ones(3)}, "per_rank": [{"torch_rng": rng, "cuda_rng": rng.clone()}]}
        torch.save(saved, tmp_path / "checkpoint.pt")
    finally:
        serialization._package_registry[:] = registry_before
    with pytest.raises(RuntimeError, match="CUDA"):  # written "on a GPU" indeed
        torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    state = read_checkpoint(tmp_path / "checkpoint.pt", "resume=DIR", map_location=torch.device("cpu"))
    assert state["model"]["w"].device == torch.device("cpu")
    torch.manual_seed(123)
    restore_rng(state["per_rank"][0], torch.device("cpu"))  # the CPU's state back; the GPU's ignored
    assert torch.equal(torch.get_rng_state(), rng)


def test_bf16_autocasts_forward_and_keeps_gradients_and_the_pipeline_in_fp32(tmp_path):
    if not device.bf16_supported("cpu"):
        pytest.skip("this CPU has no bfloat16 arithmetic")
    cfg = config.check(config.compose([*SMALL, "precision=bf16", "compressor=topk", "comm=allgather",
                                       "memory=residual", "max_steps=6"]))

    def rank(engine):
        trainer = Trainer(cfg, engine, tmp_path)
        seen = []
        hook = trainer.model.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
        trainer.fit()
        hook.remove()
        return seen, {p.grad.dtype for p in trainer.model.parameters()}, trainer.recorder

    seen, grads, recorder = ThreadWorld(2).run(rank)[0]
    assert set(seen) == {torch.bfloat16} and grads == {torch.float32}
    losses = recorder.history["train/loss"]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
