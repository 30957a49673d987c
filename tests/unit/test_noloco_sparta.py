"""sync=noloco, sync=sparta and sync=sparta_diloco against small re-implementations of their references
(jkolehm/noloco `sparse_optimizer_c.py`; ExoGym's `sparta.py` and `sparta_diloco.py`), their bytes,
exact resume, their refusals, and the replica diagnostics. Ranks are threads (tests/threaded_engine.py)."""

from __future__ import annotations

import copy
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compbench.catalog import registry
from compbench.comm.cost_model import Shape, _zero, group_allreduce, ring_allreduce
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from compbench.sync.noloco import groups
from compbench.sync.sparta import masks
from compbench.train.replicas import diagnose
from tests.helpers import TINY, results, sync_step, train
from tests.integration.test_resume import _assert_equal
from tests.threaded_engine import ThreadWorld

H, ROUNDS = 3, 3
INNER = {"name": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "weight_decay": 0.05}
_GLOBAL_RNG = threading.Lock()


def _model() -> torch.nn.Module:
    with _GLOBAL_RNG:  # the ranks are threads: torch's global generator must not interleave
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randint(3, (4,), generator=g)


def _workers(world: int) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
    workers = [_model() for _ in range(world)]
    inner = [torch.optim.AdamW(w.parameters(), lr=0.01, betas=(0.9, 0.999), weight_decay=0.05)
             for w in workers]
    return workers, inner


def _inner_step(workers, inner, step: int) -> None:
    for rank, (w, opt) in enumerate(zip(workers, inner, strict=True)):
        x, y = _batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(w(x), y).backward()
        opt.step()


def _nodes(sync: str, **options: object) -> dict:
    parts = (("compressor", "none"), ("memory", "none"), ("comm", "allreduce"), ("scheduler", "layerwise"))
    return {g: registry.option_config(g, name) for g, name in parts} | {
        "sync": {**registry.option_config("sync", sync), **options}}


def _run(nodes: dict, steps: int):
    def body(engine):
        stats = StepStats()
        sync = build_synchronizer(nodes, engine, stats)
        model = sync.setup(_model())
        opt = sync.make_optimizer(model, dict(INNER))
        sent = []
        for step in range(steps):
            stats.reset()
            x, y = _batch(engine.rank, step)
            sync_step(sync, opt, step, model, x, y)
            sent.append(stats.bytes_sent)
        return [p.detach().clone() for p in model.parameters()], sent, sync
    return body


# --- NoLoCo ---------------------------------------------------------------------------------------

def _noloco_reference(world: int) -> list[list[torch.Tensor]]:
    """The reference's outer step, two group means (of φ and of θ − φ), heavy-ball momentum; groups
    from its permutation (numpy default_rng(step + 1)) dealt round-robin into pairs."""
    workers, inner = _workers(world)
    phi = [[p.detach().clone() for p in w.parameters()] for w in workers]
    mom = [[torch.zeros_like(p) for p in w.parameters()] for w in workers]
    step = 0
    for _ in range(ROUNDS):
        for _ in range(H):
            _inner_step(workers, inner, step)
            step += 1
        perm = [int(x) for x in np.random.default_rng(step + 1).permutation(world)]
        n = world // 2
        pairs = [[r for i, r in enumerate(perm) if i % n == g] for g in range(n)]
        with torch.no_grad():
            new = []
            for rank in range(world):
                group = next(g for g in pairs if rank in g)
                row = []
                for i in range(len(phi[rank])):
                    mean_phi = sum(phi[r][i] for r in group) / len(group)
                    mean_g = sum(list(workers[r].parameters())[i] - phi[r][i] for r in group) / len(group)
                    m = mom[rank][i]
                    m.add_((0.3 - 1.0) * m + 0.7 * mean_g + 0.7 * (mean_phi - phi[rank][i]))
                    row.append(phi[rank][i] + m)
                new.append(row)
            for rank in range(world):
                for i, p in enumerate(workers[rank].parameters()):
                    phi[rank][i] = new[rank][i]
                    p.copy_(new[rank][i])
    return [[p.detach().clone() for p in w.parameters()] for w in workers]


