"""What a run tells at its end and along the way: one labelled clock (training and evaluation
seconds), its position as a step of max_steps where those end it, `other` split into what is timed,
no out-of-domain line without out-of-domain text, faults by kind and world size, and each
evaluation as TensorBoard series against training milliseconds and bytes sent."""

from __future__ import annotations

from compbench.compose import config
from compbench.records.results import format_summary
from compbench.train import faults
from compbench.train.loop import Trainer
from tests.helpers import TINY, event_tags
from tests.threaded_engine import ThreadWorld


def _run(tmp_path, *overrides: str) -> dict:
    cfg = config.check(config.compose([*TINY, "checkpoint=false", *overrides]))
    return ThreadWorld(2).run(lambda engine: Trainer(cfg, engine, tmp_path).fit())[0]


def test_a_run_says_where_it_is_and_what_its_clock_counts(tmp_path, capsys):
    results = _run(tmp_path, "max_steps=6", "eval_every_steps=3")
    out = capsys.readouterr().out
    assert "step 3/6 (epoch 0.75): eval/acc1" in out and "s training" in out  # 4 steps an epoch
    s = results["summary"]
    assert s["train_s"] > 0 and s["eval_s"] > 0 and s["train_time_s"] >= s["train_s"]
    text = format_summary(results, tmp_path)
    assert f"6 steps: {s['train_s']:.1f} s training + {s['eval_s']:.1f} s evaluating" in text
    assert "  other        " in text and "check" in text and "write back" in text and "loop's own" in text
    assert {"by_train_ms/eval/acc1", "by_bytes_sent/eval/loss"} <= event_tags(tmp_path)


def test_an_epoch_bound_run_counts_epochs(tmp_path, capsys):
    _run(tmp_path, "epochs=1", "eval_points=1")
    assert "epoch 1.00/1 (step 4): eval/acc1" in capsys.readouterr().out


def test_no_out_of_domain_line_without_its_text(tmp_path):
    results = {"summary": {"steps": 1, "train_time_s": 1.0, "final_eval_loss": 2.0, "final_ppl": 7.4,
                           "best_eval_loss": 2.0, "final_ood_loss": None, "final_ood_ppl": None,
                           "tokens_per_s": 10.0, "bytes_sent_per_step": 1, "bytes_dense_per_step": 1,
                           "ratio_effective": 1.0},
               "hparams": {"compressor": "none", "comm": "allreduce", "memory": "none", "world_size": 2}}
    text = format_summary(results, tmp_path)
    assert "val loss" in text and "ood loss" not in text


def test_faults_are_summed_by_kind_and_world_size():
    recoveries = [{"kind": "failure", "lost_s": 1.25}, {"kind": "join", "lost_s": 0.5}]
    assert faults.summary(recoveries, [2, 2, 1, 1, 1, 2], 6, 2) == {
        "failure": 1, "join": 1, "restart": 0, "lost_s": 1.75, "steps_by_workers": {"2": 3, "1": 3}}
    assert faults.summary([], [], 5, 2)["steps_by_workers"] == {"2": 5}
