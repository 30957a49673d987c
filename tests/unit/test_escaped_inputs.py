"""Bad inputs that used to escape the config check: each is refused with one line naming the key and
the fix, before anything is written (the CLI prints it as `error: ...` and exits 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compbench.cluster.main import main as cluster
from compbench.compose import config
from compbench.data.text import _text_files
from compbench.race.main import main as race
from tests.helpers import TINY, compbench

NP2 = "engine.np=2"


@pytest.mark.parametrize("overrides, message", [
    # falsy network values: checked like any other, not skipped as absent
    (["net.emulate_rank_gbps=0"], "net.emulate_rank_gbps=0 must be a list of 2 rates in Gbit/s, one per "
                                  "worker of engine.np=2, e.g. net.emulate_rank_gbps=[1,1]"),
    (["net.emulate_rank_gbps=false"], "net.emulate_rank_gbps=false must be a list of 2 rates in Gbit/s"),
    (["net.emulate_rank_gbps=[]"], "net.emulate_rank_gbps=[] must be a list of 2 rates in Gbit/s"),
    (["net.emulate_gbps=0"], "net.emulate_gbps=0 must be a number of Gbit/s > 0 within [0.001, 1000] (or "
                             "null: no shaping)"),
    (["net.emulate_gbps=false"], "net.emulate_gbps=false must be a number of Gbit/s > 0"),
    (["net.emulate_gbps=''"], "net.emulate_gbps='' must be a number of Gbit/s > 0"),
    # `+key=value` typos: a key nothing reads
    (["+foo=1"], "foo is not a setting of compbench train; remove +foo= (the settings are listed by "
                 "`compbench train --cfg job`)"),
    (["+optim.lrr=0.1"], "optim.lrr is not a setting of optim.name=sgd; remove it (~optim.lrr); its settings "
                         "are: lr, momentum, dampening, weight_decay, nesterov, maximize, foreach, "
                         "differentiable, fused"),
    (["+net.foo=1"], "net.foo is not a setting of net=measured; its settings are: gbps, latency_us, "
                     "emulate_gbps, emulate_rank_gbps, emulate_latency_us, emulate_rank_latency_us, "
                     "emulate_jitter_us, emulate_loss, delay_line, trace"),
    (["+dataset.foo=2"], "dataset.foo is not a setting of dataset=synthetic; its settings are: num_classes, "
                         "image_size, channels, train_size, test_size, noise, seed"),
    (["compressor=topk", "comm=allgather", "memory.beta=0.9"],
     "memory.beta is not a setting of memory=none; name one that has it: memory=residual memory.beta=..."),
    # widths that are not widths
    (["model.hidden=[-5]"], "model.hidden=[-5] must list the hidden layers' widths, whole numbers >= 1, e.g. "
                            "model.hidden=[256] (or [] for none)"),
    (["model.hidden=[1.5]"], "model.hidden=[1.5] must list the hidden layers' widths"),
    (["model.hidden=[0]"], "model.hidden=[0] must list the hidden layers' widths"),
    (["model=resnet20", "model.num_classes=-1"],
     "model=resnet20 cannot be built with these settings (Trying to create tensor with negative dimension "
     "-1: [-1, 64]); check its model.* settings (`compbench train --cfg job`)"),
    # settings that could never take effect
    (["optim=muon", "model=resnet20"],
     "optim=muon steps hidden nn.Linear matrices and model=resnet20 has none (convolutions, embeddings and "
     "the output layer stay on AdamW), so every parameter would take AdamW; use optim=adamw"),
    # the setting as it is written, not Python's None or True, nor OmegaConf's wording
    (["device=null"], "device=null is unknown; use auto, cpu or cuda"),
    (["optim.name=true"], "optim.name=true is unknown; use sgd, adam, adamw or package.module.Class"),
    (["optim.lr_schedule=null"], "optim.lr_schedule=null is unknown; use constant, cosine, step"),
    (["engine=torch", "engine.backend=true"], "engine.backend=true is unknown; use auto, gloo, nccl"),
    (["resume=true"], "resume=true must be a path"),
    (["ratio=true"], "ratio: ratio=true is outside (0, 1]; pass e.g. ratio=1e-3"),
    # links whose bandwidth-delay product no TCP window here fills; a loopback rate the user never gave
    (["net.emulate_gbps=100", "net.emulate_latency_us=100000"],
     "net.emulate_gbps=100 with net.emulate_latency_us=100000: a link of 100 Gbit/s with round trips of 200 "
     "ms holds 2384 MiB in flight, more than TCP's largest window here"),
    # a delay whose start-up outlasts gloo's time-outs (it hung), a loss rate TCP does not survive
    (["net.emulate_gbps=1", "net.emulate_latency_us=1000000"],
     "net.emulate_latency_us=1000000 must be >= 0 microseconds, at most 250000 (250 ms: beyond it a job's "
     "start-up outlasts gloo's time-outs)"),
    (["net.emulate_gbps=1", "net.emulate_loss=0.5"],
     "net.emulate_loss=0.5 must be a rate in [0, 0.2], e.g. net.emulate_loss=0.01 (above it TCP's "
     "retransmissions back off until gloo's 30 s time-out ends the job: 0.3 did here)"),
    (["net.emulate_rank_gbps=[100,100]", "net.emulate_rank_latency_us=[40000,40000]"],
     "net.emulate_rank_gbps[0]=100 with its delays: a link of 100 Gbit/s with round trips of 160 ms"),
    (["net.emulate_gbps=1000"], "net.emulate_gbps=1000 with engine.np=2 shapes one loopback of 2000 Gbit/s "
                                "(a link each), above 1000; pass net.emulate_gbps<=500"),
    # models and data that do not fit: refused from one meta forward, not inside a worker's first step
    (["model=vgg16", "dataset.image_size=16"],
     "model=vgg16 (model.arch=vgg16_bn) does not take the data's 3x16x16 images (Given input size: "
     "(512x1x1). Calculated output size: (512x0x0). Output size is too small); pass dataset.image_size=32 "
     "(the smallest of 32, 64, 75, 128, 224, 299 it takes)"),
    (["model=resnet50", "model.arch=inception_v3"],
     "model=resnet50 (model.arch=inception_v3) does not take the data's 3x8x8 images"),
    (["model=vit_tiny", "dataset.image_size=8"], "model=vit_tiny (model.arch=vit_tiny_patch16_224) does not "
     "take the data's 3x8x8 images"),
    (["model=vit_tiny", "dataset.image_size=32", "model.image_size=64"],
     "model=vit_tiny (model.arch=vit_tiny_patch16_224) does not take the data's 3x32x32 images (Input "
     "height (32) doesn't match model (64).); pass dataset.image_size=64"),
    (["model.num_classes=5"], "model=mlp answers 5 classes and dataset=synthetic has 10; drop "
                              "model.num_classes (it follows the data set)"),
    (["model=resnet20", "model.num_classes=0"],
     "model=resnet20 answers 0 classes and dataset=synthetic has 10"),
    (["model=resnet50", "model.arch=resnet51"],
     "model.arch=resnet51 is not one of torchvision's image classifiers; e.g. resnet101, resnet152"),
    (["model=resnet50", "model.arch=utils"],
     "model.arch=utils is not one of torchvision's image classifiers"),
    # settings of a fault, an engine or a mode that would do nothing
    (["sync=noloco", "optim=adamw", "sync.inner_steps=2", "sync.group_size=3"],
     "sync.group_size=3 is more than engine.np=2: no group of 3 can form, so every round would average all "
     "workers; pass sync.group_size<=2"),
    (["fault.slow_factor=3"], "fault.slow_factor=3 slows the rank fault.slow_rank names, and none is named; "
                              "add fault.slow_rank=1 (or drop fault.slow_factor)"),
    (["engine.min_np=2"], "engine.min_np=2 is the fewest workers an elastic job goes on with, and this job "
                          "is not elastic (a failed worker stops it); add engine.elastic=true or drop "
                          "engine.min_np"),
])
def test_the_input_is_one_line_naming_its_fix(overrides, message):
    base = [o for o in TINY if not o.startswith("model")] if any(o.startswith("model=") for o in overrides) \
        else TINY
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*base, NP2, *overrides]))
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("link", [
    ["net.emulate_gbps=100", "net.emulate_latency_us=25000"],
    ["net.emulate_rank_gbps=[100,100]", "net.emulate_rank_latency_us=[20000,20000]"]])
def test_a_link_within_tcps_largest_window_is_valid_and_its_buffers_capped(link):
    """2 x 625 MiB and 2 x 1 GiB in flight: within the kernel's 2 GiB socket buffer, which caps the
    buffers (four bandwidth-delay products would not fit in sysctl's int)."""
    from compbench.network.netem import SOCKET_BUFFER_MAX, socket_buffer_bytes

    config.check(config.compose([*TINY, NP2, *link]))
    assert socket_buffer_bytes(100, 80_000) == SOCKET_BUFFER_MAX == 2**31 - 1


def test_a_warm_up_longer_than_the_run_is_said_once(tmp_path):
    proc = compbench("train", *TINY, "optim.warmup_steps=100", "max_steps=2", "--cfg", "job")
    assert proc.returncode == 0
    said = [line for line in proc.stderr.splitlines() if "warms up" in line]
    assert said == ["warning: optim.warmup_steps=100 warms up over 100 steps and the run ends at step 2 "
                    "(max_steps=2): the learning rate never reaches optim.lr"], proc.stderr


def test_the_elastic_suite_keeps_its_engine_elastic(tmp_path):
    from compbench.claims.runner import main as claims

    with pytest.raises(ValueError) as e:
        claims(["--suite", "elastic", "--out", str(tmp_path / "c"), "engine.elastic=false"])
    assert str(e.value) == ("engine.elastic=false: the elastic suite's claims are about engine.elastic=true; "
                            "drop engine.elastic (or run the methods yourself with compbench train)")
    assert not (tmp_path / "c").exists()


def test_a_falsy_link_is_refused_before_the_run_folder_exists(tmp_path):
    proc = compbench("train", *TINY, "net.emulate_gbps=0", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: net.emulate_gbps=0 must be")
    assert not (tmp_path / "run").exists()


def test_a_home_folder_is_written_out_for_hydra(monkeypatch, tmp_path):
    """`dataset.root=~/texts`, as the guide writes it (Hydra's lexer refuses an unquoted ~)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = config.compose(["model=gpt", "dataset=text", "dataset.root=~/texts"])
    assert cfg.dataset.root == f"{tmp_path}/texts"
    assert config.home_expanded("output_dir=~") == f"output_dir='{tmp_path}'"
    assert config.home_expanded("a=b~/c") == "a=b~/c"


@pytest.mark.parametrize("argv, message", [
    (["--links", "10,10"], "--links 10,10 names 10 twice; give each once"),
    (["--only", "demo,demo"], "--only demo,demo names demo twice; give each once"),
    (["--seeds", "100"], "--seeds 100 must be within 1 to 10 (each seed is one run per method and link); "
                         "e.g. --seeds 3"),
    (["--seeds", "1_0"], "argument --seeds: '1_0' is not a whole number"),
    (["--links", "1_0"], "--links 1_0 must be a comma-separated list of links, each a rate in Mbit/s from 1 "
                         "to 1e+06"),
    (["--links", "200:-5"], "--links 200:-5 must be a comma-separated list of links, each a rate in Mbit/s "
                            "from 1 to 1e+06 and optionally a one-way delay in ms >= 0"),
    # an empty item is a mistake, not nothing; a rate beyond a shaped link's; two links in one folder
    (["--links", "200:"], "--links 200: must be a comma-separated list of links"),
    (["--links", "10,,100"], "--links 10,,100 must be a comma-separated list of links"),
    (["--links", "1000001"], "--links 1000001 must be a comma-separated list of links, each a rate in Mbit/s "
                             "from 1 to 1e+06"),
    (["--links", "10,10.000001"], "--links 10,10.000001 names 10mbps twice; give each once"),
    (["--links", "200:25,200:25.0000001"], "--links 200:25,200:25.0000001 names 200mbps-25ms twice"),
    (["--only", "demo,"], "--only demo,: unknown method (an empty item)"),
    # the race's links set the link keys; a key the race sets otherwise is the user's to replace
    (["--links", "10", "net.emulate_gbps=1"], "net.emulate_gbps is set by the race's links; drop it and pass "
                                              "--links MBPS[:DELAY_MS],..."),
    (["--links", "10", "net.emulate_latency_us=5"], "net.emulate_latency_us is set by the race's links"),
])
def test_a_race_queues_each_run_once_and_a_bounded_number_of_seeds(argv, message):
    with pytest.raises(ValueError) as e:
        race(argv)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("argv, message", [
    (["up", "--gbps", "1_0"], "--gbps 1_0 must be a number of Gbit/s > 0"),
    (["up", "--latency-us", "1_0"], "argument --latency-us: '1_0' is not a number"),
    (["up", "--nodes", "1_0"], "argument --nodes: '1_0' is not a whole number"),
    (["up", "--gbps", "100", "--latency-us", "50000"],
     "--gbps 100 --latency-us 50000: a link of 100 Gbit/s with round trips of 100 ms holds 1192 MiB in "
     "flight, more than TCP's largest window here (half of the kernel's 2 GiB socket buffer); lower --gbps "
     "or --latency-us (rate x round trip within 8.6 Gbit)"),
])
def test_a_cluster_reads_numbers_as_written(argv, message):
    with pytest.raises(ValueError) as e:
        cluster(argv)
    assert str(e.value).startswith(message)


def test_symlinked_folders_of_a_text_root_are_followed_and_a_loop_refused(tmp_path):
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    (root / "a").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "a" / "x.txt").write_text("x")
    (elsewhere / "y.txt").write_text("y")
    os.symlink(elsewhere, root / "linked")
    assert [str(p.relative_to(root)) for p in _text_files(root, "R")] == ["a/x.txt", "linked/y.txt"]
    os.symlink(root, root / "a" / "up")
    with pytest.raises(ValueError, match=r"^dataset.root=R: a/up is \. again \(through a symlink\), so its "
                                         r"files would count twice; remove the link$"):
        _text_files(root, "R")
    assert Path(root / "a" / "up").is_symlink()


def test_timms_names_pick_the_compbench_model_they_are():
    for name, option in (("vit_base_patch16_224", "vit_b16"), ("vit_tiny_patch16_224", "vit_tiny"),
                         ("mixer_b16_224", "mixer_b16")):
        cfg = config.compose([f"model={name}", "dataset=synthetic"])
        assert cfg.choices.model == option and cfg.model.arch == name
    assert config.model_alias("model=resnet50") == ["model=resnet50"]  # a compbench name stays
    cfg = config.compose(["model=efficientnet_b0", "dataset=synthetic"])  # any other timm name: model=timm
    assert cfg.choices.model == "timm" and cfg.model.arch == "efficientnet_b0"


def test_a_race_key_given_on_the_command_line_replaces_the_races_own(monkeypatch, tmp_path):
    """`nice=10` beside the race's nice=-20 was two values of one key (Hydra refused the run)."""
    import compbench.race.main as race_main

    seen: list = []

    def stop(jobs, scratch):
        seen.extend(jobs)
        raise KeyboardInterrupt

    monkeypatch.setattr(race_main, "check_jobs", stop)
    with pytest.raises(KeyboardInterrupt):
        race(["--quick", "--links", "10", "--only", "demo", "--out", str(tmp_path), "nice=10",
              "max_train_s=50"])
    overrides = seen[0][1]
    assert [o for o in overrides if o.startswith(("nice=", "max_train_s="))] == ["nice=10", "max_train_s=50"]


@pytest.mark.parametrize("overrides, message", [
    (["mlflow.uri=garbage://x"], "mlflow.uri=garbage://x: compbench logs to an MLflow server "
                                 "(http://host:5000) or a folder (file:///path, or a path), and garbage is "
                                 "neither"),
    (["mlflow.uri=sqlite:////tmp/x.db"], "mlflow.uri=sqlite:////tmp/x.db: compbench logs to an MLflow"),
    (["mlflow.uri=ftp://x"], "mlflow.uri=ftp://x: compbench logs to an MLflow server"),
    (["mlflow.uri=databricks"], "mlflow.uri=databricks: compbench logs to an MLflow server"),
    (["mlflow.uri=file:///proc/x/mlruns"], "mlflow.uri=file:///proc/x/mlruns: /proc/x/mlruns cannot be made"),
    (["mlflow.uri=file:///dev/null/x"], "mlflow.uri=file:///dev/null/x: /dev/null/x cannot be made"),
    (["mlflow.uri=http://127.0.0.1:1"], "mlflow.uri=http://127.0.0.1:1: nothing answers at 127.0.0.1:1"),
    ([f"mlflow.experiment={'x' * 5000}"], f"mlflow.experiment={'x' * 40} must be a name of 1 to 500"),
    (["+mlflow.foo=1"], "mlflow.foo is not a setting of mlflow; its settings are: uri, experiment"),
])
def test_an_mlflow_store_that_cannot_take_the_run_is_one_line(overrides, message):
    pytest.importorskip("mlflow")
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, "loggers=[tensorboard,mlflow]", *overrides]))
    assert str(e.value).startswith(message), str(e.value)


