"""A launcher plugin's settings checked before a sweep starts (compbench.cli.launcher_settings): each bad
value is one line naming the key and what it must be; the plugins' defaults and good values pass."""

from __future__ import annotations

import pytest

from compbench.cli.sweep_launcher import prepare

JOBLIB, LOCAL = "hydra/launcher=joblib", "hydra/launcher=submitit_local"
SLURM = "hydra/launcher=submitit_slurm"


@pytest.mark.parametrize("overrides, message", [
    ([JOBLIB, "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0 must be a whole number from 1 to "),
    ([JOBLIB, "hydra.launcher.n_jobs=-100"], "hydra.launcher.n_jobs=-100 must be"),
    ([JOBLIB, "hydra.launcher.n_jobs=100000"], "hydra.launcher.n_jobs=100000 must be"),
    ([JOBLIB, "hydra.launcher.prefer=nope"],
     "hydra.launcher.prefer=nope must be one of null, processes, threads (hydra/launcher=joblib)"),
    ([JOBLIB, "hydra.launcher.backend=nope"],
     "hydra.launcher.backend=nope must be one of null, loky, multiprocessing, threading, sequential"),
    ([LOCAL, "hydra.launcher.nodes=0"],
     "hydra.launcher.nodes=0 must be a whole number from 1 to 1 (hydra/launcher=submitit_local)"),
    ([LOCAL, "hydra.launcher.timeout_min=-1"], "hydra.launcher.timeout_min=-1 must be a whole number >= 1"),
    ([LOCAL, "hydra.launcher.tasks_per_node=0"],
     "hydra.launcher.tasks_per_node=0 must be a whole number >= 1"),
])
def test_a_value_the_plugin_cannot_run_with_is_one_line(overrides, message):
    with pytest.raises(ValueError) as e:
        prepare(overrides)
    assert str(e.value).startswith(message), str(e.value)


def test_a_gpu_per_node_needs_that_many_gpus_here(monkeypatch):
    from compbench.engines import device

    monkeypatch.setattr(device, "visible_gpus", lambda: 0)
    with pytest.raises(ValueError, match=r"^hydra.launcher.gpus_per_node=1 must be null, or a whole number "
                                         r"up to this machine's 0 GPU\(s\)"):
        prepare([LOCAL, "hydra.launcher.gpus_per_node=1"])
    monkeypatch.setattr(device, "visible_gpus", lambda: 2)
    assert prepare([LOCAL, "hydra.launcher.gpus_per_node=1"]) is not None


def test_slurm_needs_sbatch(monkeypatch):
    import compbench.cli.launcher_settings as settings

    monkeypatch.setattr(settings.shutil, "which", lambda program: None)
    with pytest.raises(ValueError, match=r"^hydra/launcher=submitit_slurm submits the jobs to SLURM with "
                                         r"sbatch, which this machine lacks"):
        prepare([SLURM, "hydra.launcher.partition=gpu"])
    monkeypatch.setattr(settings.shutil, "which", lambda program: f"/usr/bin/{program}")
    assert prepare([SLURM, "hydra.launcher.partition=gpu"]) is not None


@pytest.mark.parametrize("overrides", [[JOBLIB], [JOBLIB, "hydra.launcher.n_jobs=2"], [LOCAL]])
def test_the_defaults_and_good_values_pass(overrides):
    assert prepare(overrides) is not None
