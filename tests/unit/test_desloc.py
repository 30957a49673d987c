"""sync=desloc: DES-LOC's update against a plain-torch re-implementation of the paper's Algorithm 1
(Local Adam, each of parameters, first and second moment averaged on its own period), bytes booked
only where it talks, exact resume mid-period (in process and through the real launcher), and its
refusals. Ranks are threads of this process (tests/threaded_engine.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from compbench.catalog import registry
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from tests.helpers import TINY, sync_step, train
from tests.integration.test_resume import _assert_equal
from tests.threaded_engine import ThreadWorld
from tests.unit.test_diloco import _batch, _model

KX, KU, KV, STEPS, WORLD = 2, 3, 6, 7, 2
ADAM = {"name": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "weight_decay": 0.05}


def _reference() -> tuple[list[list[torch.Tensor]], list[list[dict]]]:
    """Algorithm 1 in plain torch: every worker's AdamW on its own batches; after step s (s steps
    taken) the moments are replaced by their mean if s % K_u (K_v) == 0, the parameters if s % K_x == 0."""
    workers = [_model() for _ in range(WORLD)]
    opts = [torch.optim.AdamW(w.parameters(), lr=0.01, betas=(0.9, 0.999), weight_decay=0.05)
            for w in workers]
    for step in range(STEPS):
        for rank, (w, opt) in enumerate(zip(workers, opts, strict=True)):
            x, y = _batch(rank, step)
            opt.zero_grad()
            F.cross_entropy(w(x), y).backward()
            opt.step()
        taken = step + 1
        with torch.no_grad():
            for key, period in (("exp_avg", KU), ("exp_avg_sq", KV)):
                if taken % period == 0:
                    for ps in zip(*(w.parameters() for w in workers), strict=True):
                        mean = sum(o.state[p][key] for o, p in zip(opts, ps, strict=True)) / WORLD
                        for o, p in zip(opts, ps, strict=True):
                            o.state[p][key].copy_(mean)
            if taken % KX == 0:
                for ps in zip(*(w.parameters() for w in workers), strict=True):
                    mean = sum(ps) / WORLD
                    for p in ps:
                        p.copy_(mean)
    params = [[p.detach().clone() for p in w.parameters()] for w in workers]
    states = [[copy.deepcopy(o.state[p]) for p in w.parameters()] for w, o in zip(workers, opts, strict=True)]
    return params, states


def _nodes(compressor: str = "none", comm: str = "allreduce", memory: str = "none", **extra: object) -> dict:
    parts = (("compressor", compressor), ("memory", memory), ("comm", comm), ("scheduler", "layerwise"))
    nodes = {g: dict(registry.option_config(g, name)) for g, name in parts}
    nodes["compressor"].update(extra)
    nodes["sync"] = {**registry.option_config("sync", "desloc"), "param_period": KX,
                     "first_moment_period": KU, "second_moment_period": KV}
    return nodes


def _steps(engine, sync, model, opt, stats, start: int, stop: int) -> list[int]:
    sent = []
    for step in range(start, stop):
        stats.reset()
        x, y = _batch(engine.rank, step)
        sync_step(sync, opt, step, model, x, y)
        sent.append(stats.bytes_sent)
        assert stats.bytes_dense == 4 * sum(p.numel() for p in model.parameters())
    return sent


def _run(engine, nodes: dict | None = None, stop: int = STEPS):
    stats = StepStats()
    sync = build_synchronizer(nodes or _nodes(), engine, stats)
    model = sync.setup(_model())
    opt = sync.make_optimizer(model, dict(ADAM))
    sent = _steps(engine, sync, model, opt, stats, 0, stop)
    return sync, model, opt, stats, sent


def test_periods_match_the_reference_and_book_bytes_only_when_they_talk():
    want_params, want_states = _reference()
    numel = sum(p.numel() for p in want_params[0])
    results = ThreadWorld(WORLD).run(lambda e: _run(e)[1:])
    for rank, (model, opt, _, sent) in enumerate(results):
        for p, want, state in zip(model.parameters(), want_params[rank], want_states[rank], strict=True):
            torch.testing.assert_close(p.detach(), want, rtol=1e-6, atol=1e-7)
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(opt.state[p][key], state[key], rtol=1e-6, atol=1e-9)
        talks = [sum((s + 1) % k == 0 for k in (KX, KU, KV)) for s in range(STEPS)]
        assert sent == [4 * numel * t for t in talks]  # fp32 allreduce of what is due, nothing else
    # After step 7 (7 % 2, 7 % 3, 7 % 6 != 0) nothing was averaged since step 6: the ranks differ.
    (m0, o0, *_), (m1, o1, *_) = results
    for p0, p1 in zip(m0.parameters(), m1.parameters(), strict=True):
        assert not torch.equal(p0, p1)
        assert not torch.equal(o0.state[p0]["exp_avg"], o1.state[p1]["exp_avg"])


def test_resume_mid_period_is_exact_with_a_compressor_and_error_feedback():
    """7 steps == 4 steps, state_dict, a fresh synchronizer loads it, 3 more steps: bit for bit, with
    the parameters' deltas top-k compressed into an error-feedback memory (the moments stay dense)."""
    nodes = _nodes("topk", "allgather", "residual", ratio=0.3)

    def body(engine):
        _, model, opt, _, _ = _run(engine, nodes)
        full = (model, opt)
        sync, model, opt, stats, _ = _run(engine, nodes, stop=4)
        saved = copy.deepcopy(sync.state_dict())
        assert saved["memory"]["residuals"]  # the error accumulator is in the state
        stats = StepStats()
        fresh = build_synchronizer(nodes, engine, stats)
        model2 = fresh.setup(_model())
        opt2 = fresh.make_optimizer(model2, dict(ADAM))
        fresh.load_state_dict(saved)
        _steps(engine, fresh, model2, opt2, stats, 4, STEPS)
        return full, (model2, opt2), fresh.summary()

    for (model, opt), (model2, opt2), summary in ThreadWorld(WORLD).run(body):
        assert summary["param_syncs"] == STEPS // KX and summary["steps"] == STEPS
        _assert_equal([p.detach() for p in model.parameters()], [p.detach() for p in model2.parameters()],
                      "params")
        _assert_equal(opt.state_dict(), opt2.state_dict(), "optimizer")


