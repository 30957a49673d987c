"""Injected faults on real jobs: a killed worker, a straggler, and elastic runs (engine.elastic=true:
Horovod Elastic or TorchElastic, in a private network namespace, so root) that survive the kill and,
where they may not continue, stop with a checkpoint that a resume finishes; a worker restarted in
place (TorchElastic) that continues every mode's state bit for bit."""

from __future__ import annotations

import pytest
import torch

from compbench.network import netem
from tests.helpers import TINY, compbench, event_tags, params, results, train
from tests.integration.test_resume import _assert_equal

pytestmark = pytest.mark.dist
needs_root = pytest.mark.skipif(not netem.can_shape(), reason="needs root and iproute2 (a private namespace)")

# 8 steps per epoch (256 samples / 2 ranks x 16), 4 epochs: top-k with error feedback, whose memory
# is the state a departed worker takes with it.
COMMON = [*TINY, "engine.np=2", "batch_size=16", "epochs=4", "compressor=topk", "ratio=0.1",
          "memory=residual", "comm=allgather", "threads=1"]
KILL = ["fault.kill_rank=1", "fault.at_step=12"]


# Suite time: torch's run in the slow tier (the kill is the trainer's, the same on both engines)
@pytest.mark.parametrize("engine", ["horovod", pytest.param("torch", marks=pytest.mark.slow)])
def test_a_killed_worker_stops_the_job_and_resume_finishes(tmp_path, engine):
    run = tmp_path / "run"
    base = [*COMMON, f"engine={engine}", "checkpoint_every_steps=4", f"output_dir={run}"]
    proc = compbench("train", *base, *KILL)
    assert proc.returncode == 1 and "worker rank 1 was killed by SIGKILL" in proc.stderr, proc.stderr[-2000:]
    kept = torch.load(run / "checkpoint.pt", weights_only=True)
    assert kept["step"] == 8 and kept["position"] == {"epoch": 1, "batch": 0}  # the last one before the kill
    done = compbench("train", *base, "resume=auto")
    assert done.returncode == 0, done.stderr[-2000:]
    assert results(run)["summary"]["steps"] == 32


# The straggler's sleep is the trainer's, the same on both engines: torch's run is in the slow tier.
@pytest.mark.parametrize("engine", ["horovod", pytest.param("torch", marks=pytest.mark.slow)])
def test_a_straggler_makes_every_step_wait_for_it(tmp_path, engine):
    run, _ = train(tmp_path, *COMMON, f"engine={engine}", "max_steps=16", "fault.slow_rank=1",
                   "fault.slow_factor=6")
    summary = results(run)["summary"]
    # rank 1 computes 6x as long as rank 0: rank 0's steps wait for it (at least half of the extra 5x)
    assert summary["step_ms"] > 3.5 * summary["compute_ms"], summary
    assert results(run)["faults"]["injected"] == []  # a straggler is a setting, not an event


