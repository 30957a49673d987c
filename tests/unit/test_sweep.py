"""Sweep planning: command-line axes, an experiment's axes and an experiment's explicit jobs."""

from compbench.cli.sweep import expand, plan_jobs
from compbench.compose import config


def test_cartesian_product_of_axes():
    jobs = expand(["compressor=dgc,dragonn,topk", "ratio=1e-2,1e-3", "engine.np=2"])
    # Hydra normalizes floats
    assert len(jobs) == 6 and ["compressor=dgc", "ratio=0.01", "engine.np=2"] in jobs


def test_experiment_axes_unless_the_command_line_sets_them():
    assert len(plan_jobs(["experiment=ratio_sweep"])) == 6
    jobs = plan_jobs(["experiment=ratio_sweep", "ratio=0.05"])
    assert len(jobs) == 3 and all("ratio=0.05" in j for j in jobs)


def test_seed_experiment_jobs_all_pass_the_config_checks():
    jobs = plan_jobs(["experiment=seeds"])
    picked = [config.check(config.compose(j)).choices for j in jobs]
    assert [(c["model"], c["compressor"]) for c in picked] == [
        ("vit_tiny", "dragonn"), ("mixer_b16", "dragonn"), ("resnet20", "dgc"), ("resnet20", "efsignsgd")]
