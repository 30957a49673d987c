"""The race's model of sharded runs (sharding=fsdp|hsdp) on synthetic results: a run's bytes per
direction to its predicted communication at a bandwidth, its extrapolation to more workers, machines
and model sizes, the memory per worker that decides whether a configuration fits, the fit on such
runs, the report's what-if, the command's what-if flags, and the sharded suite's runs composed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from compbench.comm.cost_model import Fit
from compbench.race.main import main as race_main
from compbench.race.model import Profile, WhatIf, fit_model
from compbench.race.report import load, write
from compbench.race.suites import SHARDED, Link
from compbench.records.memory import predict_worker_bytes

LINK_ONLY = Fit(ms_per_waited=0.0, ms_per_queued=0.0, ms_per_round=0.0, link_factor=1.0,
                machine_gb_per_s=math.inf)
FIT = Fit(ms_per_waited=0.0, ms_per_queued=0.5, ms_per_round=0.2, link_factor=1.0, machine_gb_per_s=math.inf)
# model=gpt, 2 layers of 64: 107,584 parameters in 3 FSDP units (2 blocks and the root)
GPT = {"_target_": "compbench.models.gpt.gpt", "vocab_size": 85, "block_size": 32, "n_layer": 2,
       "n_embd": 64, "n_head": 4, "dropout": 0.0}
NUMEL, UNITS = 107_584, 3
MB = 1 << 20
ADAMW = {"name": "adamw", "lr": 1e-3, "betas": [0.9, 0.999], "weight_decay": 0.05}


def _results(step_ms: float = 150.0, comm_ms: float = 50.0, gathered: float = 6e6, scattered: float = 3e6,
             layout: str | None = "fsdp", world: int = 2, group: int = 2, replica: float = 0.0,
             every: int = 1, scatter: str = "none", stage: int = 3, hpz: bool = False,
             activations_mb: float = 10.0, **summary) -> dict:
    """A run's results.json: FSDP's bytes per direction, the replicas' exchange (an allreduce of
    `replica` bytes a step: DiLoCo's mean over its round where `every` > 1), a memory split."""
    shards = group if layout else 1
    memory = {"parameters": NUMEL * 4 / shards / MB, "gradients": NUMEL * 4 / shards / MB,
              "optimizer": NUMEL * 8 / shards / MB, "activations": activations_mb, "gathered": 0.1,
              "peak": 500.0, "peak_of": "process VmHWM"}
    sent = gathered + scattered + replica if layout else replica
    s = {"status": "completed", "step_ms": step_ms, "comm_ms": comm_ms, "compute_ms": 100.0,
         "bytes_sent_per_step": sent, "bytes_allreduce_per_step": replica,
         "bytes_dense_per_step": (3 * NUMEL * 4 if layout else 0) + replica,
         "compressed_calls_per_step": 0, "dense_calls_per_step": 1 / every if replica else 0,
         "memory_mb": [dict(memory) for _ in range(world)], **summary}
    if layout:
        s["sharded"] = {"layout": layout, "stage": stage, "shard_group": group, "replicas": world // group,
                        "gather": "none", "scatter": scatter, "hpz": hpz, "prefetch": 1,
                        "bytes_gathered_per_step": gathered, "bytes_scattered_per_step": scattered,
                        "bytes_replica_per_step": replica, "bytes_cross_node_per_step": 0.0}
    return {"config": {"choices": {"comm": "allreduce", "optim": "adamw"}, "optim": ADAMW, "model": GPT,
                       "max_train_s": 75},
            "environment": {"world_size": world},
            "exchange": {"every": every, "pattern": "allreduce", "hidden_steps": 0,
                         "overlaps_backward": every == 1},  # sync=step's layerwise hooks (they never fire)
            "summary": s, "curve": []}


def _ms(nbytes: float, gbps: float) -> float:
    return nbytes * 8 / (gbps * 1e9) * 1e3


def test_a_sharded_run_is_read_by_direction_and_unit():
    p = Profile.of(_results(gathered=6e6, scattered=3e6, scatter="int8"))
    sh = p.sharded
    assert sh is not None and p.memory is not None
    assert (sh.layout, sh.group, sh.units, sh.stage) == ("fsdp", 2, UNITS, 3)
    assert sh.gather_bytes == 6e6 / 6 and sh.scatter_bytes == 3e6 / 3  # 2 gathers and a scatter a unit
    assert sh.scatter_alltoall  # qgZ: an all-to-all
    assert p.memory.numel == NUMEL and p.memory.activation_bytes == 10.0 * MB
    assert p.row["bytes_sent_per_step"] == 0  # nothing crosses groups: one group
    assert not p.overlaps_backward  # the replicas' exchange runs after backward, on the shard view
    assert p.fixed_ms == 100.0
    assert Profile.of(_results(layout=None)).sharded is None


