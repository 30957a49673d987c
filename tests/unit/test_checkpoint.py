"""Resume checks (in the parent, before anything is written): unsafe, truncated and foreign checkpoints
are refused with one line naming the setting; checkpoints are plain data (weights_only)."""

import functools
import os
import pickle
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from compbench.compose.config import compose
from compbench.train.checkpoint import FORMAT, check_resume, math_settings, read_checkpoint, run_config
from tests.helpers import TINY

BASE = [*TINY, "engine.np=2", "compressor=topk", "ratio=0.05", "memory=dgc", "comm=allgather"]


def _cfg(*overrides: str):
    """The composed config (the shorthands that `config.check` normalizes are not used here); `resume=`
    and `output_dir=` are set on a copy of a cached composition (composing is the slow part)."""
    given = dict(o.split("=", 1) for o in overrides if o.startswith(("resume=", "output_dir=")))
    cfg = OmegaConf.create(_composed(tuple(o for o in overrides if o.split("=", 1)[0] not in given)))
    for key, value in given.items():
        cfg[key] = value
    return cfg


@functools.cache
def _composed(overrides: tuple[str, ...]) -> dict:
    other_model = any(o.startswith("model=") for o in overrides)
    cfg = compose([*(o for o in BASE if not (other_model and o.startswith("model"))), *overrides])
    return OmegaConf.to_container(cfg)


def _write(path: Path, cfg, world: int = 2, **changed) -> Path:
    """A checkpoint of `cfg`'s run as compbench writes one (its model's state as built from `cfg`), with
    `changed` entries in place of the written ones."""
    from compbench.seam.build import build_model

    model = build_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"format": FORMAT, "config": run_config(cfg), "position": {"epoch": 1, "batch": 0}, "step": 8,
             "world_size": world, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "per_rank": [{"torch_rng": torch.get_rng_state()} for _ in range(world)]}
    torch.save({**state, **changed}, path)
    return path


def _refusal(tmp_path: Path, written, *resume_overrides: str) -> str:
    path = _write(tmp_path / "checkpoint.pt", written)
    with pytest.raises(ValueError) as e:
        check_resume(_cfg(*resume_overrides, f"resume={path}"))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_same_run_is_accepted(tmp_path):
    path = _write(tmp_path / "checkpoint.pt", _cfg())
    # what may differ: the length of the run, evaluation, progress, checkpointing, the folder, on_nonfinite
    check_resume(_cfg(f"resume={path}", "epochs=3", "max_steps=5", "eval=false", "progress=true",
                      "checkpoint_every_steps=2", f"output_dir={tmp_path / 'other'}", "on_nonfinite=skip"))
    check_resume(_cfg(f"resume={tmp_path}"))  # a run directory


@pytest.mark.parametrize("written,resumed,setting", [
    (["memory=residual"], [], "memory=residual"),
    (["comm=ps"], [], "comm=ps"),
    (["scheduler=mergecomp"], [], "scheduler=mergecomp"),
    (["scheduler=mergecomp", "scheduler.groups=2"], ["scheduler=mergecomp"], "scheduler.groups=2"),
    (["seed=1"], [], "seed=1"),
    (["batch_size=16"], [], "batch_size=16"),
    (["compressor.ratio=0.1"], [], "compressor.ratio=0.1"),
    (["model.hidden=[64]"], [], "model.hidden=[64]"),
    (["model=resnet20"], [], "model=resnet20"),
    (["optim.weight_decay=0.001"], [], "optim.weight_decay=0.001"),
    ([], ["optim=adam"], "optim=sgd"),
    ([], ["engine=torch"], "engine=horovod"),
    (["dataset.train_size=512"], [], "dataset.train_size=512"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_another_runs_checkpoint_is_refused_naming_the_setting(tmp_path, written, resumed, setting):
    message = _refusal(tmp_path, _cfg(*written), *resumed)
    assert f"was written with {setting}; resume with {setting} (or start a new run)" in message


def test_another_world_size_is_refused(tmp_path):
    path = _write(tmp_path / "checkpoint.pt", _cfg(), world=4)
    with pytest.raises(ValueError, match=r"was written by 4 workers; resume with engine.np=4"):
        check_resume(_cfg(f"resume={path}"))


def test_truncated_checkpoint_is_refused(tmp_path):
    path = _write(tmp_path / "checkpoint.pt", _cfg())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"is truncated or corrupt .*; pass another checkpoint"):
        check_resume(_cfg(f"resume={path}"))


def test_not_a_checkpoint_and_old_format_are_refused(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="is not a checkpoint of tensors and plain data"):
        check_resume(_cfg(f"resume={junk}"))
    old = tmp_path / "old.pt"
    torch.save({"position": {"epoch": 1, "batch": 0}, "model": {}}, old)
    with pytest.raises(ValueError, match="older compbench"):
        check_resume(_cfg(f"resume={old}"))


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": FORMAT, "config": {}, "position": {"epoch": 1, "batch": 0}, "world_size": 2,
                "model": {"w": _RunsCode(marker)}}, path)
    with pytest.raises(ValueError, match="holds objects other than tensors and plain data"):
        read_checkpoint(path, "resume=x")
    with pytest.raises(ValueError, match="holds objects other than tensors and plain data"):
        check_resume(_cfg(f"resume={path}"))
    raw = tmp_path / "raw.pt"  # a bare pickle (not torch's zip format) of the same object
    raw.write_bytes(pickle.dumps({"model": _RunsCode(marker)}))
    with pytest.raises(ValueError, match="is not a checkpoint of tensors and plain data"):
        check_resume(_cfg(f"resume={raw}"))
    assert not marker.exists()


