"""compbench.base.settings: the run's top-level keys, typed, and their one set of checks."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from compbench.base.settings import RunSettings
from compbench.catalog import registry
from compbench.compose import config

# Top-level keys that are not run settings: the ratio shorthand (compbench.compose.config) and the sweep's.
# Not RunSettings: Hydra's and the sweep's keys, and the loggers' (checked by compbench.train.loggers).
NOT_SETTINGS = {"defaults", "ratio", "sweep", "jobs", "loggers", "mlflow"}


def test_every_top_level_key_of_train_yaml_is_a_typed_setting():
    yaml = OmegaConf.load(registry.conf_dir() / "train.yaml")
    assert {f.name for f in dataclasses.fields(RunSettings)} == set(yaml) - NOT_SETTINGS


def test_the_defaults_read_as_their_types():
    s = RunSettings.of(config.compose(["model=mlp", "dataset=synthetic"]))
    assert (s.epochs, s.max_steps, s.threads, s.eval, s.on_nonfinite) == (8, None, None, True, "raise")
    assert isinstance(s.outputs_root, str)


@pytest.mark.parametrize(("override", "message"), [
    ("epochs=0", "epochs=0 must be an integer >= 1"),
    ("max_steps=-1", "max_steps=-1 must be an integer >= 1; or max_steps=null for no limit"),
    ("threads=1.5", "threads=1.5 must be an integer >= 1; or threads=null for cores / workers"),
    ("progress=1", "progress=1 must be true or false"),
    ("on_nonfinite=warn", "on_nonfinite=warn is unknown; use raise, skip or ignore"),
])
def test_a_bad_setting_is_one_line_naming_the_key(override, message):
    cfg = config.compose(["model=mlp", "dataset=synthetic", override])
    with pytest.raises(ValueError) as e:
        RunSettings.of(cfg)
    assert str(e.value) == message


def test_a_folder_named_like_a_number_is_a_path():
    assert RunSettings.of(config.compose(["model=mlp", "output_dir=3"])).output_dir == "3"


@pytest.mark.parametrize("overrides, message", [
    (["scheduler.overlap=no"], "scheduler.overlap=no must be true or false"),
    (["optim.fused=1"], "optim.fused=1 must be true or false"),
    (["compressor=randk", "compressor.scale=yes"], "compressor.scale=yes must be true or false"),
    (["sync=diloco", "optim=adamw", "sync.eager=0"], "sync.eager=0 must be true or false"),
])
def test_a_groups_booleans_take_only_booleans(overrides, message):
    from compbench.compose import config
    from tests.helpers import TINY

    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, *overrides]))
    assert str(e.value) == message


@pytest.mark.parametrize("nice, euid, message", [
    (20, 0, "nice=20 must be an integer within [-20, 19] (the workers' CPU priority, -20 first)"),
    (-21, 0, "nice=-21 must be an integer >= -20; or nice=null to keep this process's priority"),
    (-5, 1000, "nice=-5 raises the workers' CPU priority, which needs root; run as root or pass nice=0 or "
               "higher"),
])
def test_a_priority_out_of_range_or_above_this_users_is_refused(monkeypatch, nice, euid, message):
    import os

    from tests.helpers import TINY

    monkeypatch.setattr(os, "geteuid", lambda: euid)
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, f"nice={nice}"]))
    assert str(e.value) == message


def test_the_workers_run_at_the_priority_set(tmp_path):
    import json

    from tests.helpers import TINY, compbench

    proc = compbench("train", *TINY, "engine=torch", "engine.np=1", "max_steps=2", "nice=7",
                     "checkpoint=false", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run" / "results.json").read_text())["environment"]["nice"] == 7
