"""The logger seam (compbench.train.loggers): a 2-job sweep with the CSV and MLflow loggers beside
TensorBoard: every job's scalars.csv, and both runs in MLflow's local store with their parameters,
metrics and results.json, as a lab's tracking would take them."""

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
        proc = compbench("train", *TINY, "max_steps=2", "loggers=[tensorboard,mlflow]",
                         f"mlflow.uri=http://127.0.0.1:{port}", f"output_dir={tmp_path / 'run'}", timeout=240)
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
