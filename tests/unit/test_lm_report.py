"""Language-model runs in `compbench report` and in one-line summaries: loss and tokens/s where a
classifier has accuracy and samples/s; classification tables unchanged."""

import json

from compbench.records.results import headline
from compbench.report.main import COLUMNS, columns_for, load_runs

CLS = {"status": "completed", "final_acc1": 91.0, "throughput": 800.0}
LM = {"status": "completed", "final_eval_loss": 1.74, "final_ppl": 5.7, "final_ood_loss": 1.75,
      "tokens_per_s": 15000.0, "final_loss": 1.7}


def _write(root, name, summary):
    (root / name).mkdir()
    (root / name / "results.json").write_text(json.dumps({"summary": summary, "config": {}}))


def test_report_columns_follow_the_runs(tmp_path):
    _write(tmp_path, "lm", LM)
    (row,) = load_runs(tmp_path)
    assert (row["eval_loss"], row["ppl"], row["ood_loss"], row["tokens_per_s"]) == (1.74, 5.7, 1.75, 15000.0)
    lm_cols = columns_for([row])
    assert "final_acc1" not in lm_cols and "throughput" not in lm_cols
    assert lm_cols.index("tokens_per_s") < lm_cols.index("eval_loss") < lm_cols.index("ppl")
    _write(tmp_path, "cls", CLS)
    rows = load_runs(tmp_path)
    assert columns_for([r for r in rows if "eval_loss" not in r]) == COLUMNS
    mixed = columns_for(rows)
    assert {"final_acc1", "throughput", "eval_loss", "tokens_per_s"} <= set(mixed)


def test_headline_names_the_metric_and_the_unit():
    assert headline(CLS) == ("acc1", 91.0, "samples/s", 800.0)
    assert headline(LM) == ("loss", 1.74, "tokens/s", 15000.0)
