"""`compbench plan` (SeCoPa) end to end, and training that follows a plan (scheduler=secopa)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compbench.compressors import build_compressor
from tests.helpers import TINY, results, train

SMALL_MLP = ["model=mlp", "model.hidden=[32]", "dataset=synthetic", "dataset.image_size=8"]


def plan(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compbench.plan.main", *overrides], capture_output=True,
                          text=True, timeout=timeout)


def read_lines(path: Path) -> list[tuple[str, int, str, int]]:
    rows = [line.split(",") for line in path.read_text().splitlines()]
    return [(name, int(numel), flag, int(k)) for name, numel, flag, k in rows]


def test_vgg16_plan_on_a_slow_network_follows_the_model(tmp_path):
    out = tmp_path / "vgg16.csv"
    proc = plan("model=vgg16", "engine.np=4", "comm=ps", "net.gbps=1", f"output={out}")
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout and "scheduler=secopa" in proc.stdout
    rows = read_lines(out)
    from compbench.models.torchvision_models import torchvision_model

    with torch.device("meta"):
        model = torchvision_model("vgg16_bn", num_classes=10, image_size=32)
    assert [(n, p.numel()) for n, p in model.named_parameters()] == [(n, s) for n, s, _, _ in rows]
    by_name = {n: (flag, k) for n, _, flag, k in rows}
    for name, numel, flag, k in rows:
        assert 1 <= k <= 4
        if numel <= 1024:  # biases, batch-norm scales: latency-bound, compressing only adds work
            assert flag == "n", (name, numel)
    # The large fully connected layers: compressed, in several partitions.
    for fc in ("classifier.0.weight", "classifier.3.weight"):
        assert by_name[fc][0] == "y" and by_name[fc][1] > 1, (fc, by_name[fc])
    details = json.loads(out.with_suffix(".json").read_text())
    assert (details["world"], details["topology"], details["choices"]["compressor"]) == (4, "ps", "topk")
    assert details["summary"]["plan_s"] < details["summary"]["all_dense_s"]


def test_a_fast_network_compresses_less_than_a_slow_one(tmp_path):
    from compbench.plan.main import main

    slow, fast = tmp_path / "slow.csv", tmp_path / "fast.csv"
    for path, gbps in ((slow, "0.1"), (fast, "1000")):
        assert main([*SMALL_MLP, "engine.np=4", "comm=ring", f"net.gbps={gbps}", "net.latency_us=1",
                     f"output={path}"]) == 0
    compressed = {p: sum(flag == "y" for _, _, flag, _ in read_lines(p)) for p in (slow, fast)}
    assert compressed[slow] > compressed[fast], compressed


@pytest.mark.parametrize("args, message", [
    (["comm=allgather"], "comm=ps or comm=ring"),
    (["comm=ring", "compressor=signum"], "comm=allgather"),
    (["net.gbps=0"], "net.gbps=0"),
    (["compressor=none", "ratio=0.1"], "has no ratio"),
])
def test_plan_rejects_bad_settings(tmp_path, args, message):
    from compbench.plan.main import main

    with pytest.raises(ValueError, match=message):
        main([*SMALL_MLP, *args, f"output={tmp_path / 'p.csv'}"])
    assert not (tmp_path / "p.csv").exists()


def test_a_user_error_is_one_line_and_exit_code_2(tmp_path):
    proc = plan(*SMALL_MLP, "comm=allgather", f"output={tmp_path / 'p.csv'}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: compbench plan models comm=ps or comm=ring, not comm=allgather; add comm=ps"]


def test_a_plan_written_by_hand_is_not_overwritten(tmp_path):
    from compbench.plan.main import main

    mine = tmp_path / "p.csv"
    mine.write_text("layers.0.weight,1024,y,2\n")  # no PLAN.json beside it: not compbench's
    with pytest.raises(ValueError, match=r"p.csv exists and is not a plan compbench wrote"):
        main([*SMALL_MLP, "comm=ps", "net.gbps=1", f"output={mine}"])
    assert mine.read_text() == "layers.0.weight,1024,y,2\n"
    ours = tmp_path / "ours.csv"
    for _ in range(2):  # compbench's own plan may be replaced by a new one
        assert main([*SMALL_MLP, "comm=ps", "net.gbps=1", f"output={ours}"]) == 0


def test_a_plan_file_must_match_the_model(tmp_path):
    from compbench.schedulers.secopa import SeCoPa

    grads = [("w", 12, True), ("b", 3, False)]
    path = tmp_path / "plan.csv"
    with pytest.raises(ValueError, match="does not exist"):
        SeCoPa(plan=str(path))
    path.write_text("w,12,y,2\nb,3,n,1\n")
    sched = SeCoPa(plan=str(path))
    topk = build_compressor("topk")
    assert [ln.k for ln in sched._read(grads, "ps", topk, 2)] == [2, 1]
    for text, message in (("w,12,y,2\n", "no line for b"), ("w,13,y,2\nb,3,n,1\n", "13 elements"),
                          ("w,12,y,2\nb,3,n,1\nc,1,n,1\n", "names c")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            sched._read(grads, "ps", topk, 2)


@pytest.mark.dist
def test_training_follows_a_plan_file_on_the_ring(tmp_path):
    path = tmp_path / "plan.csv"
    # A slow network: the two weight matrices are compressed (fp16) in partitions, the biases (whose
    # savings are below an encode and decode per hop) stay dense. At 0.01 Gbit/s a 10-element bias was
    # a coin flip (predicted 83.0 dense vs 81.7 us compressed on a quiet machine); at 0.1, 54 vs 68 us.
    proc = plan(*SMALL_MLP, "compressor=fp16", "comm=ring", "engine=torch", "engine.np=2", "net.gbps=0.1",
                f"output={path}")
    assert proc.returncode == 0, proc.stderr
    rows = read_lines(path)
    assert any(flag == "y" and k == 2 for _, _, flag, k in rows)
    assert any(flag == "n" for _, _, flag, _ in rows)
    out, _ = train(tmp_path, *TINY, "compressor=fp16", "comm=ring", "engine=torch", "engine.np=2",
                   "scheduler=secopa", f"scheduler.plan={path}", "max_steps=3", "epochs=1", "eval=false")
    res = results(out)
    # Exactly the chosen gradients are compressed: fp16 sends 2 bytes per float over the ring
    # (2(N-1) chunks of 1/N for N=2), the dense ones 4.
    expected = sum(2 * numel if flag == "y" else 4 * numel for _, numel, flag, _ in rows)
    assert res["summary"]["bytes_sent_per_step"] == expected
    sched = res["scheduler"]
    assert sched["name"] == "secopa" and sched["lines"] == path.read_text().splitlines()
    assert sched["groups"] == sum(k if flag == "y" else 1 for _, _, flag, k in rows)


@pytest.mark.dist
def test_secopa_plans_at_startup_and_every_rank_agrees(tmp_path):
    out, _ = train(tmp_path, *TINY, "compressor=topk", "ratio=0.1", "memory=residual", "comm=ps",
                   "engine.np=2", "scheduler=secopa", "scheduler.gbps=0.001", "max_steps=3", "epochs=1",
                   "eval=false")
    res = results(out)
    sched = res["scheduler"]
    assert sched["plan"] == "planned at startup" and sched["network"].startswith("net model")
    assert sched["compressed"] >= 1 and sched["gradients"] == 4
    assert res["summary"]["bytes_sent_per_step"] < res["summary"]["bytes_dense_per_step"]
    assert res["summary"]["final_loss"] == res["summary"]["final_loss"]  # finite: the run trained


@pytest.mark.dist
@pytest.mark.slow
def test_plan_probes_the_engine_when_no_network_is_given(tmp_path):
    out = tmp_path / "probed.csv"
    proc = plan(*SMALL_MLP, "engine=torch", "engine.np=2", f"output={out}")
    assert proc.returncode == 0, proc.stderr
    details = json.loads(out.with_suffix(".json").read_text())
    assert details["network"] == "engine probe" and details["lines"]["send"]["overhead"] > 0
    assert len(read_lines(out)) == 4
