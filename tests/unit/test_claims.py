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
    from compbench.compose import config

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


# The text suite (compbench.claims.text): losses, lower is better.

def _losses(**runs: tuple[float, float | None]) -> dict[str, Stat]:
    """Two 'seeds' 0.02 apart around each loss, with its bytes per step."""
    return {k.replace("_", "-"): Stat((v - 0.01, v + 0.01), b) for k, (v, b) in runs.items()}


def _published() -> dict[str, Stat]:
    """Results shaped as the papers report them: classic compressors lose, randk worst; DiLoCo within
    3% at 1/30 of the bytes; SparseLoCo below DiLoCo at ~90x fewer; DeMo within 4% at ~85x fewer;
    1-bit Adam within 1%; the field suite's: 1-bit LAMB within 1% of LAMB at 1/5 of its bytes, MuLoCo
    below AdamW-DiLoCo at the same bytes, DES-LOC within 1% of Local Adam at half its bytes."""
    dense = 3.25e6
    return _losses(ddp_adamw=(1.80, dense), topk_adamw=(2.10, 0.08e6), randk_adamw=(2.60, 0.08e6),
                   diloco=(1.85, dense / 30), sparseloco=(1.80, dense / 30 / 90),
                   demo=(1.87, dense / 85), onebit_adam=(1.82, dense / 6),
                   adamw_onebit_schedule=(1.81, dense), onebit_adam_dense=(1.81, dense),
                   lamb=(1.90, dense),
                   onebit_lamb=(1.91, dense / 5), noloco=(1.86, dense / 30), sparta=(1.84, dense / 200),
                   sparta_diloco=(1.83, dense / 30 + dense / 200),
                   muloco=(1.78, dense / 30 / 14), diloco_adamw_ef=(1.86, dense / 30 / 14),
                   local_adam=(1.83, 3 * dense / 10), desloc=(1.84, 1.5 * dense / 10))


def test_text_suite_names_known_runs_and_composes(tmp_path):
    from compbench.claims.field import CLAIMS as FIELD_CLAIMS
    from compbench.claims.field import QUICK_RUNS as FIELD_QUICK_RUNS
    from compbench.claims.field import RUNS as FIELD_RUNS
    from compbench.claims.text import CLAIMS as TEXT_CLAIMS
    from compbench.claims.text import QUICK, QUICK_RUNS
    from compbench.claims.text import RUNS as TEXT_RUNS
    from compbench.compose import config

    ids = [c.id for c in (*TEXT_CLAIMS, *FIELD_CLAIMS, *CLAIMS)]
    assert len(set(ids)) == len(ids)
    for claim in TEXT_CLAIMS:
        assert set(claim.runs) <= set(TEXT_RUNS) == set(QUICK_RUNS), claim.id
    for claim in FIELD_CLAIMS:
        assert set(claim.runs) <= set(FIELD_RUNS) == set(FIELD_QUICK_RUNS), claim.id
    assert TEXT_RUNS["onebit-adam"][-2:] == ("sync.freeze_step=90", "optim.warmup_steps=300")
    assert QUICK_RUNS["onebit-adam"][-2:] == ("sync.freeze_step=36", "optim.warmup_steps=120")  # of 240 steps
    # its controls: AdamW on the same rate warm-up and weight decay; its own rule never frozen
    assert {"optim.warmup_steps=300", "optim.weight_decay=0", "compressor=none"} <= set(
        TEXT_RUNS["adamw-onebit-schedule"])
    assert TEXT_RUNS["onebit-adam-dense"][-2:] == ("sync.freeze_step=601", "optim.warmup_steps=300")
    assert QUICK_RUNS["onebit-adam-dense"][-2:] == ("sync.freeze_step=241", "optim.warmup_steps=120")
    # The quick setting composes and passes the check (its corpus is checked at run time, not here).
    for name, overrides in {**QUICK_RUNS, **FIELD_QUICK_RUNS}.items():
        cfg = config.check(config.compose([*QUICK, *overrides, "seed=0", f"output_dir={tmp_path / name}"]))
        assert cfg.max_steps == 240 and cfg.choices["model"] == "gpt", name
    assert not any(tmp_path.iterdir())


def test_text_checks_hold_on_published_shaped_results():
    from compbench.claims.field import CLAIMS as FIELD_CLAIMS
    from compbench.claims.text import CLAIMS as TEXT_CLAIMS

    r = _published()
    for claim in (*TEXT_CLAIMS, *FIELD_CLAIMS):
        assert claim.check(r), claim.id


