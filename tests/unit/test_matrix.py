"""The resumable matrix behind claims and race: a damaged run folder is an unfinished run (run again),
never a traceback; a finished run made with other settings is refused in one line."""

from __future__ import annotations

import json

import pytest

from compbench.cli.matrix import check_jobs, completed, overrides_of, summary_of
from tests.helpers import TINY


@pytest.mark.parametrize("results, overrides", [
    ("[]", "- seed=0\n"), ('{"summary": [1]}', "- seed=0\n"), ("{not json", ": : [\n"), (None, None)])
def test_a_damaged_run_folder_is_an_unfinished_run(tmp_path, results, overrides):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    if results is not None:
        (run / "results.json").write_text(results)
        (run / ".hydra" / "overrides.yaml").write_text(overrides)
    assert summary_of(run) is None and not completed(run)
    assert overrides_of(run) in ([], ["seed=0"])
    check_jobs([(run, [*TINY])], tmp_path / "check")  # checked as a run to make, not refused


def test_a_finished_run_with_other_settings_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"summary": {"status": "completed"}}))
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    with pytest.raises(ValueError, match="holds a finished run made with other settings; pass --out NEW_DIR"):
        check_jobs([(run, ["seed=0"])], tmp_path / "check")
