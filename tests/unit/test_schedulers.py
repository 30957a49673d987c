"""Schedulers in one process: grouping by bytes, flat buffers, state re-cutting, overlap from backward
hooks (order, unused parameters, exposed time), MergeComp's first step and its search."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from compbench.comm.allgather import AllgatherComm
from compbench.comm.ps import PSComm
from compbench.compressors import build_compressor
from compbench.engines.base import EngineBase, Handle
from compbench.memory.none import NoMemory
from compbench.memory.residual import ResidualMemory
from compbench.records.stats import StepStats
from compbench.schedulers.fusion import Part, balanced_cuts, reslice_state, split
from compbench.schedulers.layerwise import Layerwise
from compbench.schedulers.mergecomp import MergeComp, PartitionSearch
from compbench.seam.pipeline import GradientPipeline
from compbench.seam.selection import Selection


class WireEngine(EngineBase):
    """One rank. Collectives run in the background on a single simulated wire: each finishes
    `delay_s` after the previous one (or after it started, if later). Records what was started."""

    name, rank, size, local_rank, local_size = "wire", 0, 1, 0, 1
    device, backend = torch.device("cpu"), "wire"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.free_at = delay_s, 0.0
        self.started: list[str] = []

    def _later(self, name: str, result) -> Handle:
        self.started.append(name)
        done = max(time.perf_counter(), self.free_at) + self.delay_s
        self.free_at = done

        def finish():
            time.sleep(max(0.0, done - time.perf_counter()))
            return result

        return Handle(finish)

    def allreduce_async(self, t, name, average=True):
        return self._later(name, t.clone())

    def allgather_async(self, tensors, name):
        return self._later(name, [[t.clone() for t in tensors]])

    def alltoall(self, t, splits, name, received=None):
        return t.clone(), list(splits)

    def broadcast_(self, t, root=0, name="bcast"):
        return t

    def broadcast_object(self, obj, root=0):
        return obj


def make_pipeline(engine=None, compressor="none", memory=None, comm=AllgatherComm, **selection):
    engine = engine or WireEngine()
    comp = build_compressor(compressor)
    stats = StepStats()
    comm = comm(engine, comp, stats)
    return GradientPipeline(engine, comp, memory or NoMemory(), comm, Selection(**selection), stats)


class SlowBackward(torch.autograd.Function):
    """Identity whose backward sleeps: back-propagation with room to hide communication."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.seconds)
        return g, None


