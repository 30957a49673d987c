"""Hydra's sweep syntax, declared ranges (dataset keys, shaped links) and output paths: the parent's
checks that keep bad input from reaching a worker or a finished benchmark."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from compbench.bench.main import _is_report
from compbench.cli.sweep import expand, plan_jobs
from compbench.compose import config
from compbench.compose.checks import check_writable_file
from compbench.data import KeyRange, idx
from compbench.network import netem
from tests.unit.test_idx import _root


def test_hydra_sweep_functions_expand_to_jobs():
    assert expand(["seed=range(3)"]) == [["seed=0"], ["seed=1"], ["seed=2"]]
    assert expand(["seed=1"]) == [["seed=1"]]  # -m with one value: one job
    assert expand(["optim=choice(sgd,adam)", "seed=range(1,3)"]) == [
        ["optim=sgd", "seed=1"], ["optim=sgd", "seed=2"], ["optim=adam", "seed=1"], ["optim=adam", "seed=2"]]
    assert expand(["compressor=glob(d*)"]) == [["compressor=dgc"], ["compressor=dragonn"]]
    assert expand(["memory=glob(*,exclude=dgc)"]) == [["memory=none"], ["memory=residual"]]


def test_a_function_sweep_composes_without_multirun_errors():
    jobs = plan_jobs(["seed=range(2)", "model=mlp"])
    assert jobs == [["seed=0", "model=mlp"], ["seed=1", "model=mlp"]]


@pytest.mark.parametrize("overrides, message", [
    (["ratio=interval(0,1)"], "interval() needs a sampling sweeper"),
    (["seed=range(0)"], "seed=range(0) gives no values to sweep"),
    (["compressor=glob(zz*)"], "compressor=glob(zz*) gives no values to sweep"),
    (["ratio="], "ratio= gives no values to sweep"),
    (["seed=glob(*)"], "picks options of a config group; seed is not one"),
    (["seed=range(0,3,0)"], "range() arg 3 must not be zero"),
    (["ratio=1,"], "sweep syntax"),
])
def test_bad_sweeps_are_one_line_value_errors(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        expand(overrides)
    assert "\n" not in str(info.value)


def test_an_empty_sweep_axis_is_refused():
    with pytest.raises(ValueError, match=r"^sweep.ratio is empty; give its values"):
        plan_jobs(["+sweep.ratio=''"])


def test_key_range_messages():
    assert KeyRange(choices=(1, 3), what="3 repeats the gray channel").problem(2) == \
        "must be 1 or 3 (3 repeats the gray channel)"
    assert KeyRange(1, null="all samples").problem(0) == "must be an integer >= 1 or null (all samples)"
    assert KeyRange(1, null="all samples").problem(None) is None
    assert KeyRange(1, 1024).problem(1024) is None and KeyRange(1, 1024).problem(1025)
    assert KeyRange(1).problem(2.5) == "must be an integer >= 1"
    assert KeyRange(1).problem(True)  # true is not 1
    assert KeyRange(0, integer=False).problem(math.nan) == "must be a number >= 0"


@pytest.mark.parametrize("overrides, message", [
    (["dataset=synthetic", "dataset.image_size=0"], "dataset.image_size=0 must be an integer from 1 to 1024"),
    (["dataset=synthetic", "dataset.channels=0"], "dataset.channels=0 must be an integer from 1 to 64"),
    (["dataset=mnist", "dataset.channels=2"],
     "dataset.channels=2 must be 1 or 3 (3 repeats the gray channel)"),
    (["+dataset.channels=1"], "dataset.channels=1 must be 3"),  # digits: 3 channels only
    (["dataset=digits", "dataset.test_fraction=1"],
     "dataset.test_fraction=1 must be a number from 0.01 to 0.99"),
    (["dataset=cifar10", "dataset.num_classes=7"], "dataset.num_classes=7 must be 10 or 100"),
    (["dataset=fashion_mnist", "dataset.train_size=0"],
     "dataset.train_size=0 must be an integer >= 1 or null (all samples)"),
])
def test_dataset_keys_are_checked_by_the_parent(overrides, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        config.check(config.compose(["model=mlp", *overrides]))


def test_a_root_with_fewer_images_than_published_is_counted(tmp_path):
    root = _root(tmp_path, n_train=50)
    assert idx.train_size_of(root=str(root)) == 50
    assert idx.train_size_of(root=str(tmp_path / "missing")) == 60000  # check_root reports it
    with pytest.raises(ValueError, match=r"batch_size=32 x 2 workers exceeds the 50 training samples"):
        config.check(config.compose(["model=mlp", "dataset=mnist", f"dataset.root={root}"]))


@pytest.mark.parametrize("value", [math.nan, math.inf, 0, -1, 1e-300, 1e9, True])
def test_link_rates_outside_the_declared_range_are_refused(value):
    with pytest.raises(ValueError, match=r"must be a number of Gbit/s > 0 within \[0.001, 1000\]"):
        netem.check_rate("--gbps", value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, 1e7])
def test_link_delays_outside_the_declared_range_are_refused(value):
    with pytest.raises(ValueError, match=r"^--latency-us .* must be >= 0 microseconds, at most 250000"):
        netem.check_delay("--latency-us", value)
    assert netem.check_delay("--latency-us", 250) == 250.0


def test_output_files_are_checked_before_the_work(tmp_path):
    check_writable_file("output", tmp_path / "new" / "deeper" / "plan.csv")  # creatable: fine
    assert not (tmp_path / "new").exists()  # and nothing was left behind
    with pytest.raises(ValueError, match=r"is a folder; pass output=FILE"):
        check_writable_file("output", tmp_path)
    with pytest.raises(ValueError, match=r"/dev/null exists and is not a folder"):
        check_writable_file("output", Path("/dev/null/p.csv"))


def test_an_output_file_compbench_did_not_write_is_refused(tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text('{"config": 1}')
    with pytest.raises(ValueError, match=r"notes.json exists and is not a benchmark report: compbench "
                                         r"overwrites only its own files; pass another output=FILE"):
        check_writable_file("output", mine, ours=_is_report, what="a benchmark report")
    ours = tmp_path / "bench.json"
    ours.write_text('{"config": {}, "environment": {}, "floors": [], "results": [], "overhead": []}')
    check_writable_file("output", ours, ours=_is_report, what="a benchmark report")  # a rerun: fine
    check_writable_file("output", tmp_path / "new.json", ours=_is_report, what="a benchmark report")


@pytest.mark.parametrize("overrides, message", [
    (["optim.name=lion"], "optim.name=lion is unknown; use sgd, adam, adamw or package.module.Class"),
    (["optim.name=collections.OrderedDict"],
     "optim.name=collections.OrderedDict is not a torch.optim.Optimizer"),
    (["optim.name=no_such_package.Opt"], "_target_ no_such_package.Opt cannot be loaded"),
    # torch's Adagrad takes lr and weight_decay but not optim=sgd's momentum
    (["optim.name=torch.optim.Adagrad"],
     "optim.momentum: optim.name=torch.optim.Adagrad takes no such argument"),
])
def test_the_optimizer_class_is_checked_by_the_parent(overrides, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        config.check(config.compose(["model=mlp", *overrides]))


def test_an_optimizer_class_that_takes_the_groups_keys_is_built():
    import torch

    from compbench.optim.optimizers import build_optimizer

    cfg = config.check(config.compose(["model=mlp", "optim=adam", "optim.name=torch.optim.Adam"]))
    keys = {k: v for k, v in cfg.optim.items() if k != "name"}
    optimizer = build_optimizer([{"params": [torch.zeros(2, requires_grad=True)]}], cfg.optim.name, **keys)
    assert type(optimizer) is torch.optim.Adam