# TorchElastic's run is in the slow tier (3 jobs, 32 s); the fast tier has its restart in place below.
@needs_root
@pytest.mark.parametrize("engine", ["horovod", pytest.param("torch", marks=pytest.mark.slow)])
def test_an_elastic_run_goes_on_without_a_killed_worker_as_a_resume_with_the_survivor_would(tmp_path, engine):
    common = [*COMMON, f"engine={engine}"]
    elastic, proc = train(tmp_path, *common, "engine.elastic=true", *KILL, name="elastic")
    assert "elastic: 2 -> 1 workers at step 11" in proc.stdout
    record = results(elastic)
    (recovery,) = record["faults"]["recoveries"]
    assert (recovery["kind"], recovery["workers_before"], recovery["workers_after"]) == ("failure", 2, 1)
    assert recovery["replicas_identical"] is True and recovery["lost_s"] > 0
    weights = sum(t.numel() for t in params(elastic).values())
    assert recovery["lost_residual_bytes"] == 4 * weights  # rank 1's top-k residual, one fp32 per weight
    (kill,) = record["faults"]["injected"]
    assert (kill["event"], kill["rank"], kill["step"]) == ("kill", 1, 12)
    # 11 steps of 2 x 16 samples, then 1 x 16 from the same place of the epoch: every sample of the 4
    # epochs once (53 steps), none twice
    assert record["curve"][-1]["samples"] == 4 * 256 and record["summary"]["steps"] == 11 + 42
    faults = record["summary"]["faults"]
    assert (faults["failure"], faults["join"], faults["steps_by_workers"]) == (1, 0, {"2": 11, "1": 42})
    assert faults["lost_s"] == recovery["lost_s"]
    assert {"elastic/workers", "elastic/lost_s"} <= event_tags(elastic)

    # The same failure where the survivor may not go on alone: one line, a checkpoint of the last
    # commit; resumed with the one worker left, it ends bit for bit where the elastic run ended.
    stopped = tmp_path / "stopped"
    proc = compbench("train", *common, "engine.elastic=true", "engine.min_np=2", *KILL,
                     f"output_dir={stopped}")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: 1 worker(s) left, below engine.min_np=2: stopped at step 11"), proc.stderr[-2000:]
    saved = torch.load(stopped / "checkpoint.pt", weights_only=True)
    assert saved["world_size"] == 1 and saved["step"] == 11
    resumed, _ = train(tmp_path, *common, "engine.np=1", f"resume={stopped}", name="resumed")
    a, b = params(elastic), params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert record["curve"][-1]["bytes_sent"] == results(resumed)["curve"][-1]["bytes_sent"]