def test_text_checks_fail_when_the_finding_does_not_hold():
    """Each check, one broken result at a time; a lower loss is better, so the directions matter."""
    from compbench.claims.field import CLAIMS as FIELD_CLAIMS
    from compbench.claims.text import CLAIMS as TEXT_CLAIMS

    checks = {c.id: c.check for c in TEXT_CLAIMS}
    r = _published()
    dense = r["ddp-adamw"].bytes_per_step
    # top-k below (better than) DDP's loss: classic compressors do not lose.
    assert not checks["adamw-classic-compressors"]({**r, "topk-adamw": Stat((1.70, 1.72), 0.08e6)})
    # random-k better than top-k: it is not the worst.
    assert not checks["adamw-classic-compressors"]({**r, "randk-adamw": Stat((2.00, 2.02), 0.08e6)})
    # overlapping seeds with DDP: not beyond seed noise.
    assert not checks["adamw-classic-compressors"]({**r, "topk-adamw": Stat((1.70, 1.95), 0.08e6)})
    # DiLoCo 10% above DDP, or at 1/10 of its bytes instead of 1/30.
    assert not checks["diloco-approaches-ddp"]({**r, "diloco": Stat((1.97, 1.99), dense / 30)})
    assert not checks["diloco-approaches-ddp"]({**r, "diloco": Stat((1.84, 1.86), dense / 10)})
    # SparseLoCo above DiLoCo's loss (worse), overlapping it, or at only 10x fewer bytes.
    diloco_bytes = r["diloco"].bytes_per_step
    assert not checks["sparseloco-beats-diloco"]({**r, "sparseloco": Stat((1.90, 1.92), diloco_bytes / 90)})
    assert not checks["sparseloco-beats-diloco"]({**r, "sparseloco": Stat((1.80, 1.85), diloco_bytes / 90)})
    assert not checks["sparseloco-beats-diloco"]({**r, "sparseloco": Stat((1.79, 1.81), diloco_bytes / 10)})
    # DeMo far above AdamW's loss, or without bytes recorded.
    assert not checks["demo-near-adamw"]({**r, "demo": Stat((2.20, 2.22), dense / 85)})
    assert not checks["demo-near-adamw"]({**r, "demo": Stat((1.86, 1.88), None)})
    # DeMo better than AdamW is "near" too (the check bounds it from above only).
    assert checks["demo-near-adamw"]({**r, "demo": Stat((1.60, 1.62), dense / 85)})
    # 1-bit Adam 5% off either way does not match; the reference is its own rule run dense, so
    # matching AdamW (with bias correction) instead does not count.
    assert not checks["onebit-adam-matches-adam"]({**r, "onebit-adam": Stat((1.88, 1.90), dense / 6)})
    assert not checks["onebit-adam-matches-adam"]({**r, "onebit-adam": Stat((1.70, 1.72), dense / 6)})
    assert not checks["onebit-adam-matches-adam"]({**r, "onebit-adam-dense": Stat((1.70, 1.72), dense)})
    assert checks["onebit-adam-matches-adam"]({**r, "adamw-onebit-schedule": Stat((1.70, 1.72), dense)})
    # 1-bit LAMB 5% above LAMB, or at only 3x fewer bytes.
    field = {c.id: c.check for c in FIELD_CLAIMS}
    assert not field["onebit-lamb-matches-lamb"]({**r, "onebit-lamb": Stat((1.99, 2.01), dense / 5)})
    assert not field["onebit-lamb-matches-lamb"]({**r, "onebit-lamb": Stat((1.90, 1.92), dense / 3)})


def test_noloco_and_sparta_checks_fail_when_the_finding_does_not_hold():
    from compbench.claims.field import CLAIMS as FIELD_CLAIMS

    checks = {c.id: c.check for c in FIELD_CLAIMS}
    r = _published()
    dense = r["ddp-adamw"].bytes_per_step
    # NoLoCo 10% above DiLoCo's loss.
    assert not checks["noloco-close-to-diloco"]({**r, "noloco": Stat((2.03, 2.05), dense / 30)})
    # SPARTA far above DDP's loss, or at only 10x fewer bytes.
    assert not checks["sparta-near-ddp"]({**r, "sparta": Stat((2.10, 2.12), dense / 200)})
    assert not checks["sparta-near-ddp"]({**r, "sparta": Stat((1.84, 1.84), dense / 10)})
    # SPARTA + DiLoCo no better than DiLoCo.
    assert not checks["sparta-improves-diloco"]({**r, "sparta-diloco": Stat((1.86, 1.88), dense / 29)})


def test_text_method_table_rows_give_loss_bytes_ratio_and_tokens():
    from compbench.claims.text import CLAIMS as TEXT_CLAIMS
    from compbench.claims.text import RUNS as TEXT_RUNS

    r = {"ddp-adamw": Stat((1.79, 1.81), 3.25e6, 3.25e6, 14000.0),
         "demo": Stat((1.86, 1.88), 3.25e6 / 85, 3.25e6, 9000.0)}
    rows = {row[0]: row for row in runner._method_rows(list(TEXT_CLAIMS), r, {"diloco": "seed 0 did not run"},
                                                        TEXT_RUNS)}
    assert rows["ddp-adamw"][2:] == ("1.800 +- 0.010", "3250.0", "1.0x", "14,000")
    assert rows["demo"][3:5] == ("38.2", "85.0x") and "sync=demo" in rows["demo"][1]
    assert rows["diloco"][2] == "no data: seed 0 did not run"
    assert list(rows) == list(dict.fromkeys(n for c in TEXT_CLAIMS for n in c.runs))


