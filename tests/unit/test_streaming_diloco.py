"""sync=diloco's Streaming DiLoCo options (fragments, overlap, mix, timing) and eager updates:
rounds against a small re-implementation (one outer SGD per fragment, the merge θ_local ←
α·θ_local + (1−α)·θ_new of torchft's `_merge_parameters`; the eager outer gradient of Kale et al.
2025), exact bytes per step, exact resume from a checkpoint taken while an exchange is in flight,
and the build-time refusal. Ranks are threads of this process (tests/threaded_engine.py); the
config-time refusals are in test_diloco.py."""

from __future__ import annotations

import copy

import pytest
import torch

from compbench.catalog import registry
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from tests.helpers import sync_step
from tests.threaded_engine import ThreadWorld
from tests.unit.test_diloco import INNER, WORLD, _batch, _inner_step, _model
from tests.unit.test_sync_combinations import _sweep

H, STEPS = 6, 18  # three rounds


def _reference(fragments: int, overlap: int, mix: float, steps: int = STEPS,
               before: bool = False) -> list[torch.Tensor]:
    """Streaming DiLoCo as the paper and torchft describe it: tensor i in fragment i % P; fragment p
    averages its Δ = θ − θ_local after steps (p+1)·H/P + k·H, applies it `overlap` steps later with
    its own Nesterov SGD, and every worker merges its fragment with the new θ. `before`: torchft's
    timing, Δ taken `overlap` steps before those steps and applied at them."""
    global_model = _model()
    theta = list(global_model.parameters())
    members = [[i for i in range(len(theta)) if i % fragments == p] for p in range(fragments)]
    outer = [torch.optim.SGD([theta[i] for i in m], lr=0.7, momentum=0.9, nesterov=True) for m in members]
    workers = [copy.deepcopy(global_model) for _ in range(WORLD)]
    inner = [torch.optim.AdamW(w.parameters(), lr=0.01, betas=(0.9, 0.999), weight_decay=0.05)
             for w in workers]
    every = H // fragments
    pending: tuple[int, int, list[torch.Tensor]] | None = None
    for step in range(steps):
        _inner_step(workers, inner, step)
        taken = step + 1
        with torch.no_grad():
            ahead = taken + (overlap if before else 0)
            if ahead % every == 0:
                p = (ahead // every - 1) % fragments
                pending = (p, taken, [sum(theta[i] - list(w.parameters())[i] for w in workers) / WORLD
                                      for i in members[p]])
            if pending is not None and taken == pending[1] + overlap:
                p, _, deltas = pending
                for i, delta in zip(members[p], deltas, strict=True):
                    theta[i].grad = delta
                outer[p].step()
                outer[p].zero_grad()
                for w in workers:
                    for i in members[p]:
                        local = list(w.parameters())[i]
                        local.copy_(mix * local + (1 - mix) * theta[i])
                pending = None
    return [p.detach().clone() for p in workers[0].parameters()]  # worker 0's local parameters


def _eager_reference(fragments: int, mix: float, steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Eager updates (Kale et al. 2025) as the paper describes them: at its step a fragment's Δ_m of
    every worker m goes out, and worker m steps its own θ at once with Δ_m/N + (Δ̄' − Δ'_m/N), the
    others' part of the fragment's previous average (nothing the first time); every worker's θ and
    outer momentum are its own. Returns every worker's local parameters."""
    start = _model()
    thetas = [list(copy.deepcopy(start).parameters()) for _ in range(WORLD)]
    members = [[i for i in range(len(thetas[0])) if i % fragments == p] for p in range(fragments)]
    outers = [[torch.optim.SGD([th[i] for i in m], lr=0.7, momentum=0.9, nesterov=True) for m in members]
              for th in thetas]
    workers = [copy.deepcopy(start) for _ in range(WORLD)]
    inner = [torch.optim.AdamW(w.parameters(), lr=0.01, betas=(0.9, 0.999), weight_decay=0.05)
             for w in workers]
    every = H // fragments
    mine = [[torch.zeros_like(t) for t in thetas[0]] for _ in range(WORLD)]
    others = [[torch.zeros_like(t) for t in thetas[0]] for _ in range(WORLD)]
    last_average: dict[int, torch.Tensor] = {}
    for step in range(steps):
        _inner_step(workers, inner, step)
        taken = step + 1
        if taken % every:
            continue
        p = (taken // every - 1) % fragments
        with torch.no_grad():
            for i in members[p]:
                if i in last_average:  # the previous exchange of this fragment has arrived
                    for m in range(WORLD):
                        others[m][i] = last_average[i] - mine[m][i]
                deltas = [thetas[m][i] - list(workers[m].parameters())[i] for m in range(WORLD)]
                last_average[i] = sum(deltas) / WORLD
                for m in range(WORLD):
                    mine[m][i] = deltas[m] / WORLD
                    thetas[m][i].grad = mine[m][i] + others[m][i]
            for m in range(WORLD):
                outers[m][p].step()
                outers[m][p].zero_grad()
                for i in members[p]:
                    local = list(workers[m].parameters())[i]
                    local.copy_(mix * local + (1 - mix) * thetas[m][i])
    return [[p.detach().clone() for p in w.parameters()] for w in workers]


def _nodes(**sync: object) -> dict:
    parts = (("compressor", "none"), ("memory", "none"), ("comm", "allreduce"), ("scheduler", "layerwise"))
    return {g: registry.option_config(g, name) for g, name in parts} | {
        "sync": {**registry.option_config("sync", "diloco"), "inner_steps": H, **sync}}


class _Run:
    """One rank's synchronizer, model and inner optimizer, stepped like the trainer's loop."""

    def __init__(self, engine, **sync: object) -> None:
        self.engine, self.stats = engine, StepStats()
        self.sync = build_synchronizer(_nodes(**sync), engine, self.stats)
        self.model = self.sync.setup(_model())
        self.opt = self.sync.make_optimizer(self.model, dict(INNER))
        self.sent: list[int] = []
        self.dense: list[int] = []

    def steps(self, first: int, last: int) -> None:
        for step in range(first, last):
            self.stats.reset()
            x, y = _batch(self.engine.rank, step)
            sync_step(self.sync, self.opt, step, self.model, x, y)
            self.sent.append(self.stats.bytes_sent)
            self.dense.append(self.stats.bytes_dense)

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


@pytest.mark.parametrize("fragments, overlap, mix", [(2, 1, 0.5), (3, 1, 0.5), (2, 0, 0.0), (1, 2, 0.25)])
def test_fragments_match_the_reference_and_book_each_fragment_at_its_start(fragments, overlap, mix):
    expected = _reference(fragments, overlap, mix)

    def rank(engine):
        run = _Run(engine, fragments=fragments, overlap=overlap, mix=mix)
        run.steps(0, STEPS)
        return run.params(), run.sent, run.dense

    results = ThreadWorld(WORLD).run(rank)
    shapes = [p.shape for p in expected]
    numel = sum(s.numel() for s in shapes)
    every = H // fragments
    want_sent = [4 * sum(shapes[i].numel() for i in range(len(shapes)) if i % fragments == (s // every - 1)
                         % fragments) if s % every == 0 else 0 for s in range(1, STEPS + 1)]
    assert sum(want_sent) == 4 * numel * STEPS // H  # every tensor once per round
    got, sent, dense = results[0]
    for g, w in zip(got, expected, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    for _, rank_sent, rank_dense in results:
        assert rank_sent == want_sent  # fp32 of the fragment's tensors at its start, 0 otherwise
        assert rank_dense == [4 * numel] * STEPS


@pytest.mark.parametrize("fragments, overlap", [(2, 1), (1, 2)])
def test_torchft_timing_matches_the_reference(fragments, overlap):
    """timing=before: Δ taken `overlap` steps ahead of the fragment's step, applied at it."""
    expected = _reference(fragments, overlap, 0.5, before=True)

    def rank(engine):
        run = _Run(engine, fragments=fragments, overlap=overlap, mix=0.5, timing="before")
        run.steps(0, STEPS)
        return run.params(), run.sent

    got, sent = ThreadWorld(WORLD).run(rank)[0]
    for g, w in zip(got, expected, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    every = H // fragments
    assert [s for s, b in enumerate(sent, start=1) if b] == list(range(every - overlap, STEPS, every))


@pytest.mark.parametrize("fragments, mix", [(1, 0.0), (2, 0.5)])
def test_eager_updates_match_the_reference(fragments, mix):
    expected = _eager_reference(fragments, mix)

    def rank(engine):
        run = _Run(engine, fragments=fragments, mix=mix, eager=True)
        run.steps(0, STEPS)
        return run.params(), run.sent

    results = ThreadWorld(WORLD).run(rank)
    for r, (got, sent) in enumerate(results):
        for g, w in zip(got, expected[r], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        assert sent == results[0][1]
    assert not torch.equal(results[0][0][0], results[1][0][0])  # each worker's θ is its own


def test_eager_resume_is_exact():
    """A checkpoint between two rounds (the last exchange in flight): resumed, the same parameters."""
    sync = {"fragments": 2, "eager": True, "mix": 0.5}

    def rank(engine):
        full = _Run(engine, **sync)
        full.steps(0, STEPS)
        saved = _Run(engine, **sync)
        saved.steps(0, 7)
        assert saved.sync.eager_pending  # an exchange in flight
        state = copy.deepcopy(saved.sync.state_dict())
        resumed = _Run(engine, **sync)
        resumed.sync.load_state_dict(state)
        resumed.steps(7, STEPS)
        return full.params(), resumed.params()

    for full, resumed in ThreadWorld(WORLD).run(rank):
        assert all(torch.equal(a, b) for a, b in zip(full, resumed, strict=True))


def test_defaults_are_diloco_bit_for_bit():
    def rank(engine):
        runs = [_Run(engine), _Run(engine, fragments=1, overlap=0, mix=0.0)]
        for run in runs:
            run.steps(0, STEPS)
        return [run.params() for run in runs]

    for plain, explicit in ThreadWorld(WORLD).run(rank):
        assert all(torch.equal(a, b) for a, b in zip(plain, explicit, strict=True))


@pytest.mark.parametrize("fragments, overlap, at", [(2, 2, 4), (3, 1, 4), (2, 2, 3)])
def test_resume_while_an_exchange_is_in_flight_is_exact(fragments, overlap, at):
    """A checkpoint taken `at` steps in (a fragment started at step at - 1 or at, still in flight):
    the run that took it and a fresh run resumed from it both equal an uninterrupted run."""
    sync = {"fragments": fragments, "overlap": overlap, "mix": 0.5}

    def rank(engine):
        full = _Run(engine, **sync)
        full.steps(0, STEPS)
        saved = _Run(engine, **sync)
        saved.steps(0, at)
        assert saved.sync.inflight is not None  # the checkpoint falls inside an overlap
        state = copy.deepcopy(saved.sync.state_dict())
        assert state["averaged"]
        saved.steps(at, STEPS)
        resumed = _Run(engine, **sync)
        resumed.sync.load_state_dict(state)
        resumed.steps(at, STEPS)
        assert saved.sent[at:] == resumed.sent == full.sent[at:]
        return full.params(), saved.params(), resumed.params()

    for full, saved, resumed in ThreadWorld(WORLD).run(rank):
        for a, b, c in zip(full, saved, resumed, strict=True):
            assert torch.equal(a, b) and torch.equal(a, c)


def test_more_fragments_than_tensors_is_refused_at_build_time():
    def rank(engine):
        with pytest.raises(ValueError) as e:
            _Run(engine, inner_steps=10, fragments=5)
        return str(e.value)

    assert ThreadWorld(1).run(rank) == ["sync.fragments=5 is more than the model's 4 trainable tensors (a "
                                        "fragment is whole tensors); pass sync.fragments=4 or less"]


def test_every_compressor_and_comm_is_refused_or_trains_with_fragments(tmp_path):
    """test_sync_combinations' sweep with two fragments, one overlapping step and mixing, over 4 steps:
    the first fragment starts at step 2 and is applied at step 3, the second starts at step 4, the
    last, and is applied when the trainer drains the exchange in flight."""
    _sweep(tmp_path, "diloco", registry.options("compressor"), max_steps=4, inner_steps=4, fragments=2,
           overlap=1, mix=0.5)


# slow tier: ~15 s through the launcher; DiLoCo's mid-round resume stays in the default tier (test_diloco)
@pytest.mark.slow
@pytest.mark.dist
def test_resume_with_an_exchange_in_flight_through_the_launcher_is_exact(tmp_path):
    """test_diloco's launcher resume with two fragments and one overlapping step: the checkpoint at
    the end of epoch 1 (step 8) is taken right after a fragment started its exchange."""
    from tests.helpers import train
    from tests.integration.test_resume import _assert_equal
    from tests.unit.test_diloco import COMMON

    setup = [*COMMON, "sync.inner_steps=4", "sync.fragments=2", "sync.overlap=1", "sync.mix=0.5",
             "engine.np=2", "compressor=qsgd", "compressor.levels=7", "comm=allgather"]
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, "max_steps=8", name="half")
    resumed, proc = train(tmp_path, *setup, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    h = torch.load(half / "checkpoint.pt", weights_only=True)
    assert [r["inflight"] for r in h["per_rank"]] == [1] * WORLD  # fragment 1 started at step 8
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    for key in ("model", "optimizer", "per_rank"):
        _assert_equal(a[key], b[key], key)