class Net(nn.Module):
    def __init__(self, sleep_s: float = 0.0, unused: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2, self.sleep_s = nn.Linear(6, 5), nn.Linear(5, 3), sleep_s
        self.spare = nn.Linear(2, 2) if unused else None

    def forward(self, x):
        return self.fc2(SlowBackward.apply(torch.relu(self.fc1(x)), self.sleep_s))


def step(model, scheduler, pipeline, x, i=0):
    """One training step the way the trainer runs it, up to the optimizer; returns the loss."""
    pipeline.stats.reset()
    pipeline.begin_step(i, 0.0)
    loss = model(x).square().mean()
    model.zero_grad(set_to_none=False)
    scheduler.before_backward(pipeline)
    loss.backward()
    scheduler.synchronize(pipeline)
    return loss


# -- grouping ------------------------------------------------------------------------------------


def test_cuts_balance_bytes_not_tensor_count():
    assert balanced_cuts([8, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0, 1]  # 8 | 8, not 4.5 tensors each
    assert balanced_cuts([4] * 8, 4) == [0, 2, 4, 6]
    assert balanced_cuts([100, 1, 1], 3) == [0, 1, 2]  # never an empty group
    assert balanced_cuts([1, 2], 5) == [0, 1]  # at most one group per tensor
    assert balanced_cuts([1] * 12, 2, skew=0.5) == [0, 8]  # last group half the first
    assert balanced_cuts([1] * 12, 2, skew=2.0) == [0, 4]
    assert split([5, 3, 9, 1], [0, 1, 3]) == [[5], [3, 9], [1]]


def test_fused_part_reuses_its_buffer_and_writes_back_each_member():
    a, b = nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(4))
    part = Part("g", [("a", a), ("b", b)], dense=False)
    a.grad, b.grad = torch.arange(6.0).view(2, 3), torch.arange(6.0, 10.0)
    flat = part.gradient()
    assert torch.equal(flat, torch.arange(10.0)) and part.shape == (10,)
    a.grad, b.grad = torch.ones(2, 3), torch.ones(4)
    assert part.gradient().data_ptr() == flat.data_ptr()  # allocated once
    part.write_back(torch.arange(10.0) * 2)
    assert torch.equal(a.grad, torch.arange(6.0).view(2, 3) * 2)
    assert torch.equal(b.grad, torch.arange(6.0, 10.0) * 2)
    single = Part("g", [("a", a)], dense=False)
    assert single.name == "a" and single.gradient() is a.grad  # one tensor: sent as it is


def test_state_is_recut_for_a_new_grouping():
    old = [("w", torch.Size([2, 3])), ("fused.1-2", torch.Size([5]))]
    new = [("fused.0-1", torch.Size([8])), ("v", torch.Size([3]))]
    state = {
        "residuals": {"w": torch.arange(6.0).view(2, 3), "fused.1-2": torch.arange(6.0, 11.0),
                      "other": torch.ones(1)},
        "q": {"w": torch.ones(7)},  # not of the parts' sizes: left alone
        "scalar": 3,
    }
    out = reslice_state(state, old, new)
    assert torch.equal(out["residuals"]["fused.0-1"], torch.arange(8.0))
    assert torch.equal(out["residuals"]["v"], torch.arange(8.0, 11.0))
    assert set(out["residuals"]) == {"fused.0-1", "v", "other"}  # the old names are gone
    assert out["q"].keys() == {"w"} and out["q"]["w"] is state["q"]["w"] and out["scalar"] == 3
    # a part that went dense has no entry: zeros
    out = reslice_state({"r": {"fused.1-2": torch.ones(5)}}, old, new)["r"]
    assert torch.equal(out["fused.0-1"], torch.tensor([0.0] * 6 + [1, 1]))
    assert torch.equal(out["v"], torch.ones(3))


# -- overlap ------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [True, False])
def test_layerwise_submits_from_backward_hooks(overlap):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 6)
    sched, pipeline = Layerwise(overlap=overlap), make_pipeline()
    sched.setup(model)
    step(model, sched, pipeline, x)  # step 0 records the ready order
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    started = []
    pipeline.engine.started = started
    model.zero_grad()
    sched.before_backward(pipeline)
    model(x).square().mean().backward()
    during_backward = len(started)
    sched.synchronize(pipeline)
    assert during_backward == (4 if overlap else 0)
    assert started == [sched.params[i][0] for i in sched.order]  # the recorded ready order
    assert started[:2] == ["fc2.bias", "fc2.weight"] or started[:2] == ["fc2.weight", "fc2.bias"]
    for n, p in model.named_parameters():  # one rank: the average is the gradient itself
        torch.testing.assert_close(p.grad, expected[n])


def test_synchronize_without_before_backward_still_averages_everything():
    """A user's own loop (or wrap_compress_optimizer without zero_grad through it): no overlap."""
    model, x = Net(), torch.randn(4, 6)
    sched, pipeline = MergeComp(groups=2), make_pipeline()
    sched.setup(model)
    for i in range(3):
        model.zero_grad()
        model(x).square().mean().backward()
        expected = {n: p.grad.clone() for n, p in model.named_parameters()}
        pipeline.begin_step(i, 0.0)
        sched.synchronize(pipeline)
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[n])
    assert len(sched.groups) == 2