# slow tier: ~30 s; the promise's main test (the survivors against a resume) stays in the default tier
@pytest.mark.slow
@needs_root
def test_a_stopped_diloco_run_resumed_with_the_same_threads_ends_where_the_elastic_run_ends(tmp_path):
    """The promise on another model, data set and mode (DiLoCo rounds of 4 steps, a CNN on digits,
    killed mid-round): bit for bit with the elastic run's threads; with other threads the resume says
    it continues within rounding only."""
    common = ["model=cnn", "dataset=digits", "progress=false", "engine=horovod", "engine.np=2",
              "batch_size=16", "max_steps=24", "sync=diloco", "sync.inner_steps=4", "optim=adamw",
              "threads=1", "eval_points=1", "engine.elastic=true", *KILL]
    elastic, _ = train(tmp_path, *common, name="elastic")
    stopped = tmp_path / "stopped"
    proc = compbench("train", *common, "engine.min_np=2", f"output_dir={stopped}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    resume = [*common[:-3], "engine.np=1", f"resume={stopped}"]
    other, proc = train(tmp_path, *resume, "threads=2", name="other_threads")
    assert "note: 2 compute threads per worker, the checkpoint's run had 1" in proc.stdout
    resumed, _ = train(tmp_path, *resume, name="resumed")
    a, b = params(elastic), params(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("engine, rejoin", [("horovod", "fault.rejoin_after_s=0"),
                                            ("horovod", "fault.rejoin_after_steps=8"),
                                            ("torch", "fault.rejoin_after_s=12")])
def test_a_worker_that_joins_takes_the_rounds_state(tmp_path, engine, rejoin):
    # DiLoCo rounds of 4 steps. Horovod: the replacement is offered at once, or once the survivor has
    # committed 8 steps past the kill's (step 20), and joins at a round's end; torch: it comes once the
    # failure is recovered from (TorchElastic sees the lost machine after 3 s of missed heartbeats, then
    # waits 2 s for late agents) and every worker restarts from its commit. The straggler (rank 0, 40x)
    # keeps the run long enough for a new worker to start.
    run, proc = train(tmp_path, *TINY, "engine.np=2", "batch_size=16", "epochs=100", "sync=diloco",
                      "sync.inner_steps=4", "optim=adamw", f"engine={engine}", "engine.elastic=true", *KILL,
                      rejoin, "fault.slow_rank=0", "fault.slow_factor=40")
    kinds = [(r["kind"], r["workers_before"], r["workers_after"], r["replicas_identical"])
             for r in results(run)["faults"]["recoveries"]]
    assert kinds == [("failure", 2, 1, True), ("join", 1, 2, True)], proc.stdout[-3000:]
    if "steps" in rejoin:
        assert results(run)["faults"]["recoveries"][1]["step"] >= 20


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_a_random_kill_is_survived(tmp_path, engine):
    # seed 2, p=0.05: rank 1's draw kills it at step 17 (of 32); rank 0 is never drawn
    run, _ = train(tmp_path, *COMMON, f"engine={engine}", "seed=2", "engine.elastic=true",
                   "fault.kill_prob=0.05")
    record = results(run)
    (kill,) = record["faults"]["injected"]
    assert (kill["rank"], kill["step"]) == (1, 17)
    (recovery,) = record["faults"]["recoveries"]
    assert (recovery["kind"], recovery["workers_after"]) == ("failure", 1) and recovery["replicas_identical"]
    assert record["curve"][-1]["samples"] == 4 * 256


# Every mode's state through a TorchElastic restart: rank 1's process dies (its machine stays), its
# agent starts it again, the other agent restarts rank 0 for the new rendezvous, and both continue
# from their commit files. The run must end exactly as the same run without the failure, bytes
# included (payloads of one size here: the torch engine pads uneven ones to a capacity it learns,
# which a new process learns again).
SPARSE = ["compressor=topk", "ratio=0.1", "memory=residual", "comm=allgather"]
RESTART_MODES = {
    "topk-residual": SPARSE,
    "diloco": ["sync=diloco", "sync.inner_steps=3", "optim=adamw", *SPARSE],
    "streaming-diloco": ["sync=diloco", "sync.inner_steps=4", "sync.fragments=2", "sync.overlap=1",
                         "optim=adamw", "compressor=fp16"],
    "demo": ["sync=demo", "compressor=chunk_dct"],
    "onebit-adam": ["sync=onebit_adam", "optim=adamw", "sync.freeze_step=3", "comm=allgather"],
    "onebit-lamb": ["sync=onebit_lamb", "optim=adamw", "comm=allgather"],
    "desloc": ["sync=desloc", "optim=adamw", "sync.param_period=2", "sync.first_moment_period=2",
               "sync.second_moment_period=4", *SPARSE],
    "noloco": ["sync=noloco", "sync.inner_steps=3", "optim=adamw"],
    "sparta": ["sync=sparta", "sync.p=0.1", "optim=adamw"],
    "sparta-diloco": ["sync=sparta_diloco", "sync.inner_steps=3", "sync.p=0.1", "optim=adamw", *SPARSE],
}
FAST_RESTART_MODES = ("topk-residual",)


@needs_root
@pytest.mark.parametrize("mode", [m if m in FAST_RESTART_MODES else pytest.param(m, marks=pytest.mark.slow)
                                  for m in RESTART_MODES])
def test_a_worker_restarted_in_place_continues_every_modes_state_exactly(tmp_path, mode):
    setup = [*TINY, "engine.np=2", "batch_size=16", "epochs=2", "threads=1", "engine=torch",
             "optim.lr_schedule=cosine", *RESTART_MODES[mode]]
    plain, _ = train(tmp_path, *setup, name="plain")
    elastic, proc = train(tmp_path, *setup, "engine.elastic=true", "fault.kill_rank=1", "fault.at_step=12",
                          "fault.process_only=true", name="elastic")
    (recovery,) = results(elastic)["faults"]["recoveries"]
    assert (recovery["kind"], recovery["workers_after"]) == ("restart", 2), proc.stdout[-2000:]
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (plain, elastic))
    for key in ("position", "step", "model", "optimizer", "lr_schedule", "scheduler", "per_rank"):
        _assert_equal(a[key], b[key], key)
    assert results(plain)["curve"][-1]["bytes_sent"] == results(elastic)["curve"][-1]["bytes_sent"]
