"""Sweeps through Hydra's launcher plugins (compbench.cli.sweep_launcher): a 2-job sweep with the joblib
launcher (both jobs at once, in loky processes) and with submitit's local executor (each job a
submitit job), every job in compbench's own folder with its results; bad launcher input is one line
with nothing written."""

from __future__ import annotations

import json

import pytest

from tests.helpers import TINY, compbench

pytestmark = pytest.mark.dist


def _sweep(tmp_path, *launcher: str):
    sweep = tmp_path / "sweep"
    proc = compbench("train", "-m", *TINY, "max_steps=3", "eval_points=1", "checkpoint=false",
                     "compressor=none,fp16", *launcher, f"outputs_root={tmp_path}",
                     f"hydra.sweep.dir={sweep}")
    return proc, sweep


# submitit_local in the slow tier: the same path through a second plugin (joblib's covers it)
SUBMITIT = ("hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10")


@pytest.mark.parametrize("launcher", [("hydra/launcher=joblib", "hydra.launcher.n_jobs=2"),
                                      pytest.param(SUBMITIT, marks=pytest.mark.slow)],
                         ids=["joblib", "submitit_local"])
def test_a_sweep_runs_through_a_hydra_launcher_plugin(tmp_path, launcher):
    pytest.importorskip(launcher[0].partition("=")[2].partition("_")[0])  # joblib, submitit
    proc, sweep = _sweep(tmp_path, *launcher)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"2 jobs through {launcher[0]}" in proc.stdout
    jobs = {p.name: p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert sorted(jobs) == ["compressor=fp16", "compressor=none"]
    for name, job in jobs.items():
        results = json.loads((job / "results.json").read_text())
        assert results["summary"]["status"] == "completed"
        assert results["config"]["choices"]["compressor"] == name.partition("=")[2]
        assert not (job / ".hydra" / "hydra.yaml").exists()  # the plugin's files are off; the run's own stay
        assert (job / ".hydra" / "config.yaml").exists()
    # the sweep's summary table, one row per job
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])] == [
        "completed", "completed"]


@pytest.mark.parametrize(("launcher", "message"), [
    (("hydra/launcher=nope",),
     "error: hydra/launcher=nope is not an installed launcher; choose from basic, "),
    (("hydra/launcher=joblib", "hydra.launcher.n_jobs=many"),
     "error: hydra.launcher.n_jobs=many: Value 'many' of type 'str' could not be converted to Integer; "
     "hydra/launcher=joblib takes n_jobs, backend, prefer, "),
    (("hydra/launcher=submitit_local", "hydra.launcher.n_jobs=2"),
     "error: hydra.launcher.n_jobs=2: Key 'n_jobs' not in 'LocalQueueConf'; hydra/launcher=submitit_local "
     "takes submitit_folder, timeout_min, "),
    (("hydra.launcher.n_jobs=2",), "error: hydra.launcher.n_jobs is a launcher plugin's setting; pick the "
                                   "plugin too, e.g. hydra/launcher=joblib"),
])
def test_bad_launcher_input_is_one_line_and_writes_nothing(tmp_path, launcher, message):
    proc, sweep = _sweep(tmp_path, *launcher)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(message), line
    assert not sweep.exists()


def test_a_launcher_without_a_sweep_is_refused(tmp_path):
    proc = compbench("train", *TINY, "hydra/launcher=joblib", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert "a launcher (hydra/launcher=NAME) runs the jobs of a sweep (-m)" in proc.stderr
    assert not (tmp_path / "run").exists()
