"""A 2x2 sweep on digits, then `compbench report` on it: tables, plots, what-if."""

import csv
import json
import math

import pytest

from compbench.report.whatif import RunProfile, break_even_workers, default_fit, predict_step_ms
from tests.helpers import TINY, compbench

pytestmark = pytest.mark.dist


# slow tier: ~23 s multirun; sweeps run in the default tier (test_cli, test_loggers) and the report on records
@pytest.mark.slow
def test_sweep_then_report(tmp_path):
    proc = compbench("train", "-m", "compressor=topk,randk", "ratio=0.1,0.01", "comm=allgather",
                     "memory=residual", *TINY, "epochs=2", "engine.np=2", f"outputs_root={tmp_path}",
                     cwd=tmp_path)
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

    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"ms_per_waited": 1.0, "ms_per_queued": 0.1, "ms_per_round": 0.1,
                               "link_factor": 1.2, "machine_gb_per_s": 2.0}))
    rep = compbench("report", str(sweep), "--fit", str(fit), "--per-node", "4")
    assert rep.returncode == 0, rep.stderr
    assert "4 worker(s) per machine; fitted: " in (sweep / "report.md").read_text()
    fit.write_text("{}")
    rep = compbench("report", str(sweep), "--fit", str(fit))
    assert rep.returncode == 2 and rep.stderr.startswith("error: --fit ") and "Traceback" not in rep.stderr


def _profile(comm: str, nbytes: float) -> RunProfile:
    return RunProfile(comm=comm, world_size=2, compute_ms=10.0, compress_ms=0.0, decompress_ms=0.0,
                      optimizer_ms=0.0, compressed_bytes=nbytes, dense_bytes=0.0, compressed_calls=1,
                      dense_calls=0, gradient_bytes=400 * 1e6)


def test_whatif_model_by_hand():
    mb, model = 1e6, default_fit(10.0)  # 10 us per round, links at their rate
    comm_ms = {comm: predict_step_ms(_profile(comm, nbytes), n, 8.0, model) - 10.0  # 8 Gbit/s = 1 GB/s
               for comm, nbytes, n in [("allreduce", 100 * mb, 4), ("allgather", mb, 8)]}
    # one worker per machine: the flat alpha-beta model of ALGORITHMS.md
    assert comm_ms["allreduce"] == pytest.approx(1e3 * (2 * 3 * 1e-5 + 2 * 3 / 4 * 0.1))  # ring, S=100 MB
    # 7 rounds, 7 payloads of 1 MB; and 7 rounds of the sizes' allgather before them
    assert comm_ms["allgather"] == pytest.approx(1e3 * (7e-5 + 7e-3 + 7e-5))
    # PS, S=4 MB: all-to-all (of counts, then shards; each one round) and an allgather of 1 MB shards;
    # the booked bytes are the shards plus the server's shard: S (1 + 1/N)
    ps = predict_step_ms(_profile("ps", 4 * mb * 5 / 4), 4, 8.0, model) - 10.0
    assert ps == pytest.approx(1e3 * (2e-5 + 3e-3 + 2 * 3e-5 + 3e-3))
    # 4 workers per machine on 2 machines: the allgather's link carries 7 payloads, the same as
    # above; comm=hierarchical sends 1 (K - 1) plus its two in-machine hops' latency
    hier = predict_step_ms(_profile("hierarchical", mb), 8, 8.0, model, per_node=4) - 10.0
    assert hier == pytest.approx(1e3 * (2 * 1e-5 + 2 * 7e-5 + 1e-3))
    # break-even: N * S < 2(N-1)/N * D. D = 400, S = 8: N=98 -> 784 < 791.8 holds, N=99 -> 792 < 791.9 fails
    assert break_even_workers(400, 8) == 98
    assert 98 * 8 < 2 * 97 / 98 * 400 and not 99 * 8 < 2 * 98 / 99 * 400
    assert break_even_workers(400, 400) == 1  # dense-sized payloads never win
    assert math.isinf(break_even_workers(400, 0))
