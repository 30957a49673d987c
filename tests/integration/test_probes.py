"""Every bad input of issue 10 (a new user's probes): one `error:` line naming the key and the fix,
exit code 2 (130 for Ctrl-C), no traceback, and nothing written. Real inputs only: corrupt npz
files, garbage CIFAR roots, empty ImageNet trees, folders where no folder can be made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import TINY, catches_sigint, compbench, start_compbench


def _bad_crc_npz(tmp: Path) -> list[str]:
    path = tmp / "bad_crc.npz"
    np.savez(path, **{"fc.weight": np.arange(4096, dtype=np.float32)})  # stored, not deflated
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the array's bytes: the zip directory stays valid
    path.write_bytes(bytes(data))
    return [f"model.pretrained={path}"]


def _string_npz(tmp: Path) -> list[str]:
    path = tmp / "strings.npz"
    np.savez(path, **{"layers.0.weight": np.array(["not", "numbers"])})
    return [f"model.pretrained={path}"]


def _garbage_cifar(tmp: Path) -> list[str]:
    folder = tmp / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]:
        (folder / name).write_bytes(os.urandom(512))
    return ["dataset=cifar10", f"dataset.root={tmp / 'cifar'}"]


def _empty_imagenet(tmp: Path) -> list[str]:
    for split in ("train", "val"):
        (tmp / "imagenet" / split).mkdir(parents=True)
    return ["dataset=imagenet", f"dataset.root={tmp / 'imagenet'}"]


def _a_file(tmp: Path) -> list[str]:
    (tmp / "a_file").write_text("not a folder\n")
    return [f"output_dir={tmp / 'a_file'}"]


def _fixed(*args: str) -> Callable[[Path], list[str]]:
    return lambda tmp: list(args)


# name -> (arguments made in tmp, what the one line must say). TINY runs 2 workers on 256 samples.
PROBES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "pretrained-bad-crc": (_bad_crc_npz, "is not a readable .npz (BadZipFile"),
    "pretrained-strings": (_string_npz, "array layers.0.weight has dtype <U7, not numbers"),
    "output-dir-under-proc": (_fixed("output_dir=/proc/compbench-probe/run"), "cannot create folders in"),
    "output-dir-on-a-file": (_a_file, "exists and is not a folder"),
    "output-dir-under-dev-null": (_fixed("output_dir=/dev/null/run"), "/dev/null is not a folder"),
    "ratio-list": (_fixed("ratio=[1,2]"), "ratio=[1,2] is outside (0, 1]"),
    "lr-string": (_fixed("optim.lr=abc"), "optim.lr=abc must be a finite number > 0"),
    "max-steps-string": (_fixed("max_steps=abc"), "max_steps=abc must be an integer >= 1"),
    "threads-negative": (_fixed("threads=-1"), "threads=-1 must be an integer >= 1"),
    "timeout-negative": (_fixed("engine=torch", "engine.timeout_s=-1"), "engine.timeout_s=-1 must be"),
    "cifar-garbage": (_garbage_cifar, "corrupt cifar-10-batches-py/data_batch_1"),
    "imagenet-empty": (_empty_imagenet, "train/ has no class folders"),
    "lr-negative": (_fixed("optim.lr=-0.1"), "optim.lr=-0.1 must be a finite number > 0"),
    "momentum-negative": (_fixed("optim.momentum=-0.9"), "optim.momentum=-0.9 must be"),
    "weight-decay-negative": (_fixed("optim.weight_decay=-1"), "optim.weight_decay=-1 must be"),
    "betas-negative": (_fixed("optim=adam", "optim.betas=[-0.1,0.999]"), "optim.betas=[-0.1,0.999] must be"),
    "lr-schedule-unknown": (_fixed("optim.lr_schedule=wavy"), "optim.lr_schedule=wavy is unknown"),
    "seed-string": (_fixed("seed=abc"), "seed=abc must be an integer"),
    "batch-larger-than-data": (_fixed("batch_size=200"), "batch_size=200 x 2 workers exceeds the 256"),
    "lr-nan": (_fixed("optim.lr=nan"), "optim.lr=nan must be a finite number"),
    "beta-nan": (_fixed("memory=residual", "memory.beta=nan"), "memory.beta=nan must be a finite number"),
    "epochs-bool": (_fixed("epochs=true"), "epochs=true must be an integer >= 1"),
    "max-steps-negative": (_fixed("max_steps=-1"), "max_steps=-1 must be an integer >= 1"),
    "checkpoint-every-negative": (_fixed("checkpoint_every_steps=-1"), "checkpoint_every_steps=-1 must be"),
    "np-far-above-cores": (_fixed(f"engine.np={4 * (os.cpu_count() or 1) + 1}"), "workers per core"),
    "hydra-setting-ignored": (_fixed("hydra.job.chdir=true"), "hydra.job.chdir is not used by compbench"),
    "hydra-run-dir-and-output-dir": (_fixed("hydra.run.dir=a", "output_dir=b"), "differ; pass one of them"),
}
if not torch.cuda.is_available():
    PROBES["nccl-without-cuda"] = (_fixed("engine=torch", "engine.backend=nccl"),
                                   "engine.backend=nccl reduces CUDA tensors and this run trains on the CPU")


def _base(args: list[str]) -> list[str]:
    """TINY, or its data-set-free part when the probe picks another data set (TINY's
    dataset.train_size would not exist there)."""
    if not any(a.startswith("dataset=") for a in args):
        return TINY
    return [*(a for a in TINY if not a.startswith("dataset")), "dataset.image_size=8"]


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("name", list(PROBES))
def test_probe_is_one_line_and_writes_nothing(tmp_path, name):
    make, expected = PROBES[name]
    args = make(tmp_path)
    out = tmp_path / "run"
    if not any(a.startswith(("output_dir=", "hydra.run.dir=")) for a in args):
        args.append(f"output_dir={out}")
    before = set(tmp_path.iterdir())
    proc = compbench("train", *_base(args), *args, f"outputs_root={tmp_path / 'outputs'}", cwd=tmp_path,
                     timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert expected in _one_error_line(proc.stderr)
    assert set(tmp_path.iterdir()) == before  # no run folder, no outputs_root, no scratch
    assert not Path("/proc/compbench-probe").exists()


def test_report_on_a_results_file_that_is_not_one(tmp_path):
    (tmp_path / "results.json").write_text("[]")
    proc = compbench("report", str(tmp_path))
    assert proc.returncode == 2
    assert "results.json is not a compbench results.json" in _one_error_line(proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no report, no plots


@pytest.mark.parametrize("reader", ["head -n 1", "true"])
def test_list_into_a_closed_pipe_is_quiet(reader):
    proc = subprocess.run(f"'{sys.executable}' -m compbench list | {reader}; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)
    assert proc.stderr == ""
    assert proc.returncode == 141  # as any tool a closed pipe stops (`yes | head`)


def test_ctrl_c_before_the_workers_start(tmp_path):
    out = tmp_path / "run"
    proc = start_compbench("train", *TINY, f"output_dir={out}", cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not catches_sigint(proc.pid):  # Python's KeyboardInterrupt handler is in place
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)  # into the imports / config check (several seconds), far from any worker
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted by Ctrl-C" in _one_error_line(err)
    assert not out.exists()


def test_many_workers_warn_once(tmp_path):
    cores = os.cpu_count() or 1
    proc = compbench("train", *TINY, f"engine.np={cores + 1}", "--cfg", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [f"warning: engine.np={cores + 1} workers share {cores} cores: steps will be slow "
                     f"and timings not representative"]


def test_hydra_run_dir_is_the_output_dir(tmp_path):
    proc = compbench("train", *TINY, f"hydra.run.dir={tmp_path / 'here'}", "--cfg")
    assert proc.returncode == 0, proc.stderr
    assert f"output_dir: {tmp_path / 'here'}" in proc.stdout


def test_sweep_into_a_used_folder_is_refused(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "0").mkdir()  # another sweep's job
    proc = compbench("train", "-m", *TINY, "seed=0,1", f"hydra.sweep.dir={used}", cwd=tmp_path)
    assert proc.returncode == 2
    assert f"hydra.sweep.dir={used} is not empty" in _one_error_line(proc.stderr)
    assert [p.name for p in used.iterdir()] == ["0"]


def test_worker_error_is_printed_once(tmp_path):
    """ImageNet's size is only known once the workers load it: the check stays in the workers, and
    the user sees the failing worker's own line once (not once per rank)."""
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / "inet" / split / c).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(tmp_path / "inet" / split / c / "0.png")
    out = tmp_path / "run"
    args = ["dataset=imagenet", f"dataset.root={tmp_path / 'inet'}", "dataset.num_classes=2", "epochs=1"]
    proc = compbench("train", *_base(args), *args, f"output_dir={out}", timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "batch_size=32 x 2 workers exceeds the 2 training samples" in _one_error_line(proc.stderr)
    assert json.loads((out / "results.json").read_text())["summary"]["status"] == "failed"


# -- in-process: folders, results.json, the rendezvous server ------------------------------------


def test_runs_started_together_never_share_a_folder(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from compbench.records.rundir import claim_fresh

    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda _: claim_fresh(tmp_path / "12-00-00"), range(16)))
    assert len(set(paths)) == 16 and all(p.is_dir() for p in paths)


def test_results_json_is_strict_and_reports_read_old_files(tmp_path):
    from compbench.records.results import write_json_atomic
    from compbench.report.main import load_runs

    new = tmp_path / "new"
    new.mkdir()
    summary = {"status": "completed", "final_acc1": float("nan"), "throughput": float("inf"),
               "x": [1.0, -float("inf")]}
    write_json_atomic(new / "results.json", {"summary": summary})
    text = (new / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))["summary"]["x"] == [1.0, None]
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text('{"summary": {"status": "completed", "final_acc1": NaN}}')
    rows = {r["job"]: r for r in load_runs(tmp_path)}
    assert rows["new"]["final_acc1"] is None and np.isnan(rows["old"]["final_acc1"])


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp[6] writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(addr)
    return found


def test_horovod_rendezvous_listens_on_loopback_only():
    pytest.importorskip("horovod")
    from compbench.launch.processes import LoopbackRendezvous

    server = LoopbackRendezvous()
    port = server.start()
    try:
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, and nothing on 0.0.0.0 or ::
        request = urllib.request.Request(f"http://127.0.0.1:{port}/README.md", method="HEAD")
        with pytest.raises(urllib.error.HTTPError) as refused:  # no peeking at the working directory
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 405
    finally:
        server.stop()
