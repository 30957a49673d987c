"""The fault group and engine.elastic: bad settings are one line in the parent (compbench.compose.config), a
joiner's state keeps nothing of a peer's residuals, a straggler sleeps its extra time, the elastic
launchers print the workers' lines as a local job's, and a TorchElastic commit file keeps the last
two commits and ignores another job's."""

from __future__ import annotations

import re
import time

import pytest
import torch

from compbench.compose import config
from compbench.network import netem
from compbench.sync.step import joiner_state
from compbench.train.faults import FaultPlan, append_event, read_events
from tests.helpers import TINY

ROOT_ONLY = "needs root" if not netem.can_shape() else ""
KILL = ["fault.kill_rank=1", "fault.at_step=3"]


@pytest.mark.parametrize("overrides, message", [
    (["fault.kill_rank=1"], "fault.kill_rank and fault.at_step go together"),
    (["fault.kill_rank=2", "fault.at_step=3"], "fault.kill_rank=2 is not a rank of engine.np=2 workers"),
    (["fault.kill_rank=-1", "fault.at_step=3"], "fault.kill_rank=-1 must be an integer >= 0"),
    (["fault.kill_rank=1", "fault.at_step=0"], "fault.at_step=0 must be an integer >= 1"),
    (["fault.kill_rank=1", "fault.at_step=8", "max_steps=8"],
     "fault.at_step=8 is not before the run's end at step 8 (max_steps=8): nothing would be killed; pass "
     "fault.at_step below 8"),
    # 256 samples / (2 x 32) a step = 4 steps an epoch: 8 epochs end at step 32
    (["fault.kill_rank=1", "fault.at_step=40"],
     "fault.at_step=40 is not before the run's end at step 32 (epochs=8 of 4 steps): nothing would be "
     "killed; pass fault.at_step below 32"),
    (["fault.kill_prob=0.1", "engine.np=1"], "fault.kill_prob=0.1 kills workers other than rank 0 (which "
                                             "keeps the records), and engine.np=1 has none; use engine.np=2"),
    ([*KILL, "fault.rejoin_after_s=5"], "fault.rejoin_after_s brings back a killed worker, which needs "
                                        "engine.elastic=true"),
    ([*KILL, "fault.rejoin_after_steps=5"], "fault.rejoin_after_steps brings back a killed worker"),
    ([*KILL, "fault.rejoin_after_steps=0"], "fault.rejoin_after_steps=0 must be an integer >= 1"),
    ([*KILL, "fault.rejoin_after_s=1", "fault.rejoin_after_steps=5"],
     "fault.rejoin_after_s and fault.rejoin_after_steps are two ways"),
    (["fault.slow_rank=5"], "fault.slow_rank=5 is not a rank of engine.np=2 workers"),
    (["fault.slow_rank=1", "fault.slow_factor=0.5"], "fault.slow_factor=0.5 must be a number >= 1"),
    (["fault.slow_factor=abc"], "fault.slow_factor=abc must be a number >= 1"),
    (["fault.kill_prob=1.5"], "fault.kill_prob=1.5 must be a number from 0 to 1"),
    ([*KILL, "fault.kill_prob=0.1"], "fault.kill_prob and fault.kill_rank are two ways to kill workers"),
    (["engine.elastic=true", "fault.kill_rank=0", "fault.at_step=3"], "fault.kill_rank=0 with "
                                                                      "engine.elastic=true: rank 0 keeps"),
    (["engine.elastic=true", "engine.min_np=3"], "engine.min_np=3 is more than engine.np=2"),
    (["engine.elastic=true", "engine.min_np=0"], "engine.min_np=0 must be an integer >= 1"),
    (["engine.elastic=true", "sync=horovod_optimizer"], "sync=horovod_optimizer keeps state its engine"),
    (["engine.elastic=true", "compressor=topk", "comm=ps"], "comm=ps keeps per-rank state cut for"),
    (["engine.elastic=yes"], "engine.elastic=yes must be true or false"),
    ([*KILL, "fault.process_only=true"], "fault.process_only=true kills a worker's process but not its "
                                         "machine, which only TorchElastic tells apart"),
    (["engine.elastic=true", *KILL, "fault.process_only=true"],
     "use it with engine=torch engine.elastic=true"),
    (["fault.process_only=maybe"], "fault.process_only=maybe must be true or false"),
    (["engine=torch", "engine.elastic=true", "engine.min_np=3"], "engine.min_np=3 is more than engine.np=2"),
    (["engine.elastic=true", "net.emulate_rank_gbps=[1,0.1]"],
     "net.emulate_rank_gbps with engine.elastic=true"),
])
def test_bad_fault_and_elastic_settings_are_one_line(tmp_path, overrides, message):
    if any("elastic=true" in o for o in overrides) and ROOT_ONLY and "min_np=0" not in "".join(overrides):
        pytest.skip(ROOT_ONLY)  # the root check may come first
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        config.check(config.compose([*TINY, "engine.np=2", *overrides, f"output_dir={tmp_path / 'run'}"]))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