def test_bytes_per_direction_give_the_communication_at_a_bandwidth():
    p = Profile.of(_results(gathered=6e6, scattered=3e6))
    # 2 workers, each its own machine: a ring moves half of every buffer over the link
    assert p.fsdp_ms(LINK_ONLY, 0.1) == pytest.approx(_ms(0.5 * 9e6, 0.1))
    assert p.step_ms(LINK_ONLY, 0.1) == pytest.approx(100.0 + _ms(0.5 * 9e6, 0.1))
    # 6 all-gathers and 3 reduce-scatters a step, one round each; the delay waits once a round
    assert p.fsdp_ms(FIT, 1.0) == pytest.approx(9 * 0.5 + 9 * 0.2 + _ms(4.5e6, 1.0))
    assert p.step_ms(FIT, 1.0, latency_ms=5.0) == pytest.approx(100.0 + p.fsdp_ms(FIT, 1.0) + 9 * 5.0)
    # nothing hides FSDP's collectives: 10x slower link, 10x the link time
    slow, fast = p.step_ms(LINK_ONLY, 0.1) - 100.0, p.step_ms(LINK_ONLY, 1.0) - 100.0
    assert slow == pytest.approx(10 * fast)
    # stage 2 gathers once a step: 3 all-gathers of the same buffers
    two = Profile.of(_results(gathered=3e6, scattered=3e6, stage=2))
    assert two.sharded is not None and two.sharded.gather_bytes == 1e6
    assert two.fsdp_ms(LINK_ONLY, 0.1) == pytest.approx(_ms(0.5 * 6e6, 0.1))


def test_fsdp_extrapolates_to_4_and_8_workers():
    p = Profile.of(_results(gathered=6e6, scattered=3e6))
    for n in (4, 8):
        share = (n - 1) / n  # of every buffer over a worker's link
        assert p.fsdp_ms(LINK_ONLY, 1.0, workers=n) == pytest.approx(_ms(share * 9e6, 1.0))
        assert p.fsdp_ms(FIT, 1.0, workers=n) == pytest.approx(
            9 * 0.5 + 9 * (n - 1) * 0.2 + _ms(share * 9e6, 1.0))
        memory = p.memory_bytes(n)
        assert memory is not None
        mine = math.ceil(NUMEL / n) * 4
        assert (memory["parameters"], memory["gradients"], memory["optimizer"]) == (mine, mine, 2 * mine)
        assert memory["activations"] == 10.0 * MB
        # stage 3: a unit's gathered weights and the next one's (units taken as equal)
        assert memory["gathered"] == pytest.approx(NUMEL * 4 * 2 / 3)
        assert memory["total"] == pytest.approx(4 * mine + 10.0 * MB + NUMEL * 4 * 2 / 3)
    # 8 workers on 2 machines of 4: one ring over both, crossing each machine boundary once a round
    assert p.fsdp_ms(LINK_ONLY, 1.0, workers=8, per_node=4) == pytest.approx(_ms(7 / 8 * 9e6, 1.0))
    assert p.fsdp_ms(FIT, 1.0, workers=8, per_node=4, latency_ms=10.0) == pytest.approx(
        p.fsdp_ms(FIT, 1.0, workers=8, per_node=4) + 9 * 7 * 10.0)


