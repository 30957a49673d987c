"""The logger seam (compbench.train.loggers): a 2-job sweep with the CSV and MLflow loggers beside
TensorBoard: every job's scalars.csv, and both runs in MLflow's local store with their parameters,
metrics and results.json, as a lab's tracking would take them; a DiLoCo run's MLflow record read back
whole: its settings, the summary's medians, wall-clock timestamps, the machine and the experiment's
kind."""

from __future__ import annotations

import csv
import json

import pytest

from tests.helpers import TINY, compbench

pytestmark = pytest.mark.dist


def test_a_sweep_lands_in_the_csv_and_mlflow_loggers(tmp_path):
    pytest.importorskip("mlflow")
    import time

    began_ms = time.time() * 1e3
    sweep = tmp_path / "sweep"
    proc = compbench("train", "-m", *TINY, "max_steps=4", "eval_points=1", "checkpoint=false",
                     "compressor=none,fp16", "loggers=[tensorboard,csv,mlflow]", f"outputs_root={tmp_path}",
                     f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2
    for job in jobs:
        rows = list(csv.DictReader((job / "scalars.csv").open()))
        assert {r["tag"] for r in rows} >= {"train/loss", "time/step_ms", "eval/acc1"}
        assert [int(r["step"]) for r in rows if r["tag"] == "train/loss"] == [0, 1, 2, 3]
        assert (job / "tb").is_dir()  # TensorBoard stays beside them
        logged = json.loads((job / "results.json").read_text())["logged"]
        assert set(logged) == {"tensorboard", "csv", "mlflow"}
    # the summary names every place a run was logged
    assert proc.stdout.count("  csv          ") == 2 and proc.stdout.count("  mlflow       ") == 2

    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("compbench")
    # made as a model-training experiment: MLflow's UI opens it on its runs, not on GenAI traces
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["compressor"] for r in runs) == ["fp16", "none"]
    for run in runs:
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert [m.step for m in history] == [0, 1, 2, 3]
        # wall-clock timestamps (MLflow's time axis), the training clock as a metric of its own
        assert all(began_ms <= m.timestamp <= time.time() * 1e3 for m in history)
        assert [m.step for m in client.get_metric_history(run.info.run_id, "time/train_s")] == [0, 1, 2, 3]
        assert "eval/acc1" in run.data.metrics and run.data.tags["compbench.commit"]
        # every resolved setting as a parameter, the summary's medians as run-level metrics, the load
        params, metrics = run.data.params, run.data.metrics
        assert params["max_steps"] == "4" and params["optim.lr"] and params["dataset.train_size"] == "256"
        summary = json.loads(client.download_artifacts(run.info.run_id, "results.json", str(tmp_path)) and
                             (tmp_path / "results.json").read_text())["summary"]
        assert metrics["summary/step_ms"] == pytest.approx(summary["step_ms"])
        assert run.data.tags["compbench.loaded"] in ("true", "false")
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["results.json"]