def test_suite_option_picks_the_text_claims_for_only():
    with pytest.raises(ValueError, match="unknown claim nope; choose from adamw-classic-compressors"):
        runner.main(["--suite", "text", "--only", "nope"])


def test_muloco_and_desloc_checks_fail_when_the_finding_does_not_hold():
    from compbench.claims.field import CLAIMS as FIELD_CLAIMS

    checks = {c.id: c.check for c in FIELD_CLAIMS}
    r = _published()
    q2 = r["muloco"].bytes_per_step
    # MuLoCo not below AdamW-DiLoCo beyond seed noise, or at 1.5x its bytes.
    assert not checks["muloco-beats-adamw-diloco"]({**r, "muloco": Stat((1.85, 1.87), q2)})
    assert not checks["muloco-beats-adamw-diloco"]({**r, "muloco": Stat((1.77, 1.79), 1.5 * q2)})
    # DES-LOC 5% above Local Adam, or at 2/3 of its bytes instead of 1/2.
    local = r["local-adam"]
    sent = local.bytes_per_step
    assert not checks["desloc-halves-local-adam"]({**r, "desloc": Stat((1.91, 1.93), sent / 2)})
    assert not checks["desloc-halves-local-adam"]({**r, "desloc": Stat((1.83, 1.85), sent / 1.5)})


def test_elastic_suite_composes_and_its_claim_compares_loss_increases(tmp_path):
    from compbench.claims.elastic import CLAIMS as ELASTIC_CLAIMS
    from compbench.claims.elastic import SUITE
    from compbench.compose import config
    from compbench.network import netem

    assert set(SUITE.quick_runs) == set(SUITE.runs) == set(ELASTIC_CLAIMS[0].runs)
    assert SUITE.runs["diloco-fail"][-1] == "fault.at_step=300" and SUITE.quick_runs["diloco-fail"][-1] == \
        "fault.at_step=120"  # the middle of 600 and of 240 steps
    if netem.can_shape():  # engine.elastic=true needs root on one machine
        for name, overrides in SUITE.quick_runs.items():
            cfg = config.check(config.compose([*SUITE.quick, *overrides, "seed=0",
                                               f"output_dir={tmp_path / name}"]))
            assert cfg.engine.elastic and cfg.max_steps == 240, name
        assert not any(tmp_path.iterdir())
    (claim,) = ELASTIC_CLAIMS
    base = {"ddp-adamw": Stat((2.0,)), "topk-adamw": Stat((2.5,)), "diloco": Stat((2.1,))}
    holds = {**base, "ddp-adamw-fail": Stat((2.2,)), "topk-adamw-fail": Stat((2.8,)),
             "diloco-fail": Stat((2.15,))}
    assert claim.check(holds)
    assert not claim.check({**holds, "diloco-fail": Stat((2.35,))})  # +0.25 is more than DDP's +0.2


def test_text_suite_runs_one_bit_adam_and_its_control_on_three_seeds(tmp_path):
    """The full text suite: 2 seeds a run, 3 for 1-bit Adam and its control; --seeds N and --quick set
    every run's, and a run's claim has data only when all of its own seeds completed."""
    from compbench.claims.text import CLAIMS as TEXT_CLAIMS
    from compbench.claims.text import TEXT

    names = list(dict.fromkeys(n for c in TEXT_CLAIMS for n in c.runs))
    seeds = TEXT.seeds_of(names, None, quick=False)
    assert {n for n, k in seeds.items() if k == 3} == {"onebit-adam", "onebit-adam-dense",
                                                       "adamw-onebit-schedule"}
    assert set(seeds.values()) == {2, 3}
    assert set(TEXT.seeds_of(names, 1, quick=False).values()) == {1}
    assert set(TEXT.seeds_of(names, None, quick=True).values()) == {1}
    onebit = [c for c in TEXT_CLAIMS if c.id == "onebit-adam-matches-adam"]
    jobs = runner._plan(onebit, seeds, list(TEXT.base), tmp_path, TEXT.runs)
    assert sorted(p.name for p, _ in jobs) == sorted(f"{n}-s{s}" for n in onebit[0].runs
                                                     for s in range(seeds[n]))
    _, errors = runner._collect(onebit, seeds, tmp_path, TEXT.metric)
    assert errors["onebit-adam"] == "seed 0 did not run"