def test_hsdp_keeps_its_groups_and_exchanges_across_them():
    """4 workers in shard groups of 2, DiLoCo every 10 steps: 1 MB a worker a round across groups."""
    p = Profile.of(_results(world=4, group=2, layout="hsdp", replica=1e6 / 10, every=10))
    assert p.row["bytes_sent_per_step"] == pytest.approx(1e6)  # one exchange: a round's bytes
    assert p.row["bytes_dense_per_step"] == NUMEL * 4 / 2  # its fp32: the shard's
    # 2 replica groups of 2: each ring allreduce moves 2 (R-1) / R of its shard's megabyte over a
    # worker's link, once every 10 steps
    assert p.comm_ms(LINK_ONLY, 0.1) == pytest.approx(_ms(1e6, 0.1))
    assert p.step_ms(LINK_ONLY, 0.1) == pytest.approx(100.0 + p.fsdp_ms(LINK_ONLY, 0.1) + _ms(1e6, 0.1) / 10)
    # 8 workers: 4 groups of 2; the shard groups' collectives as before, the exchange a ring of 4
    assert p.fsdp_ms(FIT, 0.1, workers=8) == pytest.approx(p.fsdp_ms(FIT, 0.1))
    assert p.comm_ms(LINK_ONLY, 0.1, workers=8) == pytest.approx(_ms(1.5e6, 0.1))
    assert p.comm_ms(FIT, 0.1, workers=8) == pytest.approx(0.5 + 6 * 0.2 + _ms(1.5e6, 0.1))
    # 2 machines of 4: 2 shard groups a machine, so 2 rings share each machine's link
    assert p.comm_ms(LINK_ONLY, 0.1, workers=8, per_node=4) == pytest.approx(_ms(2 * 1.5e6, 0.1))
    assert p.fsdp_ms(LINK_ONLY, 0.1, workers=8, per_node=4) == 0.0  # shard groups inside a machine
    memory, eight = p.memory_bytes(), p.memory_bytes(8)
    assert memory is not None and memory == eight  # a worker holds half of the model either way
    assert memory["parameters"] == NUMEL * 4 / 2
    with pytest.raises(ValueError, match="groups of 2 do not divide 5 workers"):
        p.step_ms(FIT, 0.1, workers=5)
    with pytest.raises(ValueError, match="3 workers per machine do not divide 8 workers"):
        p.step_ms(FIT, 0.1, workers=8, per_node=3)


def test_ddp_memory_is_whole_and_a_model_fits_sharded_where_it_does_not_whole():
    ddp = Profile.of(_results(layout=None, replica=NUMEL * 4, activations_mb=10.0))
    fsdp = Profile.of(_results(activations_mb=10.0))
    whole = ddp.memory_bytes(8)
    assert whole is not None
    assert whole["total"] == NUMEL * 16 + 10.0 * MB and whole["gathered"] == 0
    billion_ddp, billion_fsdp = ddp.scaled(1e9), fsdp.scaled(1e9)
    ddp_mem, fsdp_mem = billion_ddp.memory_bytes(8), billion_fsdp.memory_bytes(8)
    assert ddp_mem is not None and fsdp_mem is not None
    assert ddp_mem["parameters"] + ddp_mem["gradients"] + ddp_mem["optimizer"] == 16e9
    assert fsdp_mem["parameters"] + fsdp_mem["gradients"] + fsdp_mem["optimizer"] == pytest.approx(2e9)
    what = WhatIf(workers=8, memory_gb=12.0)
    assert what.fits(ddp_mem).endswith("does not fit")
    assert what.fits(fsdp_mem) == f"{fsdp_mem['total'] / 1e9:.3g} GB, fits"
    assert what.fits(None) == "-"
    # the same bytes predict_worker_bytes (compose's refusal) counts, over the shard group
    assert {k: fsdp_mem[k] for k in ("parameters", "gradients", "optimizer")} == {
        k: v for k, v in predict_worker_bytes(10**9, "adamw", ADAMW, 8).items() if k != "total"}


def test_a_model_size_scales_bytes_units_and_activations():
    p = Profile.of(_results(gathered=6e6, scattered=3e6))
    big = p.scaled(8 * NUMEL)  # 8x: twice as deep, twice as wide
    assert big.sharded is not None and big.memory is not None
    assert big.sharded.units == 2 * 2 + 1  # the blocks double, the root stays one
    assert big.sharded.gather_bytes * 2 * big.sharded.units == pytest.approx(8 * 6e6)  # a step's bytes x8
    assert big.sharded.scatter_bytes * big.sharded.units == pytest.approx(8 * 3e6)
    assert big.memory.activation_bytes == pytest.approx(4 * 10.0 * MB)  # depth x width
    assert big.fixed_ms == pytest.approx(8 * 100.0)
    assert big.fsdp_ms(LINK_ONLY, 1.0) == pytest.approx(8 * p.fsdp_ms(LINK_ONLY, 1.0))
    with pytest.raises(ValueError, match="no parameter count"):
        Profile.of({**_results(), "summary": {**_results()["summary"], "memory_mb": []}}).scaled(1e9)


def test_without_a_model_to_rebuild_the_recorded_parameters_count():
    results = _results()
    results["config"]["model"] = {"_target_": "nowhere.model"}
    p = Profile.of(results)
    assert p.sharded is not None and p.memory is not None
    assert p.sharded.units == 1 and p.sharded.gather_bytes == 6e6 / 2
    assert p.memory.numel == pytest.approx(NUMEL, abs=1)  # a worker's half, twice


