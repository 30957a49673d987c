"""Where a run's scalars go (`loggers=[tensorboard]`, the default; `csv`, `mlflow`), written by rank 0's
Recorder (compbench.train.metrics) at their training time: TensorBoard's event file with each tag's
unit and description and the HParams session; a tidy CSV beside results.json; or an MLflow tracking
store (a lab's server, or a local file store), so a lab's tracking takes compbench's runs.

    compbench train loggers=[tensorboard,csv]
    compbench train loggers=[tensorboard,mlflow] mlflow.uri=http://tracking:5000 mlflow.experiment=comp

MLflow is an optional extra (`pip install 'compbench[mlflow]'`: mlflow-skinny, no server): its
parameters are every resolved setting (`group.key`), the hparams and the machine the run had
(`environment.KEY`: the device `device=auto` chose, the backend, threads, versions), its metrics every
scalar at its step and wall-clock time with the training clock as `time/train_s`, and the summary's
figures as `summary/KEY`; its tags compbench's commit, the run folder and whether the machine was
loaded, and results.json its artifact; the experiment is tagged as model training, not GenAI. Without
`mlflow.uri` the store is `OUTPUTS_ROOT/mlruns`; the UI (`pip install 'compbench[mlflow-ui]'`) opens it
with `MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri file://OUTPUTS_ROOT/mlruns`.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from compbench.records.results import DESCRIBED

LOGGERS = ("tensorboard", "csv", "mlflow")
# The experiment's kind, under the tag MLflow's own kind selector writes: model training, not GenAI, so
# that a UI that reads it opens the experiment on its runs, not on its traces (empty for compbench).
# MLflow 3's UI before its "GenAI / Model training" switch (3.4) reads this tag, and guesses without it;
# 3.10 to 3.17 follow the switch instead (GenAI until a user picks "Model training", which the browser
# keeps: the docs say so), and the tag still says what the experiment is (MLflow's assistant reads it).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


class Logger(Protocol):
    def scalar(self, tag: str, value: float, step: int, train_s: float) -> None: ...
    def finish(self, results: Mapping[str, Any] | None) -> None:
        """The run ended (`results`: results.json's content; None when it failed)."""
        ...


def described_scalar(tag: str, value: float) -> bytes:
    """A serialized Summary: `value` as a plain scalar (what every reader lists as a scalar)
    with the scalars plugin's metadata carrying the tag's unit and description. The plugin name
    matters: TensorBoard's default (Rust) loader drops a description without it."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.scalar import metadata

    unit, about = DESCRIBED[tag]
    meta = metadata.create_summary_metadata(display_name=f"{tag} ({unit})",
                                            description=f"{about}. Unit: {unit}.")
    meta.data_class = summary_pb2.DATA_CLASS_SCALAR
    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, simple_value=float(value), metadata=meta)
    return summary.SerializeToString()


def session_start(hparams: Mapping[str, Any]) -> bytes:
    """The HParams plugin's session start record. Integers go as text: the HParams table prints
    every number with five significant digits (world_size 2 would read 2.0000); floats stay
    numbers (ratio gets a numeric axis and filter), None is left out."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for k, v in hparams.items():
        if isinstance(v, bool):
            info.hparams[k].bool_value = v
        elif isinstance(v, int):
            info.hparams[k].string_value = str(v)
        elif isinstance(v, float):
            info.hparams[k].number_value = v
        elif v is not None:
            info.hparams[k].string_value = str(v)
    return _hparams_record("session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=info))


def session_end() -> bytes:
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return _hparams_record("session_end_info", plugin_data_pb2.HParamsPluginData(session_end_info=info))


def _hparams_record(kind: str, data: Any) -> bytes:
    """A serialized Summary with one hparams plugin value, as tensorboard's summary_v2 builds it
    (tensorboard.plugins.hparams.summary would import TensorFlow)."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata

    tag = {"session_start_info": metadata.SESSION_START_INFO_TAG,
           "session_end_info": metadata.SESSION_END_INFO_TAG}[kind]
    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)
    return summary.SerializeToString()


class TensorBoardLogger:
    """One event file per run in `run_dir/tb`: the scalars (each described once: unit and meaning,
    shown by the Scalars dashboard) and the HParams session records, so that TensorBoard shows one
    run per job; every scalar at its training time after the run's start (TensorBoard's "Relative"
    x axis is then the time a method trained)."""

    def __init__(self, run_dir: Path, hparams: Mapping[str, Any], start: float) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tb"))
        self.start = start
        self._described: set[str] = set()
        self._add(session_start(hparams))

    def scalar(self, tag: str, value: float, step: int, train_s: float) -> None:
        walltime = self.start + train_s
        if tag in self._described:
            self.writer.add_scalar(tag, value, step, walltime=walltime)
        else:  # TensorBoard keeps a tag's metadata from its first value: describe it once
            self._add(described_scalar(tag, value), step, walltime)
            self._described.add(tag)

    def finish(self, results: Mapping[str, Any] | None) -> None:
        """The HParams session end record (success only: TensorBoard keeps a run's first end record,
        which would outlive a later resume), then close the event file."""
        if results is not None:
            self._add(session_end())
        self.writer.close()

    def _add(self, summary_bytes: bytes, step: int | None = None, walltime: float | None = None) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        # tensorboard builds the records, tensorboardX writes them: the two packages share the
        # wire format, not the Python classes.
        self.writer.file_writer.add_summary(Summary.FromString(summary_bytes), step, walltime)


class CSVLogger:
    """`run_dir/scalars.csv`: one row per scalar (tag, step, value, training seconds), long format,
    as spreadsheets and pandas read it; appended as the run goes (a resumed run adds its rows)."""

    HEADER = ("tag", "step", "value", "train_s")

    def __init__(self, run_dir: Path) -> None:
        path = run_dir / "scalars.csv"
        fresh = not path.exists()
        self.file = open(path, "a", newline="")  # noqa: SIM115 - open for the run's life, closed in finish
        self.writer = csv.writer(self.file)
        if fresh:
            self.writer.writerow(self.HEADER)

    def scalar(self, tag: str, value: float, step: int, train_s: float) -> None:
        self.writer.writerow((tag, step, value, round(train_s, 6)))

    def finish(self, results: Mapping[str, Any] | None) -> None:
        self.file.close()


class MLflowLogger:
    """One MLflow run per compbench run, in `experiment` of the tracking store at `uri` (tagged as model
    training, EXPERIMENT_KIND): every resolved setting as a parameter (`settings`: the run's config,
    flattened to `group.key`; the hparams over them), every scalar as a metric at its step and the
    wall-clock time it was recorded (sent in batches) with the training clock as a metric of its own
    (`time/train_s`), compbench's commit and the run folder as tags; at the end the summary's figures
    as run-level metrics (`summary/KEY`: the medians, not a last step's value), the machine the run had
    as parameters (`environment.KEY`: results.json's environment, the device `device=auto` resolved to
    among them), whether the machine was loaded as a tag, results.json as an artifact; ended FINISHED,
    or FAILED without results."""

    BATCH = 1000  # MLflow's most metrics per log_batch call
    PARAMS = 100  # MLflow's most parameters per log_batch call
    VALUE = 6000  # MLflow's longest parameter value

    def __init__(self, run_dir: Path, hparams: Mapping[str, Any], uri: str, experiment: str,
                 tags: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> None:
        if uri.startswith("file:"):  # MLflow 3 keeps its file store behind this switch (maintenance mode)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # a server that stops answering costs a bounded wait per call, not MLflow's 7 tries of 120 s
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(MLFLOW_TIMEOUT_S))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        self.uri, self.lost = uri, False
        import mlflow
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        # tagged as model training (EXPERIMENT_KIND: the UI opens it on its runs); an experiment a lab
        # made keeps the kind it was given, one without a kind (an older compbench's) gets this one
        kind, training = EXPERIMENT_KIND
        if found is None:
            experiment_id = self.client.create_experiment(experiment, tags={kind: training})
        else:
            experiment_id = found.experiment_id
            if kind not in found.tags:
                try:
                    self.client.set_experiment_tag(experiment_id, kind, training)
                except Exception:  # noqa: BLE001 - a server that refuses it (permissions) still takes runs
                    pass
        self.run = self.client.create_run(experiment_id, run_name=run_dir.name,
                                          tags={"compbench.run_dir": str(run_dir),
                                                **{f"compbench.{k}": str(v) for k, v in tags.items()}})
        given = {**_flat_settings(settings or {}), **{k: v for k, v in hparams.items() if v is not None}}
        self._params(given)
        self.run_dir = run_dir
        self.pending: list[Any] = []
        self._clock_step = -1  # the last step whose training clock went out
        self._metric = mlflow.entities.Metric

    def scalar(self, tag: str, value: float, step: int, train_s: float) -> None:
        if self.lost:
            return
        # the time it was recorded, in milliseconds: MLflow's Time axis reads the date, its Relative Time
        # the seconds since the series' first point (evaluations included), both within the run's start
        # and end; the training clock is `time/train_s`, which MLflow's charts take as an x axis
        stamp = int(time.time() * 1e3)
        self.pending.append(self._metric(tag, float(value), stamp, int(step)))
        # the training clock beside each step's loss (the one series every training step has; the
        # curve's series count samples or tokens, not steps): an x axis of its own
        if tag == "train/loss" and step != self._clock_step:
            self._clock_step = step
            self.pending.append(self._metric("time/train_s", float(train_s), stamp, int(step)))
        if len(self.pending) >= self.BATCH:
            self._guarded(self._flush)

    def finish(self, results: Mapping[str, Any] | None) -> None:
        def end() -> None:
            self._flush()
            if results is not None:
                run_id, now = self.run.info.run_id, int(time.time() * 1e3)
                summary = results.get("summary") or {}
                figures = [self._metric(f"summary/{k}", float(v), now, 0) for k, v in summary.items()
                           if isinstance(v, int | float) and not isinstance(v, bool)]
                for i in range(0, len(figures), self.BATCH):
                    self.client.log_batch(run_id, metrics=figures[i:i + self.BATCH])
                # the machine (params are written once: these keys are not the config's)
                self._params(_flat_settings(results.get("environment") or {}, "environment."))
                self.client.set_tag(run_id, "compbench.loaded", str(bool(summary.get("loaded"))).lower())
                self.client.log_text(run_id, json.dumps(results, default=str), "results.json")
            self.client.set_terminated(self.run.info.run_id, "FINISHED" if results is not None else "FAILED")

        if not self.lost:
            self._guarded(end)

    def _params(self, given: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[: self.VALUE]) for k, v in given.items()]
        for i in range(0, len(params), self.PARAMS):
            self.client.log_batch(self.run.info.run_id, params=params[i:i + self.PARAMS])

    def _flush(self) -> None:
        if self.pending:
            self.client.log_batch(self.run.info.run_id, metrics=self.pending)
            self.pending = []

    def _guarded(self, call: Any) -> None:
        """A tracking store that fails mid-run (a server gone) costs one line and MLflow's records from
        then on, never the run: its folder, TensorBoard and results.json are written as usual."""
        try:
            call()
        except Exception as e:  # noqa: BLE001 - MLflow's client raises many kinds; the run goes on
            self.lost = True
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            print(f"warning: MLflow at {self.uri} stopped taking this run's records ({first}); the run goes "
                  f"on, its records are in {self.run_dir}", flush=True)


def _flat_settings(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The run's config as `group.key` -> value (lists as their text), None left out."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flat_settings(value, f"{name}."))
        elif value is not None:
            out[name] = value
    return out


def places(names: Sequence[str], run_dir: Path, mlflow: Mapping[str, Any],
           outputs_root: str) -> dict[str, str]:
    """Where each logger put the run's scalars, for the summary's last lines (results.json `logged`)."""
    uri = mlflow_uri(mlflow.get("uri"), outputs_root)
    # a folder needs MLflow's UI to be read (a server is its own UI); MLflow 3 opens a folder store only
    # with MLFLOW_ALLOW_FILE_STORE=true
    ui = (f"  (MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri {uri})"
          if uri.startswith("file:") else "")
    where = {"tensorboard": f"{run_dir / 'tb'}  (tensorboard --logdir {run_dir.parent})",
             "csv": str(run_dir / "scalars.csv"),
             "mlflow": f"{uri}, experiment {mlflow.get('experiment')}, run {run_dir.name}{ui}"}
    return {name: where[name] for name in names}


def mlflow_uri(uri: str | None, outputs_root: str) -> str:
    """The tracking store: `mlflow.uri` (a path without a scheme is a file store, made absolute:
    every worker and the UI must find the same folder), else a file store under the outputs."""
    if uri and "://" not in uri and uri != "databricks" and not uri.startswith("file:"):
        return Path(uri).resolve().as_uri()
    return uri or (Path(outputs_root).resolve() / "mlruns").as_uri()


MLFLOW_KEYS = ("uri", "experiment")
# The stores compbench logs to (MLflow's tracking stores that mlflow-skinny serves without a
# database driver or a vendor's SDK): a server, or a folder.
MLFLOW_SCHEMES = ("http", "https", "file")
# An answer from a tracking server within this many seconds, at the config check and for each call
# during the run (MLflow's own default waits 120 s per try and retries 7 times: a run would hang).
MLFLOW_TIMEOUT_S = 5


def check(names: Any, settings: dict[str, Any], outputs_root: str) -> None:
    """Config-time check of `loggers` and `mlflow.*` (ValueError: one line naming the fix): the tracking
    store's scheme, its folder (made or makeable) or its server (answering), the experiment's name."""
    from compbench.base.values import show

    unknown = [k for k in settings if k not in MLFLOW_KEYS]
    if unknown:
        raise ValueError(f"mlflow.{unknown[0]} is not a setting of mlflow; its settings are: "
                         f"{', '.join(MLFLOW_KEYS)}")
    uri, experiment = settings.get("uri"), settings.get("experiment")

    if not isinstance(names, list | tuple) or not names or any(n not in LOGGERS for n in names):
        raise ValueError(f"loggers={show(names)} must list where scalars go: {', '.join(LOGGERS)}, e.g. "
                         "loggers=[tensorboard,csv]")
    if len(set(names)) < len(names):
        raise ValueError(f"loggers={show(names)} names a logger twice; give each once")
    if "mlflow" in names:
        try:
            import mlflow  # noqa: F401 - the logger's dependency, checked here
        except ImportError:
            raise ValueError("loggers=[...,mlflow] needs MLflow; pip install 'compbench[mlflow]' "
                             "(mlflow-skinny), or drop mlflow from loggers") from None
        if uri is not None and (not isinstance(uri, str) or not uri):
            raise ValueError(f"mlflow.uri={show(uri)} must be a tracking URI (http://host:5000, "
                             "file:///path) or null (a file store under outputs_root)")
        if not isinstance(experiment, str) or not experiment or len(experiment) > 500:
            raise ValueError(f"mlflow.experiment={show(experiment)[:40]} must be a name of 1 to 500 "
                             "characters (MLflow's limit), e.g. mlflow.experiment=compbench")
        _check_store(mlflow_uri(uri, outputs_root), uri)
    elif uri is not None:
        raise ValueError(f"mlflow.uri={show(uri)} is where MLflow logs, and loggers={show(names)} has no "
                         "mlflow; add it (loggers=[tensorboard,mlflow]) or drop mlflow.uri")


def _check_store(uri: str, given: str | None) -> None:
    """The tracking store at `uri` can take a run: a folder that exists or can be made (a file store),
    or a server that answers within MLFLOW_TIMEOUT_S (a bounded connect, no request)."""
    import socket
    from urllib.parse import urlparse

    key = f"mlflow.uri={given}" if given else "the file store under outputs_root (mlflow.uri=null)"
    parsed = urlparse(uri)
    if parsed.scheme not in MLFLOW_SCHEMES:
        raise ValueError(f"{key}: compbench logs to an MLflow server (http://host:5000) or a folder "
                         f"(file:///path, or a path), and {parsed.scheme or uri} is neither; for a database "
                         "store, serve it (mlflow server --backend-store-uri sqlite:///...) and pass the "
                         "server's http:// address")
    if parsed.scheme == "file":
        folder = Path(parsed.path)
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        special = str(existing).startswith(("/proc", "/sys", "/dev"))
        if not existing.is_dir() or not os.access(existing, os.W_OK) or special:
            raise ValueError(f"{key}: {folder} cannot be made ({existing} is not a folder this user may "
                             "write); pass mlflow.uri=file:///a/folder/you/own")
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=MLFLOW_TIMEOUT_S).close()
    except OSError as e:
        raise ValueError(f"{key}: nothing answers at {parsed.hostname}:{port} ({e.strerror or e}); start "
                         "the server (mlflow server --port PORT) or drop mlflow from loggers") from None


def build(names: Sequence[str], run_dir: Path, hparams: Mapping[str, Any], start: float,
          mlflow: Mapping[str, Any], outputs_root: str,
          settings: Mapping[str, Any] | None = None) -> list[Logger]:
    """The loggers `names` picks (checked by `check`), in that order; `settings`: the run's resolved
    config (MLflow's parameters)."""
    from compbench.records.provenance import source

    out: list[Logger] = []
    for name in names:
        if name == "tensorboard":
            out.append(TensorBoardLogger(run_dir, hparams, start))
        elif name == "csv":
            out.append(CSVLogger(run_dir))
        else:
            uri = mlflow_uri(mlflow.get("uri"), outputs_root)
            try:
                out.append(MLflowLogger(run_dir, hparams, uri, str(mlflow.get("experiment")), source(),
                                        settings))
            except Exception as e:  # noqa: BLE001 - as MLflowLogger._guarded: the run goes on without it
                first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                print(f"warning: MLflow at {uri} did not take this run ({first}); the run goes on, its "
                      f"records are in {run_dir}", flush=True)
    return out