def test_elastic_on_one_machine_needs_root(tmp_path, monkeypatch):
    monkeypatch.setattr(netem, "can_shape", lambda: False)
    with pytest.raises(ValueError, match=r"engine.elastic=true on one machine .* needs root"):
        config.check(config.compose([*TINY, "engine.elastic=true", f"output_dir={tmp_path / 'run'}"]))


def test_a_kill_is_recorded_once(tmp_path):
    plan = FaultPlan(kill_rank=1, at_step=3)
    plan.before_step(2, 0, tmp_path, seed=0)  # another rank: nothing happens
    append_event(tmp_path, {"event": "kill", "rank": 1, "step": 3, "time": 0.0})
    plan.before_step(2, 1, tmp_path, seed=0)  # already killed once (survivors redo the step): not again
    (tmp_path / "faults.jsonl").open("a").write('{"event": "ki')  # a line cut by the kill
    assert read_events(tmp_path) == [{"event": "kill", "rank": 1, "step": 3, "time": 0.0}]


def test_random_kills_follow_the_seed_spare_rank_0_and_happen_once(tmp_path, monkeypatch):
    import random

    from compbench.train import faults

    killed = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append(sig))
    plan = FaultPlan(kill_prob=0.3)
    due = [(step, rank) for step in range(40) for rank in range(1, 4)
           if random.Random(f"7:{step}:{rank}").random() < 0.3]
    for _ in range(2):  # the second pass: the steps redone after recoveries kill no one again
        for step in range(40):
            for rank in range(4):
                plan.before_step(step, rank, tmp_path, seed=7)
    kills = [(e["step"] - 1, e["rank"]) for e in read_events(tmp_path)]
    first_due = sorted({s: (s, r) for s, r in reversed(due)}.values())  # per step, its lowest rank due
    assert kills and kills == first_due and len(killed) == len(kills)  # rank 0 never


def test_a_straggler_takes_its_factor_of_the_compute_time():
    plan = FaultPlan(slow_rank=1, slow_factor=3.0)
    start = time.perf_counter()
    plan.straggle(0, 0.05)  # another rank: no delay
    assert time.perf_counter() - start < 0.05
    plan.straggle(1, 0.05)
    assert time.perf_counter() - start >= 0.1  # (3 - 1) x 50 ms


def test_a_joiner_takes_a_peers_round_state_but_its_own_residuals():
    peer = {"memory": {"w": torch.ones(3)}, "compressor": {"m": torch.ones(2)}, "comm": {},
            "outer_params": [torch.full((2,), 7.0)], "rounds": 4, "torch_rng": torch.zeros(1)}
    fresh = {"memory": {"w": torch.zeros(3)}, "compressor": {"m": torch.zeros(2)}, "comm": {},
             "outer_params": [torch.zeros(2)], "rounds": 0, "torch_rng": torch.ones(1)}
    got = joiner_state(peer, fresh)
    assert got["rounds"] == 4 and torch.equal(got["outer_params"][0], torch.full((2,), 7.0))
    assert torch.equal(got["memory"]["w"], torch.zeros(3))
    assert torch.equal(got["compressor"]["m"], torch.zeros(2))
    assert torch.equal(got["torch_rng"], torch.ones(1))


def test_the_elastic_launcher_prints_the_workers_lines_as_a_local_job(capsys):
    import subprocess
    import sys

    from compbench.launch.elastic import _forward

    lines = ["Checking whether extension torch was built with Gloo.", "[0]<stdout>:epoch 1: loss 2.0",
             "[1]<stderr>:UserWarning: slow", "[0]<stderr>:UserWarning: slow",
             "[0]<stderr>:[E operations.cc:697] Horovod background loop uncaught exception: closed",
             "Process 1 exit with status code 137.", "ERROR: the driver's own last word"]
    proc = subprocess.Popen([sys.executable, "-c", f"print({chr(10).join(lines)!r})"], stdout=subprocess.PIPE,
                            text=True)
    assert _forward(proc) == "ERROR: the driver's own last word"
    out, err = capsys.readouterr()
    assert out.splitlines() == ["epoch 1: loss 2.0",
                                "compbench: a collective failed (a worker is gone); Horovod Elastic recovers",
                                "compbench: horovodrun: Process 1 exit with status code 137."]
    assert err.splitlines() == ["UserWarning: slow"]  # once, not once per worker


