"""sync=delayed_diloco: its rounds bit for bit against a hand-written reference of PCCL's asynchronous
DiLoCo update generalized to k rounds, staleness 0 bit for bit against sync=diloco, k exchanges kept in
flight (not waited for) between rounds, an exact resume with exchanges in flight (threaded ranks, and
the real launcher over gloo), and the compose-time refusals. Ranks are threads of this process
(tests/threaded_engine.py) unless said otherwise."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
import torch

from compbench.catalog import registry
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from compbench.sync.delayed_diloco import DelayedDiLoCo
from compbench.sync.diloco import DiLoCo
from tests.helpers import TINY, compbench, sync_step, train
from tests.threaded_engine import ThreadWorld
from tests.unit.test_diloco import INNER, WORLD, _batch, _inner_step, _model

H, ROUNDS = 3, 6
DENSE = (("compressor", "none"), ("memory", "none"), ("comm", "allreduce"), ("scheduler", "layerwise"))
# Error feedback on a sparsified outer gradient: the memory must see the rounds in their order.
TOPK = (("compressor", "topk"), ("memory", "residual"), ("comm", "allgather"), ("scheduler", "layerwise"))


def _reference(staleness: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """PCCL's async DiLoCo (python/examples/nanogpt_diloco/async_diloco.py) with the outer step k
    rounds late, in plain torch: at the end of round r every worker's Δ = θ − θ_local is averaged
    (computed against the θ the round started from), the average of round r − k (from round k on)
    steps θ by Nesterov SGD, and every worker restarts from θ. The inner optimizer is the one the
    mode builds (compbench's AdamW): what is checked is the outer rule. Returns θ and every
    worker's local parameters."""
    from compbench.optim.optimizers import build_optimizer

    start = _model()
    theta = [p.detach().clone() for p in start.parameters()]
    outer = torch.optim.SGD(theta, lr=0.7, momentum=0.9, nesterov=True)
    workers = [copy.deepcopy(start) for _ in range(WORLD)]
    settings = cast(dict[str, Any], INNER)
    inner = [build_optimizer([{"params": list(w.parameters())}], **settings) for w in workers]
    waiting: list[list[torch.Tensor]] = []  # the rounds' averages not applied yet, oldest first
    for r in range(ROUNDS):
        for s in range(H):
            _inner_step(workers, inner, r * H + s)
        with torch.no_grad():
            deltas = [[t - p for t, p in zip(theta, w.parameters(), strict=True)] for w in workers]
            waiting.append([sum(each[1:], each[0]) / WORLD for each in zip(*deltas, strict=True)])
            if len(waiting) > staleness:
                for t, average in zip(theta, waiting.pop(0), strict=True):
                    t.grad = average
                outer.step()
            for w in workers:
                for p, t in zip(w.parameters(), theta, strict=True):
                    p.copy_(t)
    return theta, [[p.detach().clone() for p in w.parameters()] for w in workers]


def _nodes(sync: str, parts=DENSE, **settings: object) -> dict:
    nodes = {g: registry.option_config(g, name) for g, name in parts} | {
        "sync": {**registry.option_config("sync", sync), "inner_steps": H, **settings}}
    if parts == TOPK:  # 30% of each tiny tensor: the memory keeps most of every round
        nodes["compressor"] = {**nodes["compressor"], "ratio": 0.3}
    return nodes


class _Run:
    """One rank's synchronizer, model and inner optimizer, stepped like the trainer's loop."""

    def __init__(self, engine, sync: str = "delayed_diloco", parts=DENSE, **settings: object) -> None:
        self.engine, self.stats = engine, StepStats()
        nodes = _nodes(sync, parts, **settings)
        self.sync = cast(DiLoCo, build_synchronizer(nodes, engine, self.stats))
        self.pipeline = self.sync.pipeline
        self.model = self.sync.setup(_model())
        self.opt = self.sync.make_optimizer(self.model, dict(INNER))
        self.sent: list[int] = []
        self.in_flight: list[int] = []  # the pipeline's groups not waited for, after each step

    def steps(self, first: int, last: int) -> None:
        for step in range(first, last):
            self.stats.reset()
            x, y = _batch(self.engine.rank, step)
            sync_step(self.sync, self.opt, step, self.model, x, y)
            self.sent.append(self.stats.bytes_sent)
            self.in_flight.append(self.pipeline.in_flight)

    def params(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


@pytest.mark.parametrize("staleness", [1, 2])
def test_rounds_equal_the_reference_bit_for_bit_with_k_exchanges_in_flight(staleness):
    theta, expected = _reference(staleness)

    def rank(engine):
        run = _Run(engine, staleness=staleness)
        run.steps(0, H * ROUNDS)
        return run.params(), list(run.sync.outer_params), run.sent, run.in_flight

    numel = sum(t.numel() for t in theta)
    for r, (params, outer, sent, in_flight) in enumerate(ThreadWorld(WORLD).run(rank)):
        assert all(torch.equal(a, b) for a, b in zip(params, expected[r], strict=True))
        assert all(torch.equal(a, b) for a, b in zip(outer, theta, strict=True))
        assert sent == [0, 0, 4 * numel] * ROUNDS  # one exchange per round, booked at its end
        # one group per exchange (the dense tensors' flat allreduce): after round r, min(r + 1, k) of
        # them are still in flight, none waited for before its round comes
        assert in_flight == [min(s // H, staleness) for s in range(1, H * ROUNDS + 1)]


@pytest.mark.parametrize("parts", [DENSE, TOPK], ids=["dense", "topk-residual"])
def test_staleness_0_is_diloco_bit_for_bit(parts):
    def rank(engine):
        runs = [_Run(engine, "diloco", parts), _Run(engine, "delayed_diloco", parts, staleness=0)]
        for run in runs:
            run.steps(0, H * ROUNDS)
        return [(run.params(), list(run.sync.outer_params), run.sent) for run in runs]

    for diloco, delayed in ThreadWorld(WORLD).run(rank):
        assert diloco[2] == delayed[2]
        for a, b in zip([*diloco[0], *diloco[1]], [*delayed[0], *delayed[1]], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("at", [7, 9])  # inside round 2; right after round 2's end
def test_resume_with_exchanges_in_flight_is_exact(at):
    """A checkpoint with two rounds' exchanges in flight (k = 2, error feedback on top-k): the run
    that took it and a fresh run resumed from it both equal an uninterrupted run bit for bit."""
    def rank(engine):
        full = _Run(engine, parts=TOPK, staleness=2)
        full.steps(0, H * ROUNDS)
        saved = _Run(engine, parts=TOPK, staleness=2)
        saved.steps(0, at)
        # rounds 0 and 1 (1 and 2 at step 9) in flight, not waited for
        delayed = cast(DelayedDiLoCo, saved.sync)
        assert [e.averaged for e in delayed.in_flight] == [None, None] and saved.pipeline.in_flight
        state = copy.deepcopy(saved.sync.state_dict())
        assert len(state["delayed"]) == 2 and saved.pipeline.in_flight == 0
        saved.steps(at, H * ROUNDS)
        resumed = _Run(engine, parts=TOPK, staleness=2)
        resumed.sync.load_state_dict(state)
        resumed.steps(at, H * ROUNDS)
        # A compressed exchange books its bytes when it is waited for: the two rounds' that the
        # checkpoint waited for are in no step of the saved or the resumed run, the same in both.
        assert saved.sent[at:] == resumed.sent
        return full.params(), saved.params(), resumed.params()

    for full, saved, resumed in ThreadWorld(WORLD).run(rank):
        for a, b, c in zip(full, saved, resumed, strict=True):
            assert torch.equal(a, b) and torch.equal(a, c)


BASE = [*TINY, "engine=torch", "engine.np=2", "sync=delayed_diloco", "sync.inner_steps=2"]


@pytest.mark.parametrize("overrides, message", [
    (["sync.staleness=-1"], "sync.staleness=-1 must be an integer >= 0 (rounds each outer step is applied "
                            "late); pass sync.staleness=1 (PCCL's) or sync.staleness=0 (DiLoCo)"),
    (["sync.staleness=1.5"], "sync.staleness=1.5 must be an integer"),
    (["sync.staleness=true"], "sync.staleness=true must be an integer"),
    (["max_steps=6", "sync.staleness=3"],
     "sync.staleness=3 applies each outer step 3 rounds late and the run has 3 rounds of "
     "sync.inner_steps=2 (max_steps=6): no outer step would be applied; pass sync.staleness=2 or less, or "
     "a longer run"),
    (["engine=horovod"], "sync=delayed_diloco runs on engine=torch, not engine=horovod; add engine=torch"),
    (["engine.elastic=true"], "sync=delayed_diloco keeps state its engine fixed at start"),
    (["sharding=fsdp"], "sync=delayed_diloco does not run across shard groups"),
    (["sync.eager=true"], "sync.eager is not a setting of sync=delayed_diloco; name one that has it: "
                          "sync=diloco sync.eager=..."),
])
def test_bad_input_is_one_line_naming_its_fix(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*BASE, *overrides]))
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_the_cli_refuses_a_negative_staleness_before_writing_anything(tmp_path):
    proc = compbench("train", *BASE, "sync.staleness=-1", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: sync.staleness=-1 must be an integer >= 0 (rounds each outer step is applied late); pass "
        "sync.staleness=1 (PCCL's) or sync.staleness=0 (DiLoCo)"]
    assert not (tmp_path / "run").exists()


# slow tier: three 2-process runs through the launcher (~30 s on the loaded 2-core machine); the
# threaded resume above stays in the default tier
@pytest.mark.slow
@pytest.mark.dist
def test_resume_with_exchanges_in_flight_through_the_launcher_is_exact(tmp_path):
    """2 epochs == 1 epoch + resume over gloo (2 processes), k = 2: the checkpoint at the end of epoch
    1 (step 8, the end of round 3) holds the averages of rounds 2 and 3, still in flight."""
    from tests.integration.test_resume import _assert_equal

    setup = [*TINY, "batch_size=16", "epochs=2", "eval=false", "optim=adamw", "engine=torch", "engine.np=2",
             "sync=delayed_diloco", "sync.inner_steps=2", "sync.staleness=2", "compressor=topk", "ratio=0.1",
             "comm=allgather", "memory=residual"]
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, "max_steps=8", name="half")
    resumed, proc = train(tmp_path, *setup, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    h = torch.load(half / "checkpoint.pt", weights_only=True)
    assert [len(r["delayed"]) for r in h["per_rank"]] == [2] * WORLD
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True) for run in (full, resumed))
    for key in ("model", "optimizer", "per_rank"):
        _assert_equal(a[key], b[key], key)