def test_an_mlflow_run_holds_the_settings_the_summary_medians_and_real_timestamps(tmp_path):
    """One DiLoCo run (a sync with settings of its own) on a modelled link, read back from MLflow's store
    as its UI reads it: every resolved setting as a parameter, the device `auto` chose, the summary's
    medians as run-level metrics (not a last step's value), wall-clock timestamps inside the run's own
    span, the loaded tag; an experiment an older compbench made without a kind gets one."""
    pytest.importorskip("mlflow")
    import os
    import statistics
    import time

    from compbench.records.results import WARMUP_STEPS

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    client.create_experiment("compbench")  # as an older compbench made it: no kind
    began_ms = time.time() * 1e3
    run_dir = tmp_path / "run"
    proc = compbench("train", *TINY, "engine.np=1", "max_steps=8", "eval_points=1", "checkpoint=false",
                     "sync=diloco", "sync.inner_steps=1", "net=eth10g", "loggers=[mlflow]",
                     f"outputs_root={tmp_path}", f"output_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    summary = results["summary"]
    # the summary says where the run went and how to open that folder in MLflow's UI
    assert (f"  mlflow       {(tmp_path / 'mlruns').as_uri()}, experiment compbench, run run  "
            f"(MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {(tmp_path / 'mlruns').as_uri()})"
            in proc.stdout.splitlines())

    experiment = client.get_experiment_by_name("compbench")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags

    # every resolved setting: the step budget, the link, the sync's own settings, device and precision
    assert params["max_steps"] == "8" and params["sync"] == "diloco"
    assert params["net.gbps"] == "10" and params["net.latency_us"] == "25"
    assert {"net.emulate_latency_us", "net.emulate_jitter_us", "net.emulate_loss"} <= set(params)
    assert params["sync.inner_steps"] == "1" and params["sync.outer_lr"] == "0.7"
    assert params["sync.outer_momentum"] == "0.9" and params["optim.momentum"] == "0.9"
    assert params["device"] == "auto" and params["environment.device"] == results["environment"]["device"]
    assert params["precision"] == "fp32" and params["environment.backend"] == "gloo"

    # the summary's figures as run-level metrics: the medians after the warm-up, not the last step's
    steps = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "time/step_ms"),
                                     key=lambda m: m.step)]
    assert len(steps) == 8
    assert summary["step_ms"] == pytest.approx(statistics.median(steps[WARMUP_STEPS:]))
    assert metrics["summary/step_ms"] == pytest.approx(summary["step_ms"])
    figures = {k: v for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    assert figures and all(metrics[f"summary/{k}"] == pytest.approx(v) for k, v in figures.items())

    # wall-clock milliseconds inside the run's own span (not the training clock: 1970 on MLflow's axis);
    # the training clock is a series of its own
    assert began_ms <= run.info.start_time <= run.info.end_time <= time.time() * 1e3
    for key in ("train/loss", "time/step_ms", "eval/acc1", "summary/step_ms"):
        history = client.get_metric_history(run.info.run_id, key)
        assert history and all(run.info.start_time <= m.timestamp <= run.info.end_time for m in history), key
    clock = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "time/train_s"),
                                     key=lambda m: m.step)]
    assert len(clock) == 8 and clock == sorted(clock) and clock[-1] < 1e3

    assert tags["compbench.loaded"] == str(bool(summary["loaded"])).lower()
    assert tags["compbench.run_dir"] == str(run_dir)


def test_a_bad_logger_is_one_line(tmp_path):
    proc = compbench("train", *TINY, "loggers=[tensorboard,wandb]", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: loggers=[tensorboard,wandb] must list where scalars go: tensorboard, csv, mlflow, e.g. "
        "loggers=[tensorboard,csv]"]
    assert not (tmp_path / "run").exists()


def test_a_tracking_server_that_stops_answering_costs_one_line_not_the_run(tmp_path):
    """A server that takes the connection and never answers: a bounded wait (MLFLOW_TIMEOUT_S a call),
    one warning line, and the run's own records whole."""
    pytest.importorskip("mlflow")
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # kept open, never answered
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        # MLflow's own per-request timeout at 1 s (compbench's default, 5 s, only sets it where unset):
        # the same bounded waits, a third of the suite's time
        proc = compbench("train", *TINY, "max_steps=2", "loggers=[tensorboard,mlflow]",
                         f"mlflow.uri=http://127.0.0.1:{port}", f"output_dir={tmp_path / 'run'}", timeout=240,
                         env={"MLFLOW_HTTP_REQUEST_TIMEOUT": "1"})
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        listener.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("warning: MLflow")]
    assert len(said) == 1 and f"127.0.0.1:{port}" in said[0] and "the run goes on" in said[0], said
    assert (tmp_path / "run" / "results.json").is_file() and (tmp_path / "run" / "tb").is_dir()