def test_the_torch_elastic_launcher_prints_the_workers_lines_without_the_agents_logging(capsys):
    import io
    import sys
    import threading

    from compbench.launch.elastic import _forward_agent

    err = ["W1128 09:41:21.407000 6202 torch/distributed/elastic/multiprocessing/api.py:1028] SIGTERM",
           "[W1128 09:37:58.936453452 socket.cpp:207] [c10d] The hostname of the client socket ...",
           "compbench: rank 0: a worker is gone; TorchElastic restarts the workers", "UserWarning: slow",
           "UserWarning: slow", "frame #3: <unknown function> + 0x674777d (0x7f5c7db4777d in libc10.so)",
           "Exception raised from recvBytes at Utils.hpp:787 (most recent call first):", ""]
    seen: set[str] = set()
    _forward_agent(io.StringIO("epoch 1: loss 2.0\n\n"), sys.stdout, seen, threading.Event())
    _forward_agent(io.StringIO("\n".join(err) + "\n"), sys.stderr, seen, threading.Event())
    ending = threading.Event()
    ending.set()  # the launcher has its verdict: an agent's last words are dropped
    _forward_agent(io.StringIO("Traceback (most recent call last):\n"), sys.stderr, seen, ending)
    out, got = capsys.readouterr()
    assert out.splitlines() == ["epoch 1: loss 2.0", ""]
    assert got.splitlines() == ["compbench: rank 0: a worker is gone; TorchElastic restarts the workers",
                                "UserWarning: slow"]


def test_a_commit_file_keeps_two_commits_and_ignores_another_jobs(tmp_path):
    from compbench.train.elastic_torch import CommitFile

    mine = CommitFile(tmp_path / "elastic" / "node1.pt", "job-a")
    assert mine.read() == {}
    for step in (3, 4, 5):  # the last two are kept
        mine.write({"step": step, "shared": {"w": torch.full((2,), float(step))}})
    mine.wait()
    kept = mine.read()
    assert sorted(kept) == [4, 5] and torch.equal(kept[5]["shared"]["w"], torch.full((2,), 5.0))
    assert not list((tmp_path / "elastic").glob("*.tmp"))
    assert CommitFile(tmp_path / "elastic" / "node1.pt", "job-b").read() == {}


def test_a_tampered_commit_is_refused_with_one_line(tmp_path):
    """A commit file holding more than tensors and plain data (here: a function to import) is
    refused as a tampered checkpoint.pt is, naming the file and the fix; nothing in it runs."""
    import os

    from compbench.train.elastic_torch import CommitFile

    path = tmp_path / "elastic" / "node1.pt"
    path.parent.mkdir()
    torch.save({"step": 3, "job": "job-a", "hook": os.getcwd}, path)
    with pytest.raises(ValueError) as e:
        CommitFile(path, "job-a").read()
    assert str(e.value) == (f"engine.elastic: {path} holds objects other than tensors and plain data "
                            "(loading it could run code); refusing it: remove it (the run then continues "
                            "from its other commit, or from the start)")


@pytest.mark.parametrize("held, step, source, recorder", [
    # rank 1 died while writing its commit of step 11: both go back to 10
    ([[11, 10, 1, 1], [10, 9, 0, 0]], 10, 0, 0),
    ([[11, 10, 1, 1], [11, 10, 0, 0]], 11, 0, 0),
    ([[11, 10, 1, 1], [-1, -1, 0, 0]], 11, 0, 0),  # a joiner holds none
    ([[-1, -1, 0, 0], [-1, -1, 0, 0]], -1, 0, None),  # the start
    # nothing in common: the newest, the other rank takes it as a joiner does
    ([[11, 10, 0, 0], [9, 8, 1, 1]], 11, 0, None),
])
def test_the_ranks_continue_from_the_newest_commit_they_all_hold(held, step, source, recorder):
    from compbench.train.elastic_torch import _agree

    class World:  # every rank's two newest commit steps and their records flags, as one allgather sees them
        def allgather(self, tensors, name):
            return [[torch.tensor(row)] for row in held]

    assert _agree(World(), {}) == (step, source, recorder)


def test_a_replacement_is_due_after_its_seconds_or_the_survivors_steps(tmp_path, monkeypatch):
    kill = {"event": "kill", "rank": 1, "step": 12, "time": 1000.0}  # died at the start of step 12
    monkeypatch.setattr(time, "time", lambda: 1004.0)
    assert FaultPlan(kill_rank=1, at_step=12, rejoin_after_s=5).rejoin_due(tmp_path)(kill) is False
    assert FaultPlan(kill_rank=1, at_step=12, rejoin_after_s=4).rejoin_due(tmp_path)(kill) is True
    plan = FaultPlan(kill_rank=1, at_step=12, rejoin_after_steps=3)
    due = plan.rejoin_due(tmp_path)
    assert due(kill) is False  # nothing committed yet
    plan.after_commit(13, 1, tmp_path)  # not rank 0: noted by rank 0 only
    plan.after_commit(13, 0, tmp_path)
    assert due(kill) is False  # 11 steps before the kill, 2 after
    plan.after_commit(14, 0, tmp_path)
    assert due(kill) is True
