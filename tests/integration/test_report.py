"""A 2x2 sweep on digits, then `compbench report` on it: tables, plots, what-if."""

import csv
import json
import math

import pytest

from compbench.report.whatif import allgather_s, break_even_workers, ps_s, ring_allreduce_s
from tests.helpers import compbench

pytestmark = pytest.mark.dist


def test_sweep_then_report(tmp_path):
    proc = compbench("train", "-m", "compressor=topk,randk", "ratio=0.1,0.01", "comm=allgather",
                     "memory=residual", "model=mlp", "epochs=2", "engine.np=2", "progress=false",
                     f"outputs_root={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sweep = next((tmp_path / "multirun").glob("*/*"))
    jobs = sorted(sweep.glob("*/results.json"))
    assert len(jobs) == 4
    assert "completed" in proc.stdout.split("sweep:")[0]  # the summary table
    # one failed job must not break the report
    (sweep / "4").mkdir()
    (sweep / "4" / "results.json").write_text(json.dumps({"summary": {"status": "failed", "error": "boom"}}))

    rep = compbench("report", str(sweep))
    assert rep.returncode == 0, rep.stderr
    for name in ("throughput_vs_ratio", "accuracy_vs_ratio", "step_breakdown", "bytes_per_step"):
        png = sweep / "plots" / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    rows = {r["job"]: r for r in csv.DictReader(open(sweep / "report.csv"))}
    assert rows["4"]["status"] == "failed" and rows["4"]["error"] == "boom"
    for path in jobs:
        s = json.loads(path.read_text())["summary"]
        row = rows[path.parent.name]
        assert float(row["final_acc1"]) == pytest.approx(s["final_acc1"])
        assert float(row["bytes_per_step"]) == pytest.approx(s["bytes_sent_per_step"])
        assert float(row["throughput"]) == pytest.approx(s["throughput"])
        assert float(row["ratio_effective"]) == pytest.approx(s["ratio_effective"])
    md = (sweep / "report.md").read_text()
    assert "What-if scaling" in md and "Assumptions" in md and "- `4`: boom" in md


def test_whatif_model_by_hand():
    mb = 1e6
    # ring allreduce, N=4, S=100 MB, alpha=10 us, B=1 GB/s: 2*3*1e-5 + 2*3/4 * 0.1 s
    assert ring_allreduce_s(4, 100 * mb, 10e-6, 1e9) == pytest.approx(6e-5 + 0.15)
    # allgather, N=8, S=1 MB per rank: 7 alpha + 7 MB / B
    assert allgather_s(8, 1 * mb, 10e-6, 1e9) == pytest.approx(7e-5 + 7e-3)
    # PS, N=4, S=4 MB: two phases, each 3 alpha + 3 * 1 MB / B
    assert ps_s(4, 4 * mb, 10e-6, 1e9) == pytest.approx(2 * (3e-5 + 3e-3))
    assert ring_allreduce_s(1, mb, 1, 1) == allgather_s(1, mb, 1, 1) == 0.0
    # break-even: N * S < 2(N-1)/N * D. D = 400, S = 8: N=98 -> 784 < 791.8 holds, N=99 -> 792 < 791.9 fails
    assert break_even_workers(400, 8) == 98
    assert 98 * 8 < 2 * 97 / 98 * 400 and not 99 * 8 < 2 * 98 / 99 * 400
    assert break_even_workers(400, 400) == 1  # dense-sized payloads never win
    assert math.isinf(break_even_workers(400, 0))
