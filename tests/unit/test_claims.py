"""The claims suite as data: every run composes and passes the config check, every claim names known
runs, and each check gives the paper's own numbers a "holds" (and a broken result a "does not")."""

from __future__ import annotations

from pathlib import Path

import pytest

from compbench.claims import runner
from compbench.claims.findings import BASE, CLAIMS, RUNS, Stat

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def test_every_claim_names_known_runs_and_ids_are_unique():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS)
    for claim in CLAIMS:
        assert set(claim.runs) <= set(RUNS), claim.id


@pytest.mark.skipif(not FASHION_MNIST.is_dir(), reason="dataset-fashion-mnist is not installed (make setup)")
def test_every_run_composes_and_passes_the_check(tmp_path):
    """(The quick suite's setting is checked by its own run, tests/integration/test_claims.py.)"""
    from compbench import config

    for name, overrides in RUNS.items():
        cfg = config.check(config.compose([*BASE, *overrides, "seed=1", f"output_dir={tmp_path / name}"]))
        # "without error feedback" means it: no memory that feeds back.
        if name.endswith("-noef"):
            assert cfg.choices["memory"] == "none", name
    assert not any(tmp_path.iterdir())  # checking writes nothing


def _paper(**accs: float) -> dict[str, Stat]:
    """Two 'seeds' 0.2 apart around each published figure."""
    return {k.replace("_", "-"): Stat((v - 0.1, v + 0.1)) for k, v in accs.items()}


def test_grace_numbers_pass_the_grace_checks():
    grace = _paper(fp32=75.4, topk=73, topk_noef=42, randk=75, randk_noef=39, signsgd_noef=0.1 + 10,
                   signum_noef=0.1 + 10, efsignsgd=58, qsgd_noef=66, terngrad_noef=62)
    # GRACE's ImageNet chance is 0.1%; the checks use Fashion-MNIST's 10%, so sign failures sit there.
    checks = {c.id: c.check for c in CLAIMS}
    assert checks["grace-sparsifiers-ef"](grace)
    assert checks["grace-sign-ef"](grace)
    assert checks["grace-unbiased"](grace)
    broken = {**grace, "topk": Stat((50.0, 51.0))}  # EF helps, but recovers less than half the gap
    assert not checks["grace-sparsifiers-ef"](broken)


def test_other_checks_on_made_up_results():
    checks = {c.id: c.check for c in CLAIMS}
    r = _paper(fp32=91.0, dgc=90.7, dgc_residual=88.0, powersgd_r1=89.0, powersgd_r2=89.8, powersgd_r4=90.5,
               powersgd_ag=89.5, powersgd_ag_noef=80.0, dragonn=89.5, topk=90.0, dgc_1pct=90.2,
               topk_mergecomp=90.05, topk_ps=89.9, topk_ps_secopa=89.95)
    r["atomo"], r["qsgd-2bit"] = Stat((88.0, 88.4), 100e3), Stat((88.1, 88.3), 108e3)
    for cid in ("dgc-momentum-correction", "powersgd-rank", "powersgd-ef", "atomo-vs-qsgd",
                "dragonn-vs-topk-dgc", "fusion-partition-accuracy"):
        assert checks[cid](r), cid
    assert not checks["dgc-momentum-correction"]({**r, "dgc": Stat((89.0, 89.2))})  # 1.9 points below fp32
    assert not checks["powersgd-rank"]({**r, "powersgd-r4": Stat((87.0, 87.2))})
    assert not checks["atomo-vs-qsgd"]({**r, "atomo": Stat((88.0, 88.4), 200e3)})  # twice the bytes
    assert not checks["fusion-partition-accuracy"]({**r, "topk-mergecomp": Stat((85.0, 85.2))})


def test_only_refuses_an_unknown_claim():
    with pytest.raises(ValueError, match="unknown claim nope; choose from grace-sparsifiers-ef"):
        runner.main(["--only", "nope"])


def test_table_row_says_no_data_for_a_missing_run():
    row = runner._row(CLAIMS[0], {"fp32": Stat((90.0, 90.2))})
    assert row[-1] == "no data" and "topk" in row[-2]
    # A run that failed (e.g. diverged) says why: that is a finding, not a gap.
    row = runner._row(CLAIMS[0], {"fp32": Stat((90.0, 90.2))}, {"topk": "seed 1 failed: non-finite gradient"})
    assert "topk seed 1 failed: non-finite gradient" in row[-2]