def test_noloco_matches_the_reference_with_four_workers_in_pairs():
    expected = _noloco_reference(4)
    out = ThreadWorld(4).run(_run(_nodes("noloco", inner_steps=H), H * ROUNDS))
    numel = sum(p.numel() for p in expected[0])
    for rank, (params, sent, _) in enumerate(out):
        for got, want in zip(params, expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert sent == [0, 0, 4 * numel] * ROUNDS  # the model's fp32 bytes, once per round
    # pairs: replicas stay apart (a global average would make them equal)
    assert not torch.equal(out[0][0][0], out[1][0][0]) or not torch.equal(out[0][0][0], out[2][0][0])


def test_noloco_groups_are_a_partition_the_same_on_every_rank():
    for taken in (3, 6, 100):
        g = groups(8, 2, taken)
        assert sorted(r for pair in g for r in pair) == list(range(8)) and all(len(p) == 2 for p in g)
        assert g == groups(8, 2, taken)
    assert [sorted(g) for g in groups(2, 2, 5)] == [[0, 1]]  # 2 workers: the one pair is both


def test_the_pairs_cost_model_is_the_ring_of_a_pair():
    shape = Shape(nodes=8, workers=8, gbps=1.0)
    whole, pairs = _zero(), _zero()
    ring_allreduce(whole, shape, 1e6)
    group_allreduce(pairs, shape, 1e6, 1.0, 8)
    assert whole == pairs  # a group of every worker is the world's ring
    pairs = _zero()
    group_allreduce(pairs, shape, 1e6, 1.0, 2)
    assert pairs["rounds"] == 2 and pairs["cross_s"] < whole["cross_s"]


# --- SPARTA ----------------------------------------------------------------------------------------

def _sparse_reference(workers, p: float, step: int) -> None:
    """ExoGym's SparseCommunicator: per tensor, the masked entries averaged (masks as compbench draws
    them: the deviation, instead of rank 0's broadcast)."""
    with torch.no_grad():
        per_worker = [list(w.parameters()) for w in workers]
        picked = masks(per_worker[0], p, 0, step)
        for i, m in enumerate(picked):
            mean = sum(ps[i].data[m] for ps in per_worker) / len(workers)
            for ps in per_worker:
                ps[i].masked_scatter_(m, mean)


def test_sparta_matches_the_reference_and_books_the_picked_values():
    p, steps = 0.3, 6
    workers, inner = _workers(2)
    for step in range(steps):
        _inner_step(workers, inner, step)
        _sparse_reference(workers, p, step + 1)
    out = ThreadWorld(2).run(_run(_nodes("sparta", p=p), steps))
    for rank, (params, sent, _) in enumerate(out):
        for got, want in zip(params, workers[rank].parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        shapes = [q.detach() for q in workers[0].parameters()]
        assert sent == [4 * sum(int(m.sum()) for m in masks(shapes, p, 0, s + 1)) for s in range(steps)]


def test_sparta_diloco_matches_the_reference():
    """ExoGym's order: the sparse averaging after each inner step, DiLoCo's outer step every H."""
    p = 0.3
    workers, inner = _workers(2)
    global_model = _model()
    outer = torch.optim.SGD(global_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    step = 0
    for _ in range(ROUNDS):
        for _ in range(H):
            _inner_step(workers, inner, step)
            step += 1
            _sparse_reference(workers, p, step)
        with torch.no_grad():
            for i, q in enumerate(global_model.parameters()):
                q.grad = sum(q - list(w.parameters())[i] for w in workers) / 2
            outer.step()
            for w in workers:
                for pw, q in zip(w.parameters(), global_model.parameters(), strict=True):
                    pw.copy_(q)
    out = ThreadWorld(2).run(_run(_nodes("sparta_diloco", p=p, inner_steps=H), H * ROUNDS))
    for params, _, _ in out:
        for got, want in zip(params, global_model.parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_sparta_state_round_trips_mid_run():
    """A fresh synchronizer loaded from the state of step 4 continues exactly as the original."""
    def body(engine):
        stats = StepStats()
        syncs, models, opts = [], [], []
        for _ in range(2):
            sync = build_synchronizer(_nodes("sparta", p=0.3), engine, stats)
            model = sync.setup(_model())
            syncs.append(sync), models.append(model), opts.append(sync.make_optimizer(model, dict(INNER)))

        def step(i: int, k: int) -> None:
            x, y = _batch(engine.rank, k)
            opts[i].zero_grad()
            F.cross_entropy(models[i](x), y).backward()
            opts[i].step()
            syncs[i].after_step()

        for k in range(4):
            step(0, k)
        syncs[1].load_state_dict(copy.deepcopy(syncs[0].state_dict()))
        for k in range(4, 7):
            step(0, k)
            step(1, k)
        pairs = zip(models[0].parameters(), models[1].parameters(), strict=True)
        return [torch.equal(a, b) for a, b in pairs]

    assert all(all(same) for same in ThreadWorld(2).run(body))


# --- resume, composition and diagnostics (real launcher, 2 ranks) ----------------------------------

COMMON = [*TINY, "batch_size=16", "epochs=2", "optim=adamw", "optim.lr_schedule=constant"]


@pytest.mark.dist
@pytest.mark.parametrize("mode", [
    ["sync=noloco", f"sync.inner_steps={H}"],
    # the outer step through a compressor: SPARTA + DiLoCo composes with the pipeline (slow: a second
    # ~15 s job; its composition is swept in process by test_sync_combinations)
    pytest.param(["sync=sparta_diloco", f"sync.inner_steps={H}", "sync.p=0.1", "compressor=topk", "ratio=0.1",
                  "comm=allgather", "memory=residual"], marks=pytest.mark.slow),
])
def test_resume_mid_round_is_exact_and_the_replicas_are_diagnosed(tmp_path, mode):
    """2 epochs == 1 epoch + resume, the checkpoint inside a round (8 % 3 steps into it)."""
    setup = [*COMMON, "engine.np=2", *mode]
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, "max_steps=8", name="half")
    resumed, proc = train(tmp_path, *setup, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    for key in ("model", "optimizer", "per_rank"):
        _assert_equal(a[key], b[key], key)
    s = results(full)["summary"]
    assert s["final_replica_distance"] > 0 and s["final_loss_averaged"] > 0
    assert "replica/distance" in results(full)["curve"][-1]


UNUSED = "would not be used; drop compressor= (or use sync=step)"


@pytest.mark.parametrize("overrides, message", [
    (["sync=sparta", "sync.p=0"], "sync.p=0 must be a number in (0, 1] (the fraction of parameter entries "
                                  "averaged each step); pass sync.p=0.005 (ExoGym's)"),
    (["sync=sparta", "sync.p=1.5"], "sync.p=1.5 must be a number in (0, 1] (the fraction of parameter "
                                    "entries averaged each step); pass sync.p=0.005 (ExoGym's)"),
    (["sync=noloco", "sync.group_size=1"], "sync.group_size=1 must be an integer >= 2 (workers averaging "
                                           "together each round); pass sync.group_size=2 (pairs, NoLoCo's)"),
    (["sync=noloco", "compressor=qsgd"],
     f"sync=noloco synchronizes by itself, so compressor=qsgd {UNUSED}"),
    (["sync=sparta", "compressor=topk"],
     f"sync=sparta synchronizes by itself, so compressor=topk {UNUSED}"),
    (["sync=sparta_diloco", "sync.inner_steps=0"], "sync.inner_steps=0 must be an integer >= 1 (steps per "
                                                   "round)"),
])
def test_settings_that_do_not_fit_are_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, *overrides]))
    assert str(e.value) == message


@pytest.mark.filterwarnings("ignore:engine.np=")
def test_groups_that_do_not_fit_the_workers_are_refused_in_the_parent(monkeypatch):
    monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, "sync=noloco", "engine=torch", "engine.np=3"]))
    assert str(e.value) == ("sync.group_size=2 does not divide engine.np=3 (every worker in one group each "
                            "round); pass engine.np=4 or a sync.group_size that divides it")
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, "sync=noloco", "engine=horovod", "engine.np=4"]))
    assert "set HOROVOD_DYNAMIC_PROCESS_SETS=1 in the environment or use engine=torch" in str(e.value)
    # one pair of every worker: the global allreduce, nothing to set
    config.check(config.compose([*COMMON, "sync=noloco", "engine=horovod", "engine.np=2"]))