def test_an_mlflow_store_in_the_way_of_a_file_or_beside_no_mlflow_logger(tmp_path):
    pytest.importorskip("mlflow")
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="afile/mlruns cannot be made"):
        config.check(config.compose([*TINY, "loggers=[tensorboard,mlflow]",
                                     f"mlflow.uri=file://{tmp_path}/afile/mlruns"]))
    with pytest.raises(ValueError, match=r"^mlflow.uri=http://x is where MLflow logs, and loggers=\[csv\] "
                                         r"has no mlflow; add it"):
        config.check(config.compose([*TINY, "loggers=[csv]", "mlflow.uri=http://x"]))
    config.check(config.compose([*TINY, "loggers=[tensorboard,mlflow]", "mlflow.uri=relative/mlruns"]))


@pytest.mark.parametrize("args, line", [
    (["train", *TINY, "net.emulate_gbps=1", "net.emulate_loss=0.5"], "error: net.emulate_loss=0.5 must be"),
    (["train", *TINY, "loggers=[tensorboard,mlflow]", "mlflow.uri=ftp://x"], "error: mlflow.uri=ftp://x:"),
    (["train", "-m", *TINY, "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=0"],
     "error: hydra.launcher.n_jobs=0 must be"),
    (["train", *TINY, "model.num_classes=5"], "error: model=mlp answers 5 classes"),
    (["train", *TINY, "fault.slow_factor=3"], "error: fault.slow_factor=3 slows the rank"),
    (["race", "--links", "10,,100"], "error: --links 10,,100 must be"),
])
def test_each_surface_answers_one_line_exit_2_and_writes_nothing(args, line, tmp_path):
    """The CLI's side of the refusals above, one input per surface: links, MLflow, launchers, models,
    faults, the race."""
    pytest.importorskip("mlflow")
    out = tmp_path / "out"
    where = [f"output_dir={out}"] if args[:2] == ["train", TINY[0]] else \
        [f"hydra.sweep.dir={out}"] if "-m" in args else ["--out", str(out)]
    proc = compbench(*args, *where, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(line), proc.stderr
    assert not any(tmp_path.iterdir())  # no run folder, no sweep folder, no outputs/ in the working folder