def test_the_fit_recovers_the_network_from_sharded_and_whole_runs():
    truth = Fit(0.0, 0.5, 0.2, 1.0, math.inf)
    profiles = [Profile.of(_results(gathered=g, scattered=s))
                for g, s in ((6e6, 3e6), (2e6, 1e6), (1e6, 1e6))]
    profiles += [Profile.of(_results(world=4, group=2, layout="hsdp", replica=2e6 / 10, every=10)),
                 Profile.of(_results(layout=None, replica=4e6)),
                 Profile.of(_results(layout=None, replica=5e5))]
    rows = [(p, g, 0.0, p.step_ms(truth, g), False) for p in profiles for g in (0.01, 0.1, 1.0)]
    fit = fit_model(rows)
    for p, g, _, step, _ in rows:
        assert p.step_ms(fit, g) == pytest.approx(step, rel=1e-6)
    assert fit.ms_per_queued == pytest.approx(0.5, rel=1e-6)
    assert fit.ms_per_round == pytest.approx(0.2, rel=1e-6)


def _fake_race(out: Path) -> list:
    entries = []
    methods = {"ddp-adamw": dict(layout=None, replica=NUMEL * 4), "fsdp": {},
               "hsdp-diloco": dict(world=4, group=2, layout="hsdp", replica=NUMEL * 2 / 10, every=10)}
    for m, kw in methods.items():
        for link in (Link(100), Link(1000)):
            p = Profile.of(_results(**kw))
            step = p.step_ms(FIT, link.mbps / 1e3)
            res = _results(step_ms=step, comm_ms=step - 100.0, steps=200, tokens_per_s=1e6 / step,
                           utilization=100.0 / step,
                           target={"metric": "eval/loss", "value": 2.5, "reached": True, "step": 100,
                                   "train_s": step / 10}, **kw)
            res["curve"] = [{"step": s, "tokens": 1024 * s, "train_s": s * step / 1e3,
                             "eval/loss": 3.0 - s / 150} for s in (25, 50, 75, 100)]
            run_dir = out / "runs" / f"{m}-{link.folder}-s0"
            run_dir.mkdir(parents=True)
            (run_dir / "results.json").write_text(json.dumps(res))
            entries.append((m, link, 0, run_dir))
    return entries


def test_the_report_says_each_configurations_memory_and_whether_it_fits(tmp_path):
    whatif = WhatIf(workers=8, per_node=2, memory_gb=12.0, params=(1e9,))
    text = write(tmp_path, SHARDED, load(_fake_race(tmp_path)), quick=False, checks=None, whatif=whatif)
    header = next(x for x in text.splitlines() if x.startswith("| method ") and "reaches the target" in x)
    assert "8 workers (2 to a machine), 10 ms per message round" in header
    # the runs had 2 and 4 workers: 8, two to a machine, is the model's extrapolation, and says so
    assert ("memory per worker, 8 workers (model, extrapolated beyond what the runs had: 2/4 workers, "
            "each its own machine): fits 12 GB?") in header
    assert ("(model, extrapolated beyond what the runs had: 2/4 workers, each its own machine, one-way "
            "delays of 0 ms, 100-1000 Mbit/s)") in header
    rows = {c[0]: c for c in ([x.strip() for x in line.strip("|").split("|")]
                              for line in text.splitlines() if line.startswith("|"))
            if len(c) == 5}
    assert rows["ddp-adamw"][-1].endswith("fits")
    sized = [line for line in text.splitlines() if line.startswith("| ") and "1e+09" in line]
    assert len(sized) == 3  # each method at a billion parameters
    verdict = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in sized}
    assert verdict["ddp-adamw"].endswith("does not fit")  # 16 GB of state alone
    assert verdict["fsdp"].endswith(", fits")  # 2 GB of state
    assert verdict["hsdp-diloco"].endswith("does not fit")  # 8 GB of state, activations on top
    assert "What-if by model size, 8 workers (2 to a machine)" in text
    # a worker's wire: half of FSDP's booked volume (6 + 3 MB) in a shard group of 2, at 100 Mbit/s
    import pandas as pd

    runs = pd.read_csv(tmp_path / "race.csv")
    fsdp = runs[(runs["method"] == "fsdp") & (runs["link (Mbit/s)"] == 100)]
    assert fsdp["wire ms/exchange"].tolist() == [pytest.approx(_ms(4.5e6, 0.1))]


