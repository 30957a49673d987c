"""Runs that survive faults: exact resume, a killed worker, non-finite gradients, Ctrl-C."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers import TINY, compbench, start_compbench, train

pytestmark = pytest.mark.dist
STEPS_PER_EPOCH = 8  # TINY: 256 samples / (2 ranks x batch 16)


def _ckpt(run: Path) -> dict:
    return torch.load(run / "checkpoint.pt", weights_only=True)


# Suite time: dragonn's in the slow tier (a residual memory resumes in test_resume.py's layerwise-ps)
@pytest.mark.parametrize("setup",
                         [["compressor=dgc", "memory=dgc"],
                          pytest.param(["compressor=dragonn", "memory=residual"], marks=pytest.mark.slow)],
                         ids=["dgc", "dragonn"])
def test_resume_is_bit_exact(tmp_path, setup):
    common = [*TINY, "optim.lr_schedule=cosine", "engine.np=2", "batch_size=16", "ratio=0.05",
              "comm=allgather", "epochs=2", *setup]
    full, _ = train(tmp_path, *common, name="full")
    # one epoch, then a second run resumes it for the second epoch
    half, _ = train(tmp_path, *common, f"max_steps={STEPS_PER_EPOCH}", name="half")
    assert _ckpt(half)["position"] == {"epoch": 1, "batch": 0}
    resumed, proc = train(tmp_path, *common, f"resume={half}", name="resumed")
    a, b = _ckpt(full), _ckpt(resumed)
    assert "resumed from" in proc.stdout and a["step"] == b["step"] == 2 * STEPS_PER_EPOCH
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for rank in range(2):
        ma, mb = a["per_rank"][rank]["memory"], b["per_rank"][rank]["memory"]
        assert ma.keys() == mb.keys() and ma
        for kind in ma:
            assert ma[kind].keys() == mb[kind].keys() and ma[kind]
            for name in ma[kind]:
                assert torch.equal(ma[kind][name], mb[kind][name]), (rank, kind, name)


# slow tier: test_resume's cases resume mid-run in the default tier
@pytest.mark.slow
def test_resume_inside_an_epoch_is_bit_exact(tmp_path):
    common = [*TINY, "engine.np=2", "batch_size=16", "compressor=topk", "memory=residual", "comm=allgather",
              "epochs=1", "eval=false"]
    full, _ = train(tmp_path, *common, name="full")
    part, _ = train(tmp_path, *common, "max_steps=3", name="part")
    assert _ckpt(part)["position"] == {"epoch": 0, "batch": 3}
    rest, _ = train(tmp_path, *common, f"resume={part}", name="rest")
    a, b = _ckpt(full), _ckpt(rest)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def _workers(parent: psutil.Process) -> dict[int, psutil.Process]:
    out = {}
    for child in parent.children(recursive=True):
        try:
            env = child.environ()
        except psutil.Error:
            continue
        if "HOROVOD_RANK" in env and "compbench.train.worker" in " ".join(child.cmdline()):
            out[int(env["HOROVOD_RANK"])] = child
    return out


# compressor=none: the trainer reads every gradient; dragonn and dgc (with its fused memory from the
# second step): their compiled passes check the gradients inside the backward hooks (codec/finite.py)
@pytest.mark.parametrize("compression", [[], ["compressor=dragonn", "comm=allgather", "ratio=0.1"],
                                         ["compressor=dgc", "memory=dgc", "comm=allgather", "ratio=0.1"]],
                         ids=["none", "dragonn", "dgc"])
def test_nonfinite_gradient_raise_names_the_tensor(tmp_path, compression):
    poisoned = [*TINY, *compression, "dataset.noise=1e38", "engine.np=2", "max_steps=3", "epochs=1",
                "eval=false"]
    proc = compbench("train", *poisoned, f"output_dir={tmp_path / 'raise'}")
    assert proc.returncode != 0
    assert "non-finite gradient at step 0" in proc.stderr and ".weight" in proc.stderr
    assert "Traceback" not in proc.stderr
    skip = compbench("train", *poisoned, "on_nonfinite=skip", f"output_dir={tmp_path / 'skip'}")
    assert skip.returncode == 0, skip.stderr[-2000:]
    assert "skipped step 0: non-finite gradient" in skip.stdout


POISON_MODEL = '''
"""An MLP whose rank-1 copy turns its output into NaN from step 0."""
import os

import torch

from compbench.models.mlp import mlp


class PoisonOnRankOne(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.net = mlp(**kw)
        self.poison = os.environ.get("HOROVOD_RANK", os.environ.get("RANK")) == "1"

    def forward(self, x):
        out = self.net(x)
        return out * float("nan") if self.poison else out
'''


@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_nonfinite_gradient_on_one_rank_stops_the_job_with_its_line(tmp_path, engine):
    """on_nonfinite=raise has no collective of its own: rank 1 raises, rank 0 (blocked in the step's
    exchange or the next) ends as a consequence, and the job reports rank 1's line."""
    conf = tmp_path / "plugin"
    (conf / "conf" / "model").mkdir(parents=True)
    (conf / "poison_model.py").write_text(POISON_MODEL)
    (conf / "conf" / "model" / "poison.yaml").write_text(
        "_target_: poison_model.PoisonOnRankOne\nnum_classes: ${dataset.num_classes}\n"
        "image_size: ${dataset.image_size}\nin_chans: 3\nhidden: [32]\npretrained: null\n")
    env = {"COMPBENCH_CONF_PATH": str(conf / "conf"),
           "PYTHONPATH": os.pathsep.join([str(conf), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    proc = compbench("train", *TINY, "model=poison", f"engine={engine}", "engine.np=2", "compressor=topk",
                     "memory=residual", "comm=allgather", "epochs=1", "eval=false",
                     f"output_dir={tmp_path / 'run'}", env=env)
    assert proc.returncode != 0 and time.monotonic() - started < 120
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: non-finite gradient at step 0 (rank 1: net."), proc.stderr[-2000:]
    assert "on_nonfinite=skip" in last and "Traceback" not in proc.stderr


def _wait_for_workers(proc: subprocess.Popen, n: int = 2) -> list[psutil.Process]:
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while len(_workers(parent)) < n:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    return list(_workers(parent).values())


def test_ctrl_c_stops_every_worker(tmp_path):
    # start_compbench gives the job a default SIGINT: the suite may run in the background (`make
    # test &`), where SIGINT is ignored and a child would inherit that.
    proc = start_compbench("train", "epochs=20", "progress=false", f"output_dir={tmp_path / 'run'}")
    workers = _wait_for_workers(proc)
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive


def test_ctrl_c_stops_the_whole_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    proc = start_compbench("train", "-m", *TINY, "epochs=50", "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    workers = _wait_for_workers(proc)  # job 0 is training
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted after 1 of 3 jobs" in out and "Traceback" not in err
    assert sorted(p.name for p in sweep.iterdir()) == ["seed=0"]  # jobs 1 and 2 never started
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive


def test_sigkill_of_the_launcher_and_its_reaper_takes_its_workers_and_the_next_launch_cleans_up(
        tmp_path, monkeypatch):
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    proc = start_compbench("train", *TINY, "engine=torch", "epochs=1000", f"output_dir={tmp_path / 'run'}",
                           env={"TMPDIR": str(scratch_root)})
    parent, deadline = psutil.Process(proc.pid), time.monotonic() + 120
    while len(workers := [c for c in parent.children(recursive=True)
                          if "compbench.train.worker" in " ".join(c.cmdline())]) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    scratch = list(scratch_root.glob("compbench-*"))
    assert len(scratch) == 1  # the torch file store, with its owner's pid
    # its reaper would remove the folder (tests/integration/test_left_behind.py): killed first here
    reaper = [c for c in parent.children() if "compbench.base.reaper" in " ".join(c.cmdline())]
    assert len(reaper) == 1
    reaper[0].kill()  # blocked waiting for its parent, it runs no more code (a zombie until then)
    proc.kill()
    proc.communicate(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=15)  # PR_SET_PDEATHSIG: no orphans left training
    assert not alive
    assert scratch[0].exists()  # no reaper, and SIGKILL gives no chance to clean up: the next launch does it
    import tempfile

    from compbench.launch.processes import run_processes

    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    assert run_processes([sys.executable, "-c", "pass"], "torch", 1)[0] == 0
    assert list(scratch_root.glob("compbench-*")) == []
