"""A real 4-job sweep read back the way TensorBoard reads it: one run per job named by its
overrides (no `hparams` sub-run), a unit and description on every scalar tag, the HParams session
records in the run itself, and the HParams dashboard's experiment as TensorBoard computes it."""

import json

import pytest

from compbench.records.results import BY_AXIS, TAGS
from tests.helpers import TINY, compbench

pytestmark = pytest.mark.dist

# What a run writes: the documented tags, and each evaluation's again against training ms and bytes sent.
WRITTEN = {**TAGS, **{tag: about for tag, about in BY_AXIS.items() if tag.partition("/")[2] in TAGS}}

JOBS = ["compressor=dgc,ratio=0.05", "compressor=dgc,ratio=0.1", "compressor=topk,ratio=0.05",
        "compressor=topk,ratio=0.1"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb") / "sweep"
    proc = compbench("train", "-m", *TINY, "compressor=topk,dgc", "comm=allgather", "ratio=0.1,0.05",
                     "engine.np=2", "epochs=1", "max_steps=4", f"hydra.sweep.dir={root}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc.stdout


def _multiplexer(root):
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(root))
    mux.Reload()
    return mux


def test_one_run_per_job_named_by_its_overrides(sweep):
    root, _ = sweep
    assert sorted(p.name for p in root.iterdir()) == JOBS
    assert sorted(_multiplexer(root).Runs()) == [f"{job}/tb" for job in JOBS]  # no .../tb/hparams


def test_every_scalar_tag_has_a_unit_and_a_description(sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, _ = sweep
    mux = _multiplexer(root)
    for run in mux.Runs():
        tags = set(EventAccumulator(str(root / run)).Reload().Tags()["scalars"])
        assert tags == set(WRITTEN), tags ^ set(WRITTEN)  # every documented tag written, none undocumented
        for tag in tags:
            meta = mux.SummaryMetadata(run, tag)
            unit, about = WRITTEN[tag]
            assert meta.plugin_data.plugin_name == "scalars"
            assert meta.display_name == f"{tag} ({unit})"
            assert meta.summary_description == f"{about}. Unit: {unit}."


def test_first_value_of_each_tag_carries_the_scalars_plugin_metadata(sweep):
    """What TensorBoard's default (Rust) loader reads: it keeps a description only where the
    metadata names its plugin; the Python loader above migrates either way."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    root, _ = sweep
    (events,) = (root / JOBS[0] / "tb").glob("events.out.tfevents.*")
    first = {}
    for record in RawEventFileLoader(str(events)).Load():  # as written, not migrated
        for value in Event.FromString(record).summary.value:
            first.setdefault(value.tag, value)
    for tag, (unit, _) in TAGS.items():
        assert first[tag].HasField("simple_value")  # a plain scalar to every reader
        assert first[tag].metadata.plugin_data.plugin_name == "scalars"
        assert first[tag].metadata.summary_description.endswith(f"Unit: {unit}.")


def test_hparams_session_records_in_the_run_itself(sweep):
    from tensorboard.plugins.hparams import api_pb2, metadata

    root, _ = sweep
    content = _multiplexer(root).PluginRunToTagToContent(metadata.PLUGIN_NAME)
    assert sorted(content) == [f"{job}/tb" for job in JOBS]
    for job in JOBS:
        tags = content[f"{job}/tb"]
        assert metadata.EXPERIMENT_TAG not in tags  # TensorBoard finds the differing keys itself
        start = metadata.parse_session_start_info_plugin_data(tags[metadata.SESSION_START_INFO_TAG])
        end = metadata.parse_session_end_info_plugin_data(tags[metadata.SESSION_END_INFO_TAG])
        hp = start.hparams
        compressor, ratio = (kv.partition("=")[2] for kv in job.split(","))
        assert hp["compressor"].string_value == compressor
        assert hp["ratio"].number_value == float(ratio)
        assert hp["world_size"].string_value == "2"  # an integer: "2", not 2.0000
        assert "net" not in hp
        assert end.status == api_pb2.STATUS_SUCCESS
        hparams = json.loads((root / job / "results.json").read_text())["hparams"]
        assert list(hparams)[:2] == ["compressor", "ratio"] and hparams["world_size"] == 2


def test_hparams_dashboard_shows_differing_keys_and_the_runs_own_curves(sweep):
    """The experiment TensorBoard's HParams plugin computes (no experiment summary written)."""
    from tensorboard import context
    from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import backend_context

    root, _ = sweep
    provider = MultiplexerDataProvider(_multiplexer(root), str(root))
    backend = backend_context.Context(base_plugin.TBContext(data_provider=provider, logdir=str(root)))
    ctx = context.RequestContext()
    experiment = backend.experiment_from_metadata(ctx, "", True, backend.hparams_metadata(ctx, ""),
                                                  backend.hparams_from_data_provider(ctx, "", 0))
    differing = [h.name for h in experiment.hparam_infos if h.differs]
    assert {"compressor", "ratio"} <= set(differing)
    # the dashboard shows the differing keys first (then the first five by name)
    assert [h.name for h in experiment.hparam_infos][:len(differing)] == differing
    metrics = {(m.name.tag, m.name.group) for m in experiment.metric_infos}
    # group "" = the session's own run: "Show metrics" draws its real curves
    assert {("eval/acc1", ""), ("train/throughput", ""), ("time/step_ms", "")} <= metrics
    assert not any(m.name.tag.startswith("hparam/") for m in experiment.metric_infos)


def test_summaries_on_screen(sweep):
    root, out = sweep
    table = out.split("overrides that differ")[1]
    for job in JOBS:
        assert job.replace(",", " ") in table  # in full, not cut
        assert f"run folder   {root / job}" in out
    assert out.count("  step time    ") == len(JOBS) and "+ other " in out
    s = json.loads((root / JOBS[0] / "results.json").read_text())
    summary, method = s["summary"], s["summary_method"]
    split = [summary[f"{p}_ms"] for p in ("compute", "compress", "comm", "decompress", "optimizer", "other")]
    assert sum(split) == pytest.approx(summary["step_ms"])
    assert "after 5 warm-up steps" in method["throughput"] and set(method) <= set(summary)