def test_blocking_communicator_submits_after_backward():
    model, x = Net(), torch.randn(4, 6)
    sched, pipeline = Layerwise(), make_pipeline(compressor="topk", comm=PSComm, memory=ResidualMemory())
    sched.setup(model)
    sched.before_backward(pipeline)
    model(x).square().mean().backward()
    assert pipeline._pending == [] and not sched.overlapping
    sched.synchronize(pipeline)
    assert len(pipeline.collect()) == 0


def test_groups_go_out_in_order_whatever_the_ready_order():
    model = nn.Sequential(*[nn.Linear(2, 2, bias=False) for _ in range(4)])
    sched, pipeline = MergeComp(groups=2), make_pipeline()
    sched.setup(model)
    sched.order_recorded, sched.dense_step = True, False
    sched._use(pipeline, (2, 1.0))
    first, second = [sched.params[i] for i in sched.runs[0]], [sched.params[i] for i in sched.runs[1]]
    started = pipeline.engine.started
    sched.before_backward(pipeline)
    for name, p in second + first[:1]:  # the second group is complete before the first
        p.grad = torch.ones_like(p)
        sched._on_ready(sched.params.index((name, p)), p)
    assert started == []  # waits for the first group: the same order on every rank
    name, p = first[1]
    p.grad = torch.ones_like(p)
    sched._on_ready(sched.params.index((name, p)), p)
    assert started == ["fused.0-1", "fused.2-3"]
    sched.synchronize(pipeline)


def test_unused_parameters_send_zeros_and_nothing_is_left_behind():
    model, x = Net(unused=True), torch.randn(4, 6)
    for sched in (Layerwise(), MergeComp(groups=2)):
        pipeline = make_pipeline()
        sched.setup(model)
        for i in range(2):
            step(model, sched, pipeline, x, i)
            assert torch.equal(model.spare.weight.grad, torch.zeros(2, 2)) and pipeline._pending == []
        assert sched.order[-2:] == [0, 1]  # the spare layer was never ready: it goes last


def test_gradient_accumulation_under_overlap_is_refused():
    model, x = Net(), torch.randn(4, 6)
    sched, pipeline = Layerwise(), make_pipeline()
    sched.setup(model)
    sched.before_backward(pipeline)
    model(x).sum().backward()
    with pytest.raises(ValueError, match="overlap=false"):
        model(x).sum().backward()


class MarkBackward(torch.autograd.Function):
    """Identity whose backward calls `mark()`: the moment back-propagation passes from fc2 to fc1."""

    @staticmethod
    def forward(ctx, x, mark):
        ctx.mark = mark
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.mark()
        return g, None


class MarkedNet(Net):
    def __init__(self, mark) -> None:
        super().__init__()
        self.mark = mark

    def forward(self, x):
        return self.fc2(MarkBackward.apply(torch.relu(self.fc1(x)), self.mark))


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_sends_early_gradients_while_backward_runs(overlap):
    """Event-based (no clocks, so it holds on a loaded machine): overlapped, fc2's two collectives
    have started when back-propagation reaches fc1; submitted after backward, none has."""
    engine = WireEngine()
    seen: list[list[str]] = []
    model, x = MarkedNet(lambda: seen.append(list(engine.started))), torch.randn(4, 6)
    sched, pipeline = Layerwise(overlap=overlap), make_pipeline(engine)
    sched.setup(model)
    step(model, sched, pipeline, x)
    assert len(seen) == 1 and len(seen[0]) == (2 if overlap else 0), seen
    assert len(engine.started) == 4  # and every gradient went out by the end of the step


