"""dataset=shakespeare with model=gpt through the real CLI (the corpus `make setup` fetched)."""

import json
import math

import pytest

from compbench.records.results import BY_AXIS, LM_TAGS
from tests.helpers import compbench, event_tags, results, train

pytestmark = pytest.mark.dist

SMALL = ["model=gpt", "dataset=shakespeare", "model.n_layer=1", "model.n_embd=32", "dataset.block_size=32",
         "dataset.eval_windows=16", "batch_size=8", "optim=adamw", "progress=false"]


def test_language_model_run_records_loss_perplexity_and_tokens(tmp_path):
    out, proc = train(tmp_path, *SMALL, "max_steps=20", "engine.np=2")
    r = results(out)
    s = r["summary"]
    assert s["steps"] == 20 and s["status"] == "completed"
    # Evaluated when max_steps stopped the run: loss per token (nats) and its exponential.
    assert 0 < s["final_eval_loss"] < math.log(85) + 0.5 and s["final_ppl"] == pytest.approx(
        math.exp(s["final_eval_loss"]))
    assert s["final_ood_loss"] > 0 and s["final_ood_ppl"] == pytest.approx(math.exp(s["final_ood_loss"]))
    assert s["tokens_per_s"] > 0 and "throughput" not in s and "final_acc1" not in s
    assert "after 5 warm-up steps" in r["summary_method"]["tokens_per_s"]
    d = r["data"]
    assert (d["tokenizer"], d["vocab_size"], d["block_size"]) == ("char", 85, 32)
    assert len(d["train_works"]) == 36 and len(d["val_works"]) == 6 and d["ood"] == "kjv"
    assert not set(d["train_works"]) & set(d["val_works"])
    assert event_tags(out) == set(LM_TAGS) | {tag for tag in BY_AXIS if tag.partition("/")[2] in LM_TAGS}
    assert "val loss     final" in proc.stdout and "tokens/s (median" in proc.stdout
    assert "eval/loss" in proc.stdout and "eval/ood_loss" in proc.stdout

    report = compbench("report", str(out))
    assert report.returncode == 0, report.stderr
    header = report.stdout.splitlines()[0]
    assert "tokens_per_s" in header and "eval_loss" in header and "final_acc1" not in header
    assert json.loads((out / "results.json").read_text())["config"]["model"]["vocab_size"] == 85


def test_missing_corpus_is_one_error_line_and_nothing_written(tmp_path):
    proc = compbench("train", *SMALL, f"dataset.root={tmp_path / 'none'}", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("error: dataset=shakespeare: no text corpus in") and "make setup" in line
    assert not (tmp_path / "run").exists()
