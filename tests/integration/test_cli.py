"""Hydra habits on the command line (--cfg job|hydra|all, --info, --help [GROUP], sweep functions,
-m with one value) and every subcommand's bad input as one `error:` line with exit code 2. All of
these exit before any training."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import TINY, compbench, train


def _one_error_line(proc, expected: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert expected in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


def test_cfg_job_prints_the_checked_job_config(tmp_path):
    proc = compbench("train", "--cfg", "job", "compressor=dgc", "comm=allgather", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert job["choices"]["compressor"] == "dgc" and job["choices"]["comm"] == "allgather"
    assert "hydra" not in job and job["recipe"] == {"memory": "dgc"}
    bare = compbench("train", "--cfg", "compressor=dgc", "comm=allgather", cwd=tmp_path)  # bare: job
    assert bare.returncode == 0 and bare.stdout == proc.stdout
    assert not (tmp_path / "outputs").exists()


def test_cfg_hydra_and_all(tmp_path):
    hydra = yaml.safe_load(compbench("train", "--cfg", "hydra", "model=mlp", cwd=tmp_path).stdout)
    assert list(hydra) == ["hydra"] and "model=mlp" in hydra["hydra"]["overrides"]["task"]
    both = yaml.safe_load(compbench("train", "-c", "all", "model=mlp", cwd=tmp_path).stdout)
    assert "hydra" in both and both["choices"]["model"] == "mlp"


def test_info_shows_search_path_defaults_and_groups(tmp_path):
    proc = compbench("train", "--info", "compressor=dgc", "comm=allgather", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Config search path" in out and "file://" in out and "pkg://hydra.conf" in out
    lines = out.splitlines()
    assert any(ln.split()[:3] == ["compressor", "dgc", "(command"] for ln in lines), out
    assert any(ln.split()[:3] == ["memory", "dgc", "(compressor=dgc's"] for ln in lines), out
    assert any(ln.split()[:2] == ["model", "resnet20"] for ln in lines), out
    assert "Config groups:" in out and "Composed config" in out
    only = compbench("train", "--info", "searchpath", cwd=tmp_path).stdout
    assert "Config search path" in only and "Defaults list" not in only


def test_no_progress_bar_where_no_terminal_shows_it(tmp_path):
    """progress=true (the default) draws tqdm's bar on a terminal only: a log file would hold every redraw."""
    run, proc = train(tmp_path, *[o for o in TINY if o != "progress=false"], "progress=true", "max_steps=3")
    assert "it/s" not in proc.stderr and "\r" not in proc.stderr, proc.stderr[-500:]


def test_train_help_and_per_group_help(tmp_path):
    proc = compbench("train", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for text in ("usage: compbench train", "--cfg [job|hydra|all]", "--info", "range(", "glob(",
                 "config groups", "compressor  none", "batch_size: 32"):
        assert text in proc.stdout, text
    group = compbench("train", "--help", "compressor", cwd=tmp_path)
    assert group.returncode == 0 and group.stdout.startswith("compressor (default none;")
    assert "  dgc " in group.stdout and "ratio=0.01" in group.stdout
    assert compbench("train", "compressor", "--help", cwd=tmp_path).stdout == group.stdout


def test_hydra_sweep_functions_and_one_value_with_multirun(tmp_path):
    proc = compbench("train", "-m", "seed=range(3)", "model=mlp", "--cfg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    heads = [ln for ln in proc.stdout.splitlines() if ln.startswith("# job")]
    assert heads == [f"# job {i + 1}/3: seed={i} model=mlp" for i in range(3)]
    glob = compbench("train", "-m", "compressor=glob(d*)", "comm=allgather", "--cfg", cwd=tmp_path)
    assert [ln for ln in glob.stdout.splitlines() if ln.startswith("# job")] == [
        "# job 1/2: compressor=dgc comm=allgather", "# job 2/2: compressor=dragonn comm=allgather"]
    one = compbench("train", "-m", "seed=1", "--cfg", cwd=tmp_path)
    assert one.returncode == 0 and one.stdout.startswith("# job 1/1: seed=1\n")
    assert not (tmp_path / "outputs").exists()


BAD = [
    (["train", "-m", "ratio=interval(0.001,0.1)", "compressor=topk"], "interval() needs a sampling sweeper"),
    (["train", "-m", "seed=range(0)"], "seed=range(0) gives no values to sweep"),
    (["train", "-m", "ratio="], "ratio= gives no values to sweep"),
    (["train", "--bogus"], "unrecognized arguments: --bogus"),
    (["train", "--cfg=nope"], "argument --cfg: invalid choice: 'nope'"),
    (["train", "dataset=synthetic", "dataset.image_size=0"], "dataset.image_size=0 must be an integer"),
    (["train", "dataset=mnist", "dataset.channels=2"], "dataset.channels=2 must be 1 or 3"),
    (["list", "--bogus"], "unrecognized arguments: --bogus"),
    (["launch"], "the following arguments are required: script"),
    (["launch", "-np", "x", "s.py"], "argument -np: invalid int value: 'x'"),
    (["report"], "the following arguments are required: dir"),
    (["report", ".", "--per-node", "x"], "argument --per-node: invalid int value: 'x'"),
    (["claims", "--seeds", "x"], "argument --seeds: invalid int value: 'x'"),
    (["cluster"], "the following arguments are required: action"),
    (["cluster", "up", "--gbps", "nan"], "--gbps nan must be a number of Gbit/s > 0 within"),
    (["cluster", "up", "--gbps", "1e-300"], "--gbps 1e-300 must be a number of Gbit/s > 0 within"),
    (["cluster", "run", "--latency-us", "inf", "--", "true"], "argument --latency-us: 'inf' is not a number"),
    (["cluster", "run", "--gbps", "1,2,3", "--", "true"], "--gbps 1,2,3 lists 3 rates for --nodes 2"),
    (["cluster", "run", "--gbps", "1,x", "--", "true"], "--gbps x must be a number of Gbit/s > 0"),
    (["cluster", "run", "--elastic", "--", "true"], "--elastic is about commands on several nodes; add "
                                                    "--each"),
    (["bench", "output=."], "output=. is a folder; pass output=FILE"),
    (["plan", "model=mlp", "comm=ps", "net.gbps=1", "output=/dev/null/p.csv"], "/dev/null exists and is"),
]


@pytest.mark.parametrize("args, expected", BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_input_is_one_error_line(tmp_path, args, expected):
    _one_error_line(compbench(*args, cwd=tmp_path), expected)
    assert not (tmp_path / "outputs").exists()
