"""sync=diloco: its rounds against a small re-implementation of the reference (PrimeIntellect-ai/
diloco_simple `pure_torch_diloco.py`), exact bytes with quiet steps counted, exact resume mid-round,
and its refusals. Ranks are threads of this process (tests/threaded_engine.py)."""

from __future__ import annotations

import copy
import threading

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

H, ROUNDS, WORLD = 3, 3, 2
INNER = {"name": "adamw", "lr": 0.01, "betas": [0.9, 0.999], "weight_decay": 0.05}


_GLOBAL_RNG = threading.Lock()


def _model() -> torch.nn.Module:
    # The ranks are threads: seeding and drawing from torch's global generator must not interleave.
    with _GLOBAL_RNG:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 6, generator=g), torch.randint(3, (4,), generator=g)


def _inner_step(workers: list[torch.nn.Module], inner: list[torch.optim.Optimizer], step: int) -> None:
    """One inner step of every worker on its own batch of `step`."""
    for rank, (w, opt) in enumerate(zip(workers, inner, strict=True)):
        x, y = _batch(rank, step)
        opt.zero_grad()
        F.cross_entropy(w(x), y).backward()
        opt.step()


def _reference() -> list[torch.Tensor]:
    """DiLoCo as the reference: inner AdamW per worker (state kept across rounds), the averaged
    outer gradient θ − θ_local, Nesterov SGD(lr 0.7, momentum 0.9) on θ, workers reset to θ."""
    global_model = _model()
    outer = torch.optim.SGD(global_model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    workers = [copy.deepcopy(global_model) for _ in range(WORLD)]
    inner = [torch.optim.AdamW(w.parameters(), lr=0.01, betas=(0.9, 0.999), weight_decay=0.05)
             for w in workers]
    step = 0
    for _ in range(ROUNDS):
        for _ in range(H):
            _inner_step(workers, inner, step)
            step += 1
        with torch.no_grad():
            for i, p in enumerate(global_model.parameters()):
                p.grad = sum(p - list(w.parameters())[i] for w in workers) / WORLD
            outer.step()
            for w in workers:
                for pw, p in zip(w.parameters(), global_model.parameters(), strict=True):
                    pw.copy_(p)
    return [p.detach().clone() for p in global_model.parameters()]


def _nodes(**sync: object) -> dict:
    parts = (("compressor", "none"), ("memory", "none"), ("comm", "allreduce"), ("scheduler", "layerwise"))
    return {g: registry.option_config(g, name) for g, name in parts} | {
        "sync": {**registry.option_config("sync", "diloco"), "inner_steps": H, **sync}}


def _run_sync(engine) -> tuple[list[torch.Tensor], list[int]]:
    stats = StepStats()
    sync = build_synchronizer(_nodes(), engine, stats)
    model = sync.setup(_model())
    opt = sync.make_optimizer(model, dict(INNER))
    sent = []
    for step in range(H * ROUNDS):
        stats.reset()
        x, y = _batch(engine.rank, step)
        sync_step(sync, opt, step, model, x, y)
        sent.append(stats.bytes_sent)
        assert stats.bytes_dense == 4 * sum(p.numel() for p in model.parameters())
    return [p.detach().clone() for p in model.parameters()], sent


def test_rounds_match_the_reference_and_book_bytes_only_when_they_talk():
    expected = _reference()
    numel = sum(p.numel() for p in expected)
    for params, sent in ThreadWorld(WORLD).run(_run_sync):
        for got, want in zip(params, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert sent == [0, 0, 4 * numel] * ROUNDS  # fp32 of every tensor, once per round


COMMON = [*TINY, "batch_size=16", "epochs=2", "eval=false", "optim=adamw", "optim.lr_schedule=constant",
          "sync=diloco", f"sync.inner_steps={H}"]  # 8 steps per epoch: the epoch ends mid-round


@pytest.mark.dist
def test_resume_mid_round_is_exact(tmp_path):
    """2 epochs == 1 epoch + resume, with the checkpoint inside a round (8 % 3 steps into it): the
    real launcher and engine (thread ranks share torch's global RNG, so runs differ by init)."""
    setup = [*COMMON, "engine.np=2", "compressor=topk", "ratio=0.1", "comm=allgather", "memory=residual"]
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, "max_steps=8", name="half")
    resumed, proc = train(tmp_path, *setup, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    h = torch.load(half / "checkpoint.pt", weights_only=True)
    assert [r["inner"] for r in h["per_rank"]] == [8 % H] * WORLD  # saved inside a round
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    for key in ("model", "optimizer", "per_rank"):
        _assert_equal(a[key], b[key], key)
    assert any(r["memory"]["residuals"] for r in b["per_rank"])  # the error accumulator travelled
    assert not torch.equal(*(r["local_params"][0] for r in h["per_rank"]))  # ranks diverged in the round


@pytest.mark.parametrize("overrides, message", [
    (["comm=ddp", "engine=torch"], "comm=ddp is a synchronization mode now: pass sync=ddp"),
    (["scheduler=mergecomp"], "sync=diloco sends the outer gradient once per round, tensor by tensor, so "
                              "scheduler=mergecomp would not be used; drop scheduler="),
    (["compressor=dgc", "memory=dgc", "comm=allgather"], "memory=dgc applies SGD momentum to each step's "
                                                         "gradient, which sync=diloco does not send; use "
                                                         "memory=residual"),
    (["sync.inner_steps=0"], "sync.inner_steps=0 must be an integer >= 1 (steps per round)"),
    (["sync.eager=true", "sync.overlap=1", "sync.inner_steps=4"],
     "sync.eager=true overlaps each exchange with the whole round; drop sync.overlap and sync.timing"),
    (["sync.timing=late"], "sync.timing=late is unknown; pass sync.timing=after (the exchange starts at "
                           "the fragment's step) or sync.timing=before (it ends there, torchft's)"),
    (["sync.nesterov=true", "sync.outer_momentum=0"], "sync.nesterov=true needs sync.outer_momentum > 0; "
                                                      "pass sync.nesterov=false"),
    (["+sync.outer_lrr=1"], "sync.outer_lrr is not a setting of sync=diloco; its settings are: inner_steps, "
                            "outer_lr, outer_momentum, nesterov, fragments, overlap, mix, timing, eager, "
                            "inner_steps_per_worker"),
    (["sync.fragments=0"], "sync.fragments=0 must be an integer >= 1; pass sync.fragments=1 (the whole "
                           "model at once, DiLoCo) or more"),
    (["sync.overlap=-1"], "sync.overlap=-1 must be an integer >= 0 (inner steps an exchange overlaps); "
                          "pass sync.overlap=0 (none, DiLoCo) or more"),
    (["sync.mix=1.0"], "sync.mix=1.0 must be a number in [0, 1) (the local fragment's weight at the "
                       "merge); pass sync.mix=0 (replace it, DiLoCo) or e.g. sync.mix=0.5"),
    (["sync.fragments=2"], "sync.inner_steps=3 is not a multiple of sync.fragments=2 (one fragment every "
                           "inner_steps/fragments steps); pass sync.inner_steps=4"),
    (["sync.overlap=3"], "sync.overlap=3 must be < sync.inner_steps/sync.fragments=3 (one fragment's "
                         "exchange in flight at a time); pass sync.overlap=2 or less or a larger "
                         "sync.inner_steps"),
    (["sync.fragments=3", "sync.overlap=1"], "sync.overlap=1 must be < sync.inner_steps/sync.fragments=1 "
                                             "(one fragment's exchange in flight at a time); pass "
                                             "sync.overlap=0 or a larger sync.inner_steps"),
])
def test_settings_that_do_not_fit_are_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, *overrides]))
    assert str(e.value) == message


def test_every_sync_option_is_a_synchronizer():
    """The registry's sync options declare their traits and config-time check, as compat reads them."""
    from compbench.sync import SyncTraits

    for name in registry.options("sync"):
        cls = registry.component_class("sync", name)
        assert isinstance(cls.sync_traits, SyncTraits), name
        settings = registry.option_config("sync", name)
        cls.check_options(**{k: v for k, v in settings.items() if k != "_target_"})


@pytest.mark.parametrize("overrides, message", [
    (["sync.nesterov=no"], "sync.nesterov=no must be true or false"),
    (["sync.inner_steps=50", "max_steps=30"],
     "sync.inner_steps=50 is more than max_steps=30: the run would end before its first round does; pass "
     "sync.inner_steps=30 or max_steps=50"),
    (["sync.inner_steps=10", "sync.fragments=5"],
     "sync.fragments=5 is more than the model's 4 trainable tensors (a fragment is whole tensors); pass "
     "sync.fragments=4 or less"),
])
def test_settings_that_would_do_nothing_are_refused_in_the_parent(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*COMMON, *overrides]))
    assert str(e.value) == message