@pytest.mark.slow  # wall-clock assertions (tens of ms of slack): only meaningful on an idle machine
def test_overlap_hides_communication_behind_backward():
    """fc2's gradients are ready first; back-propagation then sleeps 0.15 s before fc1's. Each
    collective takes 0.05 s on one wire. Overlapped, fc2's two go out during the sleep and only fc1's
    two wait (~0.1 s); submitted after backward, all four wait (~0.2 s)."""
    exposed = {}
    for overlap in (True, False):
        model, x = Net(sleep_s=0.15), torch.randn(4, 6)
        sched, pipeline = Layerwise(overlap=overlap), make_pipeline(WireEngine(delay_s=0.05))
        sched.setup(model)
        step(model, sched, pipeline, x)
        step(model, sched, pipeline, x, 1)
        exposed[overlap] = pipeline.stats.ms["comm_exposed"]
    assert exposed[False] > 180 and exposed[True] < exposed[False] - 60, exposed


# -- MergeComp ----------------------------------------------------------------------------------


def train(sched, steps=5, compressor="none", memory=None, **selection):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    pipeline = make_pipeline(compressor=compressor, memory=memory, **selection)
    sched.setup(model)
    xs = torch.randn(steps, 4, 6)
    for i in range(steps):
        step(model, sched, pipeline, xs[i], i)
        opt.step()
    return model, pipeline


@pytest.mark.parametrize("sched", [Layerwise(overlap=False), MergeComp(groups=0), MergeComp(groups=1),
                                   MergeComp(groups=3),
                                   MergeComp(groups="auto", trial_steps=2, max_groups=4)],
                         ids=["layerwise-no-overlap", "mergecomp0", "mergecomp1", "mergecomp3", "auto"])
def test_every_grouping_gives_the_plain_gradients(sched):
    ref, _ = train(Layerwise())
    model, _ = train(sched)
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=n)


def test_mergecomp_first_step_is_uncompressed_then_groups_are_compressed():
    sched = MergeComp(groups=2)
    model, pipeline = train(sched, steps=1, compressor="topk", memory=ResidualMemory(), min_dims=2)
    stats = pipeline.stats
    assert stats.bytes_sent == stats.bytes_dense  # step 0: dense, records the order
    assert len(sched.groups) == 2 and sched.order_recorded
    names = [p.name for g in sched.groups for p in g.parts]
    # weights (2-D) are fused and compressed; biases (1-D under min_dims=2) ride in a dense part
    assert any(n.endswith(".dense") for n in names) and any(not n.endswith(".dense") for n in names)
    x = torch.randn(4, 6)
    step(model, sched, pipeline, x, 1)
    assert stats.bytes_sent < stats.bytes_dense
    assert set(pipeline.memory.residuals) == {p.name for g in sched.groups for p in g.parts if not p.dense}


def test_auto_search_ends_with_the_fastest_candidate_and_state_follows():
    sched = MergeComp(groups="auto", trial_steps=2, max_groups=4, search_steps=12)
    model, pipeline = train(sched, steps=14, compressor="topk", memory=ResidualMemory())
    summary = sched.summary()
    assert sched.search is None and summary["search_end_step"] is not None
    # 6 trials of 2 steps: the first sweep (1, 2, 4 groups, layer-wise), then the best two again
    assert len(summary["search"]) == 4 and summary["search_steps"] == 12
    assert sorted(c["steps"] for c in summary["search"]) == [1, 1, 2, 2]  # one timed step per trial
    best = min(summary["search"], key=lambda c: c["ms"])
    assert (summary["groups"], summary["skew"]) == (best["groups"] or len(sched.params), best["skew"])
    live = {p.name for g in sched.groups for p in g.parts if not p.dense}
    assert set(pipeline.memory.residuals) == live  # re-cut, nothing stale left behind