def test_exchange_plan_is_every_shortest_period():
    def body(engine):
        return _run(engine, stop=0)[0].exchange_plan()

    assert {p.every for p in ThreadWorld(WORLD).run(body)} == {KX}


COMMON = [*TINY, "batch_size=16", "epochs=2", "eval=false", "sync=desloc", "sync.param_period=3",
          "sync.first_moment_period=5", "sync.second_moment_period=6"]  # 8 steps per epoch: mid-period


@pytest.mark.slow  # a real 2-rank job (~15 s); the fast tier checks an exact resume in process
@pytest.mark.dist
def test_resume_mid_period_is_exact_through_the_launcher(tmp_path):
    """2 epochs == 1 epoch + resume, saved 8 steps in (mid-period for all three): the real launcher."""
    setup = [*COMMON, "engine.np=2", "compressor=qsgd", "compressor.levels=1", "comm=allgather",
             "memory=residual"]
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, "max_steps=8", name="half")
    resumed, proc = train(tmp_path, *setup, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout and "optim=adamw" in proc.stdout  # the mode's recipe, announced
    h = torch.load(half / "checkpoint.pt", weights_only=True)
    assert [r["taken"] for r in h["per_rank"]] == [8] * WORLD
    assert not torch.equal(*(r["local_params"][0] for r in h["per_rank"]))  # ranks diverged
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    for key in ("model", "optimizer", "per_rank"):
        _assert_equal(a[key], b[key], key)


@pytest.mark.parametrize("overrides, message", [
    (["sync.param_period=0"], "sync.param_period=0 must be an integer >= 1 (steps between two averages); "
                              "pass e.g. sync.param_period=32"),
    (["sync.second_moment_period=1.5"], "sync.second_moment_period=1.5 must be an integer"),
    (["sync.second_moment_period=40", "max_steps=20"],
     "sync.second_moment_period=40 is more than max_steps=20: the run would end before its first round "
     "does; pass sync.second_moment_period=20 or max_steps=40"),
    (["optim=sgd"], "sync=desloc builds its own optimizer from optim=adamw or optim=adam's settings, not "
                    "optim=sgd's; add optim=adamw"),
    (["optim=muon"], "sync=desloc builds its own optimizer from optim=adamw or optim=adam's settings, not "
                     "optim=muon's; add optim=adamw"),
    (["scheduler=mergecomp"], "sync=desloc sends the outer gradient once per round, tensor by tensor, so "
                              "scheduler=mergecomp would not be used; drop scheduler="),
])
def test_settings_that_do_not_fit_are_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, *overrides]))
    assert str(e.value) == message


def test_adamw_is_the_recipe():
    cfg = config.check(config.compose(COMMON))
    assert cfg.choices["optim"] == "adamw" and cfg.optim.clip_grad_norm == 1.0