def test_resume_auto_is_checked_when_the_folder_holds_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    check_resume(_cfg("resume=auto", f"output_dir={run}"))  # nothing there yet: a new run
    run.mkdir()
    _write(run / "checkpoint.pt", _cfg("memory=residual"))
    with pytest.raises(ValueError, match=r"resume=auto \(.*\) was written with memory=residual"):
        check_resume(_cfg("resume=auto", f"output_dir={run}"))


def test_math_settings_leave_out_what_may_change():
    keys = math_settings(run_config(_cfg()))
    for free in ("epochs", "max_steps", "eval", "output_dir", "progress", "checkpoint", "resume", "engine.np",
                 "dataset.root", "model.pretrained", "on_nonfinite"):
        assert free not in keys
    for kept in ("model", "model.hidden", "compressor.ratio", "memory", "memory.momentum", "optim.lr", "seed",
                 "batch_size", "engine", "scheduler", "comm"):
        assert kept in keys


def test_scheduler_state_is_plain_data_and_continues_the_same(tmp_path):
    from compbench.schedulers.mergecomp import PartitionSearch
    from compbench.schedulers.secopa import SeCoPa
    from compbench.schedulers.secopa_cost import PlanLine

    search = PartitionSearch(num_tensors=6, max_groups=16, max_trials=8)
    for ms in ([3.0, 2.0], [1.0, 1.5], [2.5, 2.5]):
        search.report(search.next(), ms)
    secopa = SeCoPa()
    lines = [PlanLine("fc.weight", 12, True, 2), PlanLine("fc.bias", 3, False, 1)]
    secopa.lines = {ln.name: ln for ln in lines}
    secopa.info = {"topology": "ps", "predicted_ms": {"plan": 1.5}, "pair": (1, 2)}
    path = tmp_path / "state.pt"
    torch.save({"search": search.state_dict(), "secopa": secopa.state_dict()}, path)
    state = torch.load(path, weights_only=True)

    again = PartitionSearch(num_tensors=6, max_groups=16, max_trials=8)
    again.load_state_dict(state["search"])
    assert again.samples == search.samples and again.trials == search.trials == 3
    for ms in ([0.5, 0.5], [4.0, 4.0], [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]):  # the rest of the walk, alike
        a, b = search.next(), again.next()
        assert a == b
        if a is None:
            break
        search.report(a, ms)
        again.report(b, ms)
    other = SeCoPa()
    other.load_state_dict(state["secopa"])
    assert other.lines == secopa.lines and other.info["pair"] == [1, 2]
    fresh = SeCoPa()
    fresh.load_state_dict(SeCoPa().state_dict())  # saved before the first step: plans at its first step
    assert fresh.lines is None


@pytest.mark.parametrize("changed, message", [
    ({"per_rank": []}, "per-worker state has 0 entries for 2 workers"),
    ({"per_rank": None}, "per-worker state has no entries for 2 workers"),
    ({"per_rank": [{"torch_rng": torch.zeros(3, dtype=torch.uint8)}] * 2},
     "worker 0's generator state is not a generator's"),
    ({"optimizer": {}}, "optimizer state has no parameter groups"),
    ({"step": -1}, "step -1 is not a whole number >= 0"),
    ({"position": {"epoch": 0, "batch": -2}},
     "position {'epoch': 0, 'batch': -2} is not an epoch and a batch, whole numbers >= 0"),
    ({"position": {"epoch": 0, "batch": 10_000}}, "position (batch 10000) is past its epoch's 4 batches"),
    ({"model": "model"}, "model is not a state dict"),
])
def test_a_checkpoint_cut_or_edited_by_hand_is_refused_in_one_line(tmp_path, changed, message):
    from compbench.seam.build import build_model

    cfg = _cfg()
    path = _write(tmp_path / "checkpoint.pt", cfg, **changed)
    with pytest.raises(ValueError) as e:
        check_resume(_cfg(f"resume={path}"), build_model(cfg), 4)
    assert str(e.value) == (f"resume={path}: the checkpoint's {message}; it was not written whole by "
                            "compbench: pass another checkpoint or start a new run")


def test_a_model_of_another_shape_or_keys_is_refused(tmp_path):
    from compbench.seam.build import build_model

    cfg = _cfg()
    model = build_model(cfg)
    state = model.state_dict()
    first = next(iter(state))
    for changed, message in (
            ({**state, first: torch.zeros(1)}, f"model's {first} is of shape \\[1\\] where"),
            ({k: v for k, v in state.items() if k != first}, f"model has no {first}"),
            ({**state, "extra": torch.zeros(1)}, "model holds extra, which this model has not")):
        path = _write(tmp_path / "checkpoint.pt", cfg, model=changed)
        with pytest.raises(ValueError, match=f"the checkpoint's {message}"):
            check_resume(_cfg(f"resume={path}"), model, 4)
    check_resume(_cfg(f"resume={_write(tmp_path / 'checkpoint.pt', cfg)}"), model, 4)  # as written
