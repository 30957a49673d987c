"""Run folder names: sweep jobs by their differing overrides (Hydra's override_dirname
convention), single runs by the time and their main choices; the sweep summary keeps them whole."""

import re

import pytest

from compbench.cli.sweep import _table, expand
from compbench.compose import config
from compbench.records.rundir import (
    claim_fresh,
    hydra_quoted,
    job_names,
    now_dir,
    run_label,
    safe_name,
    split_overrides,
)


def test_jobs_are_named_by_the_overrides_that_differ_sorted_by_key():
    jobs = expand(["ratio=1e-2,1e-3", "compressor=dgc,topk", "comm=allgather", "engine.np=2"])
    assert job_names(jobs) == ["compressor=dgc,ratio=0.01", "compressor=topk,ratio=0.01",
                               "compressor=dgc,ratio=0.001", "compressor=topk,ratio=0.001"]
    own, common = split_overrides(jobs)
    assert own[0] == ["compressor=dgc", "ratio=0.01"] and common == ["comm=allgather", "engine.np=2"]


def test_a_single_job_is_named_by_all_its_overrides():
    assert job_names([["seed=3", "compressor=dgc"]]) == ["compressor=dgc,seed=3"]
    assert job_names([[]]) == ["job"]
    assert split_overrides([["seed=3"]]) == ([["seed=3"]], [])


def test_a_key_missing_from_some_jobs_differs():
    assert job_names([["seed=0"], ["seed=0", "model=mlp"]]) == ["seed=0", "model=mlp"]


def test_names_are_safe_folder_names_and_collisions_get_an_index():
    names = job_names([["dataset.root=/data/a b"], ["dataset.root=/data/a_b"], ["dataset.root=/x"]])
    assert names == ["0_dataset.root=_data_a_b", "1_dataset.root=_data_a_b", "dataset.root=_x"]
    assert job_names([["seed=0"], ["seed=0"]]) == ["0_seed=0", "1_seed=0"]  # duplicate jobs
    assert safe_name("model.hidden=[32,32]") == "model.hidden=[32,32]"
    long = safe_name("a=" + "x" * 400)
    assert len(long) == 160 and long != safe_name("a=" + "x" * 399)  # cut, a hash keeps them apart


def test_job_folder_is_passed_to_hydra_quoted(tmp_path):
    for name in ("compressor=dgc,ratio=0.01", "it's", "back\\slash\\"):
        path = str(tmp_path / name)
        assert config.compose([f"output_dir={hydra_quoted(path)}"]).output_dir == path


def test_single_run_folder_is_time_and_main_choices(tmp_path):
    cfg = config.check(config.compose(["compressor=dgc", "ratio=1e-3", "comm=allgather"]))
    assert run_label(cfg) == "dgc-0.001_allgather_resnet20"
    assert run_label(config.check(config.compose([]))) == "none_allreduce_resnet20"
    path = now_dir(tmp_path, run_label(cfg))
    assert re.fullmatch(r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d_dgc-0.001_allgather_resnet20",
                        str(path.relative_to(tmp_path)))
    # the atomic claim still keeps two runs started in the same second apart
    assert claim_fresh(path) == path and claim_fresh(path).name == f"{path.name}-1"


@pytest.mark.parametrize("width", [80, 200])
def test_sweep_summary_wraps_overrides_and_never_cuts_them(monkeypatch, width):
    monkeypatch.setenv("COLUMNS", str(width))
    job = "compressor=dgc ratio=0.001 " + " ".join(f"memory.key{i}=value{i}" for i in range(8))
    done = {"status": "completed", "final_acc1": 91.0, "throughput": 1234.0, "ratio_effective": 9.9}
    out = _table([(1, job, 0, done)], ["comm=allgather", "engine.np=2"])
    assert out.splitlines()[0] == "common: comm=allgather engine.np=2"
    assert " ".join(out.split()).count(job) == 1  # every override, whole
    assert max(len(line) for line in out.splitlines()) <= width
