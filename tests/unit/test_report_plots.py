"""`compbench report`'s figures and what it says of its runs, on synthetic results: rates from 0, bytes on
a linear axis with every bar labelled, every label inside its figure, the seeds and the load under
every figure and in report.md, no matplotlib warning; and a short run's summary says what its
throughput is the median of."""

from __future__ import annotations

import json
import warnings

import pytest

from compbench.records.results import format_summary
from compbench.report.main import main as report_main

SPLIT = {"compute_ms": 100.0, "compress_ms": 3.0, "comm_ms": 40.0, "comm_exposed_ms": 20.0,
         "decompress_ms": 1.0, "optimizer_ms": 2.0, "step_ms": 150.0}


def _run(root, name, compressor, ratio, throughput, sent, loaded=False, seed=0, lm=False):
    quality = ({"final_eval_loss": 2.0 + (ratio or 0), "final_ppl": 7.0, "tokens_per_s": throughput} if lm
               else {"final_acc1": 85.0 + (ratio or 0), "throughput": throughput})
    data = {"config": {"choices": {"compressor": compressor, "comm": "allgather"},
                       "compressor": {"ratio": ratio}, "seed": seed},
            "environment": {"world_size": 2, "cores": 2, "own_threads": 2, "load_before": 0.3,
                            "load_after": 4.0 if loaded else 2.0, "others_runnable": 2.2 if loaded else 0.1,
                            "loaded": loaded},
            "summary": {"status": "completed", **SPLIT, **quality, "bytes_sent_per_step": sent,
                        "bytes_dense_per_step": 4e7, "bytes_allreduce_per_step": 0.0,
                        "compressed_calls_per_step": 1, "dense_calls_per_step": 0}}
    (root / name).mkdir()
    (root / name / "results.json").write_text(json.dumps(data))


def _sweep(root, lm=False):
    _run(root, "none", "none", None, 158.0, 4e7, lm=lm)
    _run(root, "topk-0.01", "topk", 0.01, 169.0, 8e5, loaded=True, lm=lm)
    _run(root, "topk-0.001", "topk", 0.001, 170.0, 8e4, seed=1, lm=lm)


@pytest.mark.parametrize("lm", [False, True])
def test_the_report_plots_read_true_and_render_without_a_warning(tmp_path, monkeypatch, lm):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _sweep(tmp_path, lm)
    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report_main([str(tmp_path)]) == 0
    axes = {f.axes[0].get_ylabel(): f.axes[0] for f in figures}
    rate = axes[f"throughput ({'tokens' if lm else 'samples'}/s, all workers)"]
    assert rate.get_ylim()[0] == 0  # 158 against 170: not a cliff
    assert rate.get_xlabel() == "compression ratio (fraction of elements kept, log scale)"
    sent = axes["bytes sent per step per worker (MB)"]
    assert sent.get_yscale() == "linear" and sent.get_ylim()[0] == 0
    assert [t.get_text() for t in sent.texts] == ["40 MB", "80 kB", "800 kB"]  # each bar its value
    assert axes["time per step (ms, median)"].get_legend() is not None
    context = "seeds 0, 1; 1 of 3 runs on a loaded machine (other work 0.05-1.10 busy loops per core, load " \
              "average 0.3-4.0)"
    for figure in figures:  # the seeds and the load under every figure
        assert context in [t.get_text() for t in figure.texts]
        close(figure)
    assert f"3 run(s) under `{tmp_path}`, 0 failed; {context}." in (tmp_path / "report.md").read_text()
    assert len(list((tmp_path / "plots").glob("*.png"))) == 4


def test_a_report_without_a_completed_run_renders_without_a_warning(tmp_path):
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / "results.json").write_text(json.dumps(
        {"config": {"choices": {"compressor": "dgc"}, "compressor": {"ratio": 0.001}},
         "summary": {"status": "failed", "error": "OOM"}}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert report_main([str(tmp_path)]) == 0
    assert "seeds not recorded; the load not recorded." in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("steps, words", [
    (40, "(median after 5 warm-up steps, all workers)"),
    (4, "(step 4 alone, all workers: a 4-step run has no step after 5 warm-up ones, its first 3 left out)"),
    (1, "(step 1 alone, all workers: a 1-step run has no step after 5 warm-up ones)"),
])
def test_a_short_runs_summary_says_what_its_throughput_is(tmp_path, steps, words):
    s = {"steps": steps, "train_s": 1.0, "eval_s": 0.1, "train_time_s": 1.1, "final_acc1": 50.0,
         "best_acc1": 50.0, "throughput": 640.0, "bytes_sent_per_step": 1e6, "bytes_dense_per_step": 1e6,
         "ratio_effective": 1.0, **SPLIT}
    hp = {"compressor": "none", "comm": "allreduce", "memory": "none", "world_size": 2}
    text = format_summary({"summary": s, "hparams": hp}, tmp_path)
    line = next(x for x in text.splitlines() if x.strip().startswith("throughput"))
    assert line.endswith(f"640 samples/s {words}")