def test_diagnostics_measure_the_spread_and_restore_the_local_parameters():
    def body(engine):
        model = _model()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * engine.rank)  # rank 1 = rank 0 + 0.1 everywhere
        before = [p.detach().clone() for p in model.parameters()]
        seen = []

        def evaluate():
            seen.append([p.detach().clone() for p in model.parameters()])
            return {"eval/loss": float(sum(p.sum() for p in model.parameters()))}

        out = diagnose(model, engine, evaluate)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
        return out, before, seen[0]

    (out0, b0, avg0), (out1, b1, avg1) = ThreadWorld(2).run(body)
    mean = [(x + y) / 2 for x, y in zip(b0, b1, strict=True)]
    for got, want in zip(avg0, mean, strict=True):
        torch.testing.assert_close(got, want)
    norm = torch.cat([m.reshape(-1) for m in mean]).norm()
    spread = torch.cat([(x - m).reshape(-1) for x, m in zip(b0, mean, strict=True)]).norm()
    assert out0["replica/distance"] == pytest.approx(float(spread / norm), rel=1e-5)
    assert out0 == out1
    assert out0["eval/loss_averaged"] == pytest.approx(float(sum(m.sum() for m in mean)), rel=1e-5)


def test_only_modes_whose_replicas_differ_are_diagnosed():
    diverge = {name: registry.component_class("sync", name).sync_traits.replicas_diverge
               for name in registry.options("sync")}
    assert diverge["diloco"] and diverge["noloco"] and diverge["sparta"] and diverge["sparta_diloco"]
    assert not diverge["step"] and not diverge["ddp"] and not diverge["demo"]