@pytest.mark.parametrize("argv, message", [
    (["--workers", "1"], "--workers 1 must be a whole number of workers from 2 to 1,000,000, e.g. "
                         "--workers 8"),
    (["--workers", "8", "--per-node", "3"], "--per-node 3 must divide --workers 8"),
    (["--per-node", "0"], "--per-node 0 must divide --workers 8"),
    (["--memory-gb", "0"], "--memory-gb 0 must be a worker's memory in GB, above 0"),
    (["--suite", "sharded", "--workers", "5"], "--workers 5: method hsdp-diloco shards in groups of 2 "
                                               "(sharding.group_size) and needs a multiple of 2 from 4, e.g. "
                                               "--workers 4"),
    (["--params", "1e9,x"], "--params 1e9,x must be a comma-separated list of model sizes in parameters"),
    (["--params", "0"], "--params 0 must be a comma-separated list"),
    (["--params", "1e9,1e9"], "--params 1e9,1e9 names 1000000000.0 twice; give each once"),
    (["--workers", "many"], "argument --workers: 'many' is not a whole number"),
])
def test_bad_what_if_flags_are_refused(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        race_main(argv)


def test_a_bad_flag_is_one_error_line_and_exit_2(capsys):
    from compbench.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["race", "--suite", "sharded", "--workers", "6", "--per-node", "4"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and err.startswith("error: --per-node 4 must divide --workers 6")


def test_the_what_if_flags_reach_the_report(monkeypatch, tmp_path):
    import compbench.race.main as race_module

    seen = {}
    monkeypatch.setattr(race_module, "check_jobs", lambda jobs, scratch: seen.update(jobs=jobs))
    monkeypatch.setattr(race_module, "run_jobs", lambda jobs, label: 0)
    monkeypatch.setattr(race_module, "write", lambda out, race, runs, quick, checks, whatif, not_run:
                        seen.update(whatif=whatif) or "")
    assert race_module.main(["--suite", "sharded", "--out", str(tmp_path), "--workers", "16", "--per-node",
                             "4", "--memory-gb", "24", "--params", "1.3e9,7e9"]) == 0
    assert seen["whatif"] == WhatIf(workers=16, per_node=4, memory_gb=24.0, params=(1.3e9, 7e9))
    assert len(seen["jobs"]) == 4 * 2  # 4 methods x 2 links x 1 seed


def test_the_sharded_suite_composes_every_run(tmp_path):
    """Every method on every link, the full race and --quick, as `compbench race --suite sharded`
    makes them, passes the config check (nothing written)."""
    from compbench.compose import config
    from compbench.records.memory import predict_worker_bytes as predict

    assert SHARDED.baseline in SHARDED.methods and SHARDED.links == (Link(1000), Link(100))
    assert SHARDED.seeds == 1 and set(SHARDED.methods) == {"ddp-adamw", "fsdp", "zeropp", "hsdp-diloco"}
    for quick in (False, True):
        target, budget = ((SHARDED.quick_target, SHARDED.quick_budget_s) if quick
                          else (SHARDED.target, SHARDED.budget_s))
        for m, overrides in SHARDED.methods.items():
            for link in SHARDED.links:
                cfg = config.check(config.compose(
                    [*SHARDED.base, *overrides, *link.overrides, target, "stop_at_target=true",
                     "eval_near_target=0.15", f"max_train_s={budget:g}", "budget_clock=unloaded", "nice=-20",
                     "seed=0", f"output_dir={tmp_path / m}"]))
                sharding = cfg.choices["sharding"]
                assert (sharding, cfg.engine.np) == {"ddp-adamw": ("none", 2), "fsdp": ("fsdp", 2),
                                                     "zeropp": ("fsdp", 2), "hsdp-diloco": ("hsdp", 4)}[m]
                assert cfg.choices["optim"] == "adamw" and cfg.choices["model"] == "gpt"
    assert not any(tmp_path.iterdir())
    # the preset: 1.6M parameters; 2 FSDP workers each hold half of DDP's parameters, gradients and state
    from compbench.models.gpt import gpt

    cfg = config.compose([*SHARDED.base, *SHARDED.methods["fsdp"]])
    numel = sum(p.numel() for p in gpt(85, cfg.model.block_size, cfg.model.n_layer, cfg.model.n_embd,
                                       cfg.model.n_head).parameters())
    assert 1.5e6 < numel < 1.7e6
    whole, half = predict(numel, "adamw", {}, 1)["total"], predict(numel, "adamw", {}, 2)["total"]
    assert 2 * half == pytest.approx(whole, abs=16)
