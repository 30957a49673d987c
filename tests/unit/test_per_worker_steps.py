"""sync=diloco's per-worker sync intervals (`sync.inner_steps_per_worker`, compbench.sync.per_worker_steps):
the token-weighted outer average against a hand-computed reference (two thread ranks), the adaptive
rule, who trains which step, and the refusals at compose time."""

from __future__ import annotations

import copy
from typing import cast

import pytest
import torch
import torch.nn.functional as F

from compbench.catalog import registry
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.sync import PerWorkerSteps, StepShare
from compbench.sync.build import build_synchronizer
from compbench.sync.per_worker_steps import next_steps, weights
from tests.threaded_engine import ThreadWorld
from tests.unit.test_diloco import COMMON, _batch, _model
from tests.unit.test_registry_contract import protocol_gaps

H, STEPS, WORLD, LR = 4, [4, 1], 2, 0.5
INNER = {"name": "sgd", "lr": 0.1}


def _nodes(**sync: object) -> dict:
    parts = (("compressor", "none"), ("memory", "none"), ("comm", "allreduce"), ("scheduler", "layerwise"))
    return {g: registry.option_config(g, name) for g, name in parts} | {
        "sync": {**registry.option_config("sync", "diloco"), "inner_steps": H, "outer_lr": LR,
                 "outer_momentum": 0.0, "nesterov": False, **sync}}


def _reference() -> list[torch.Tensor]:
    """One round by hand: worker r takes SGD steps on its first STEPS[r] batches from θ, then
    θ ← θ − lr · Σ_r (H_r / Σ H) (θ − θ_r)."""
    theta = _model()
    deltas = []
    for rank, h in enumerate(STEPS):
        worker = copy.deepcopy(theta)
        opt = torch.optim.SGD(worker.parameters(), lr=0.1)
        for step in range(h):
            x, y = _batch(rank, step)
            opt.zero_grad()
            F.cross_entropy(worker(x), y).backward()
            opt.step()
        deltas.append([t.detach() - w.detach() for t, w in zip(theta.parameters(), worker.parameters(),
                                                                strict=True)])
    w = [h / sum(STEPS) for h in STEPS]
    return [t.detach() - LR * (w[0] * d0 + w[1] * d1)
            for t, d0, d1 in zip(theta.parameters(), *deltas, strict=True)]


def _run(engine, setting: object) -> tuple[list[torch.Tensor], list[StepShare]]:
    """One round through the synchronizer, in the trainer's order, idling where it says so."""
    stats = StepStats()
    sync = build_synchronizer(_nodes(inner_steps_per_worker=setting), engine, stats)
    model = sync.setup(_model())
    opt = sync.make_optimizer(model, dict(INNER))
    shares = []
    for step in range(H):
        stats.reset()
        sync.begin_step(step, 0.0)
        share = cast(PerWorkerSteps, sync).step_share()  # as the trainer asks (sync_traits.per_worker_key)
        shares.append(share)
        if share.mine:
            x, y = _batch(engine.rank, step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        sync.after_step()
    return [p.detach().clone() for p in model.parameters()], shares


def test_the_outer_average_is_weighted_by_the_tokens_each_worker_trained():
    expected = _reference()
    out = ThreadWorld(WORLD).run(lambda engine: _run(engine, STEPS))
    for params, shares in out:
        for got, want in zip(params, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert [s.workers for s in shares] == [2, 1, 1, 1]
    assert [s.mine for s in out[0][1]] == [True] * H
    assert [s.mine for s in out[1][1]] == [True, False, False, False]


def test_equal_steps_are_diloco_bit_for_bit():
    plain = ThreadWorld(WORLD).run(lambda engine: _run(engine, None))
    equal = ThreadWorld(WORLD).run(lambda engine: _run(engine, [H, H]))
    for (a, _), (b, _) in zip(plain, equal, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_weights_and_the_adaptive_rule():
    assert weights([30, 10]) == [0.75, 0.25]
    assert next_steps(30, [10.0, 30.0]) == [30, 10]  # a worker 3x slower trains a third
    assert next_steps(30, [10.0, 400.0]) == [30, 1]  # never below one step
    assert next_steps(30, [10.0, 0.0]) == [30, 30]  # a worker that measured nothing counts as fastest
    assert next_steps(4, [2.0, 2.0]) == [4, 4]


def test_diloco_declares_and_answers_the_per_worker_protocol():
    cls = registry.component_class("sync", "diloco")
    assert cls.sync_traits.per_worker_key == "inner_steps_per_worker"
    assert "inner_steps_per_worker" in registry.option_config("sync", "diloco")
    assert protocol_gaps(cls, PerWorkerSteps) == []


SETTING = "sync.inner_steps_per_worker"


@pytest.mark.parametrize("overrides, message", [
    ([f"{SETTING}=[3,1,1]"], f"{SETTING}=[3, 1, 1] has 3 entries and engine.np=2; give one number of steps "
                             f"per worker (2 entries), or {SETTING}=adaptive"),
    ([f"{SETTING}=[2,1]"], f"{SETTING}=[2, 1] has no entry equal to sync.inner_steps=3 (the round's length "
                           "is its fastest worker's); make the fastest worker's 3, or pass "
                           "sync.inner_steps=2"),
    ([f"{SETTING}=[3,0]"], f"{SETTING}=[3, 0]: 0 is not a number of steps from 1 to sync.inner_steps=3; pass "
                           "entries from 1 to 3"),
    ([f"{SETTING}=fast"], f"{SETTING}=fast is unknown; pass a list of steps per worker (e.g. "
                          f"{SETTING}=[3,1]), {SETTING}=adaptive or null"),
    ([f"{SETTING}=adaptive", "on_nonfinite=skip"],
     f"{SETTING} with on_nonfinite=skip: its check is a collective every step, and an idle worker has no "
     "gradients; pass on_nonfinite=raise or on_nonfinite=ignore"),
    ([f"{SETTING}=adaptive", "compressor=signum", "comm=allgather"],
     f"{SETTING} weights each worker's outer gradient by its tokens, and compressor=signum combines the "
     "workers' by vote, which does not keep the weights; use a compressor that averages (e.g. "
     "compressor=none, fp16 or qsgd)"),
    ([f"{SETTING}=adaptive", "engine=torch", "engine.elastic=true"],
     f"{SETTING} with engine.elastic=true: its steps are the workers' as they started; drop engine.elastic "
     "(or the setting)"),
    ([f"{SETTING}=[3,1]", "sync.fragments=3"],
     f"{SETTING} weights a whole round's outer gradients, and a fragment exchanged mid-round would hold "
     "fewer of a slow worker's steps; pass sync.fragments=1 and sync.overlap=0"),
])
def test_settings_that_cannot_work_are_refused_at_compose_time(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, "engine.np=2", *overrides]))
    assert str(e.value) == message


def test_adaptive_composes_with_the_eager_update():
    config.check(config.compose([*COMMON, "engine.np=2", f"{SETTING}=adaptive", "sync.eager=true"]))