def test_search_walk():
    fake = {(0, 1.0): 50.0}  # ms per candidate; 6 groups, then a light last group, is best

    def ms(c):
        return fake.get(c, abs(c[0] - 6) * 3 + 20 + {1.0: 0, 0.5: -1, 0.25: -2, 0.125: 5, 2.0: 4}[c[1]])

    search, walked = PartitionSearch(num_tensors=100, max_groups=16, max_trials=20), []
    while (c := search.next()) is not None:
        walked.append(c)
        search.report(c, [ms(c)])
    assert walked[:6] == [(1, 1.0), (2, 1.0), (4, 1.0), (8, 1.0), (16, 1.0), (0, 1.0)]
    assert walked[6:12] == [(3, 1.0), (6, 1.0), (6, 0.5), (6, 2.0), (6, 0.25), (6, 0.125)]
    assert walked[12:] == [(6, 0.25), (6, 0.5)]  # the two best, timed again
    assert search.best() == (6, 0.25)
    # a noisy first trial is outvoted by the confirmation's samples
    noisy = PartitionSearch(num_tensors=4, max_groups=4, max_trials=6, confirm=2)
    first = {(1, 1.0): 10.0, (2, 1.0): 11.0, (4, 1.0): 30.0, (0, 1.0): 30.0}
    again = {(1, 1.0): [20.0, 21.0], (2, 1.0): [11.0, 12.0]}
    while (c := noisy.next()) is not None:
        noisy.report(c, again[c] if c in noisy.samples else [first[c]])
    assert noisy.trials == 6 and noisy.best() == (2, 1.0)
    # a budget smaller than the first sweep: no confirmation, and never more trials than allowed
    short = PartitionSearch(num_tensors=100, max_groups=16, max_trials=3)
    while (c := short.next()) is not None:
        short.report(c, [1.0])
    assert short.trials == 3 and len(short.samples) == 3


@pytest.mark.parametrize("kw, match", [({"groups": -1}, "groups=-1"), ({"groups": "many"}, "groups='many'"),
                                       ({"trial_steps": 1}, "trial_steps=1"),
                                       ({"search_steps": 2}, "search_steps=2")])
def test_mergecomp_rejects_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        MergeComp(**kw)


def test_nonfinite_guard_keeps_error_feedback_finite():
    """on_nonfinite=skip: the trainer drops the step after the hooks already compressed it."""
    for guard in (True, False):
        pipeline = make_pipeline(compressor="topk", memory=ResidualMemory())
        pipeline.guard_nonfinite = guard
        pipeline.submit("w", torch.tensor([[1.0, float("nan")], [2.0, 3.0]]))
        pipeline.collect()
        assert bool(torch.isfinite(pipeline.memory.residuals["w"]).all()) == guard


def test_fused_gradients_are_views_of_their_group_buffer():
    # DDP's gradient_as_bucket_view: back-propagation writes into the group's flat buffer, which is
    # sent as it is, and the averaged gradients land there (no copy in, no copy out).
    sched = MergeComp(groups=2)
    model, pipeline = train(sched, steps=2)  # step 0 records the order; the groups exist after it
    model.zero_grad(set_to_none=True)  # as the trainer's optimizer does
    step(model, sched, pipeline, torch.randn(4, 6), 2)
    parts = [part for group in sched.groups for part in group.parts if part.fused]
    assert parts
    for part in parts:
        buf = part.gradient()
        start, end = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
        assert all(start <= p.grad.data_ptr() < end for _, p in part.members)


def test_write_back_sees_a_bound_view_with_a_size_one_dimension():
    # A conv kernel with one input channel: its bound view and the averaged slice are the same memory
    # with different strides on the size-1 dimension (what a real run hit).
    w, b = nn.Parameter(torch.zeros(16, 1, 3, 3)), nn.Parameter(torch.zeros(16))
    part = Part("g", [("w", w), ("b", b)], dense=False)
    part.bind()
    flat = part.gradient()
    flat.copy_(torch.arange(float(flat.numel())))
    w.grad = flat[:144].as_strided((16, 1, 3, 3), (9, 1, 3, 1))  # as autograd may leave it
    part.write_back(flat)  # in place: nothing to copy, and no overlap error
    assert torch.equal(w.grad.reshape(-1), torch.arange(144.0))
