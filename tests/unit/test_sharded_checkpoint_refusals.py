"""Resuming a sharded run's checkpoint (sharding=fsdp|hsdp; its model and optimizer in a DCP folder):
what is accepted at compose time (the same workers; another number under sharding=fsdp) and what is
refused there in one line naming the fix (a sharded checkpoint resumed unsharded and the reverse, a
resharded HSDP run or one whose synchronizer keeps state of its shards, a batch that another number
of workers cannot continue from, a record or folder cut or edited by hand)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from compbench.compose.config import compose
from compbench.train.checkpoint import FORMAT, check_resume, math_settings, run_config
from tests.helpers import TINY

SHARDED = [*TINY, "engine=torch", "sharding=fsdp", "engine.np=2"]


@functools.cache
def _composed(overrides: tuple[str, ...]) -> dict:
    return OmegaConf.to_container(compose(list(overrides)))


def _cfg(*overrides: str, base: tuple[str, ...] = tuple(SHARDED)):
    """The composed config of `base` with `overrides` (a later key wins); `resume=` set on a copy."""
    given = dict(o.split("=", 1) for o in overrides if o.startswith("resume="))
    rest = [o for o in overrides if o.split("=", 1)[0] not in given]
    keys = {o.split("=", 1)[0] for o in rest}
    cfg = OmegaConf.create(_composed(tuple([*(o for o in base if o.split("=", 1)[0] not in keys), *rest])))
    for key, value in given.items():
        cfg[key] = value
    return cfg


def _meta_model(cfg):
    from compbench.seam.build import build_model

    with torch.device("meta"):
        return build_model(cfg)


def _write(folder: Path, cfg, world: int = 2, batch: int = 2, per_rank: dict[str, Any] | None = None,
           **changed: Any) -> Path:
    """A sharded checkpoint of `cfg`'s run as compbench writes one: checkpoint.pt with its record, and
    the DCP folder it names (its metadata file only: what the checks read), `changed` entries in place."""
    folder.mkdir(parents=True, exist_ok=True)
    model = _meta_model(cfg)
    names = [n for n, _ in model.named_parameters()]
    dcp = "checkpoint.step2-0123abcd.dcp"
    (folder / dcp).mkdir()
    (folder / dcp / ".metadata").write_bytes(b"")
    record = {"dcp": dcp, "layout": {"layout": cfg.sharding.layout, "shard_group": world},
              "shapes": {k: list(t.shape) for k, t in model.state_dict().items()},
              "optimizer": {"param_groups": [{"lr": 0.1, "params": names}], "state": {},
                            "sharded": {n: {"momentum_buffer": "float32"} for n in names}}}
    rank = {"memory": {}, "compressor": {}, "comm": {}, "scatter": [], **(per_rank or {})}
    state = {"format": FORMAT, "config": run_config(cfg), "position": {"epoch": 0, "batch": batch}, "step": 2,
             "world_size": world, "sharded": record,
             "per_rank": [{**rank, "torch_rng": torch.get_rng_state()} for _ in range(world)]}
    torch.save({**state, **changed}, folder / "checkpoint.pt")
    return folder


def _refusal(cfg) -> str:
    with pytest.raises(ValueError) as e:
        check_resume(cfg, _meta_model(cfg), 8)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_sharded_checkpoint_resumes_on_its_workers_and_fsdp_on_another_number(tmp_path):
    run = _write(tmp_path / "run", _cfg())
    for np in (2, 1, 4):  # batch 2 of 2 workers: batch 4 of 1, batch 1 of 4
        cfg = _cfg(f"engine.np={np}", f"resume={run}")
        check_resume(cfg, _meta_model(cfg), 8)


def test_a_batch_another_number_of_workers_cannot_continue_from_is_refused(tmp_path):
    run = _write(tmp_path / "run", _cfg(), batch=1)
    assert "resume with engine.np=2" in _refusal(_cfg("engine.np=4", f"resume={run}"))


def test_sharded_and_unsharded_checkpoints_are_refused_by_the_other(tmp_path):
    run = _write(tmp_path / "run", _cfg())
    message = _refusal(_cfg("sharding=none", "engine=horovod", f"resume={run}"))
    assert message.endswith("a sharded run (sharding=fsdp); resume with sharding=fsdp"), message
    # an unsharded run's checkpoint (its model and optimizer in the file) resumed by a sharded run
    unsharded = _cfg("sharding=none")
    torch.save({"format": FORMAT, "config": run_config(unsharded), "position": {"epoch": 0, "batch": 2},
                "step": 2, "world_size": 2, "model": {}, "optimizer": {},
                "per_rank": [{"torch_rng": torch.get_rng_state()}] * 2}, tmp_path / "checkpoint.pt")
    message = _refusal(_cfg(f"resume={tmp_path}"))
    assert "was written by a run without sharding; resume with sharding=none" in message, message


def test_the_refusal_comes_at_compose_time(tmp_path):
    from compbench.compose.config import check

    run = _write(tmp_path / "run", _cfg())
    with pytest.raises(ValueError, match="resume with sharding=fsdp"):
        check(compose([*TINY, "engine.np=2", f"resume={run}"]))


def test_a_resharded_hsdp_run_is_refused(tmp_path):
    hsdp = ("sharding=hsdp", "sharding.group_size=2")
    run = _write(tmp_path / "run", _cfg(*hsdp, "engine.np=4"), world=4)
    message = _refusal(_cfg(*hsdp, "engine.np=2", f"resume={run}"))
    assert message.endswith("resume with engine.np=4"), message
    assert "sharding=hsdp" in message


def test_a_resharded_run_whose_synchronizer_keeps_state_of_its_shards_is_refused(tmp_path):
    # LoCo's compressed errors: each worker's own, per unit, shaped as its shards
    loco = ["sharding.scatter=loco4"]
    run = _write(tmp_path / "run", _cfg(*loco), per_rank={"scatter": [{"compensated": [torch.zeros(3)]}]})
    check_resume(_cfg(*loco, f"resume={run}"))  # the same workers continue it
    message = _refusal(_cfg(*loco, "engine.np=1", f"resume={run}"))
    assert message.endswith("resume with engine.np=2"), message


def test_the_sharding_settings_must_match(tmp_path):
    run = _write(tmp_path / "run", _cfg("sharding.gather=int8"))
    message = _refusal(_cfg(f"resume={run}"))
    assert "was written with sharding.gather=int8; resume with sharding.gather=int8" in message, message


@pytest.mark.parametrize("edit,message", [
    ("folder", "sharded folder"),
    ("shape", "is of shape"),
    ("optimizer", "optimizer holds nowhere.weight"),
    ("record", "sharded record has no folder"),
])
def test_a_sharded_record_cut_or_edited_by_hand_is_refused(tmp_path, edit, message):
    cfg = _cfg()
    run = _write(tmp_path / "run", cfg)
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    record = state["sharded"]
    if edit == "folder":
        (run / record["dcp"] / ".metadata").unlink()
    elif edit == "shape":
        name = next(iter(record["shapes"]))
        record["shapes"][name] = [*record["shapes"][name], 2]
    elif edit == "optimizer":
        record["optimizer"]["sharded"]["nowhere.weight"] = {"momentum_buffer": "float32"}
    else:
        del record["shapes"]
    torch.save(state, run / "checkpoint.pt")
    got = _refusal(_cfg(f"resume={run}"))
    assert message in got and "not written whole by compbench" in got, got


def test_a_config_written_before_sharding_existed_reads_as_unsharded():
    config = run_config(_cfg("sharding=none"))
    older = {k: v for k, v in config.items() if k != "sharding"}
    older["choices"] = {k: v for k, v in config["choices"].items() if k != "sharding"}
    assert math_settings(older) == math_settings(config)


def test_a_checkpoint_removes_the_folders_its_file_does_not_name(tmp_path):
    from compbench.train.sharded_checkpoint import remove_others

    for name in ("checkpoint.step2-aa.dcp", "checkpoint.step4-bb.dcp", "checkpoint.step6-cc.dcp.tmp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".metadata").write_bytes(b"")
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    remove_others(tmp_path, "checkpoint.step4-bb.dcp")  # the previous one, and one a crash left half written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.step4-bb.dcp"]
