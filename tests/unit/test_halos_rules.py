"""sync=halos's servers without processes (compbench.sync.halos_rules) against a hand-written replay of
utnslab/halos's update rules (src/halos/opt.py `DelayedNesterovOptimizer.step`, src/halos/ps.py
`ParameterServer.update_model` / `merge_model`, src/halos/simulation/exec_halos.py
`LocalParameterServer` and `HalosSimulator.on_new_lps_updates`), written here per parameter tensor as
the reference keeps them, on a fixed sequence of worker updates from two regions with the GPS's answers
arriving late: bit for bit in float32. And its settings refused at compose time with one line. The
real process groups: tests/dist/test_halos.py."""

from __future__ import annotations

import pytest
import torch

from compbench.compose import config
from compbench.sync.halos_rules import GlobalServer, LocalServer, ServerOptim
from tests.helpers import TINY, compbench

SHAPES = [(3, 4), (5,)]  # two parameter tensors: the reference steps each, compbench one flat θ


class ReplayDelayedNesterov:
    """The reference's delayed Nesterov (Liu et al. 2024) per tensor, from its pseudocode: lr is the
    optimizer's (the paper's η times N, as examples/run_halos.sh passes it)."""

    def __init__(self, params, lr, beta, c, n):
        self.params, self.lr, self.beta, self.c, self.n, self.t = params, lr, beta, c, n, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.acc = [torch.zeros_like(p) for p in params]

    def step(self, grads):
        for i, (p, g) in enumerate(zip(self.params, grads, strict=True)):
            self.acc[i] += g
            if (self.t + 1) % self.n == 0:
                self.m[i] = self.beta * self.m[i] + self.acc[i] / self.n
                p -= self.lr * ((1 - self.c * self.n + self.c) * self.beta * self.m[i] + g / self.n)
                self.acc[i].zero_()
            else:
                p -= self.lr * (self.c * self.beta * self.m[i] + g / self.n)
        self.t += 1


class ReplayLps:
    def __init__(self, params, opt, alpha, k):
        self.params, self.opt, self.alpha, self.k = params, opt, alpha, k
        self.version, self.merged_version = 0, 0
        self.merged = [p.clone() for p in params]

    def on_worker(self, pgrads):
        """Returns the updates for the GPS when they are due, else None."""
        self.opt.step(pgrads)
        self.version += 1
        if self.version == self.merged_version + self.k:
            return [m - p for m, p in zip(self.merged, self.params, strict=True)]
        return None

    def on_global(self, global_params):
        for p, g in zip(self.params, global_params, strict=True):
            p *= 1.0 - self.alpha
            p += g * self.alpha
        self.merged = [p.clone() for p in self.params]
        self.merged_version = self.version


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


@pytest.mark.parametrize("c", [0.0, 0.3])
def test_the_servers_match_a_replay_of_the_reference_bit_for_bit(c):
    gen = torch.Generator().manual_seed(52)
    theta0 = [torch.randn(s, generator=gen) for s in SHAPES]
    local = ServerOptim(lr=0.2, momentum=0.9, delay=3, activation=c)
    globl = ServerOptim(lr=0.15, momentum=0.5, delay=2, activation=c)
    alpha, k = 0.25, 2
    # the reference's servers: lr = η·N, as its example script passes them
    ref_lps = []
    for _ in range(2):
        params = [t.clone() for t in theta0]
        ref_lps.append(ReplayLps(params, ReplayDelayedNesterov(params, 0.2 * 3, 0.9, c, 3), alpha, k))
    ref_gps_params = [t.clone() for t in theta0]
    ref_gps = ReplayDelayedNesterov(ref_gps_params, 0.15 * 2, 0.5, c, 2)
    lps = [LocalServer(flat(theta0), local, alpha, k) for _ in range(2)]
    gps = GlobalServer(flat(theta0), globl)

    in_flight: list[tuple[int, list[torch.Tensor]]] = []  # pushes not yet answered, in order
    answers: list[tuple[int, list[torch.Tensor]]] = []  # GPS answers not yet merged
    ours_in_flight: list[tuple[int, torch.Tensor]] = []
    ours_answers: list[tuple[int, torch.Tensor]] = []
    # a fixed interleaving: region 0 faster than region 1; the GPS handles a push two events after it,
    # and the LPS merges the answer one event later (updates arrive in between)
    regions = [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1, 0, 0]
    for event, region in enumerate(regions):
        g = [torch.randn(s, generator=gen) * 0.1 for s in SHAPES]
        due = ref_lps[region].on_worker(g)
        if due is not None:
            in_flight.append((region, due))
        if lps[region].update(flat(g), base=max(0, lps[region].version - 1)):
            ours_in_flight.append((region, lps[region].push()))
        if event % 2 == 1 and in_flight:  # the GPS applies the oldest push
            r, u = in_flight.pop(0)
            ref_gps.step(u)
            answers.append((r, [p.clone() for p in ref_gps_params]))
            r2, u2 = ours_in_flight.pop(0)
            assert r2 == r and torch.equal(u2, flat(u))
            ours_answers.append((r2, gps.update(r2, u2)))
        elif answers:  # the oldest answer reaches its LPS
            r, theta_g = answers.pop(0)
            ref_lps[r].on_global(theta_g)
            r2, ours = ours_answers.pop(0)
            lps[r2].merge(ours)
        for r in (0, 1):
            assert torch.equal(lps[r].theta, flat(ref_lps[r].params)), (event, r)
        assert torch.equal(gps.theta, flat(ref_gps_params)), event
    assert gps.counts.updates >= 4 and all(s.counts.merges >= 2 for s in lps)
    assert lps[0].theta.dtype == torch.float32 and not torch.equal(lps[0].theta, flat(theta0))


def test_an_lps_pushes_every_k_updates_after_its_last_merge_and_counts_staleness():
    theta = torch.zeros(4)
    s = LocalServer(theta, ServerOptim(0.1, 0.9, 2), merge_weight=0.5, accumulation=2)
    assert not s.update(torch.ones(4), base=0)
    assert s.update(torch.ones(4), base=0)  # v = 2 = 0 + K; staleness 1 (one update since its θ)
    u = s.push()
    assert s.in_flight and torch.equal(u, -s.theta)  # θ_merged = 0
    assert not s.update(torch.ones(4), base=2) and not s.update(torch.ones(4), base=2)  # in flight: no push
    s.merge(torch.full((4,), 3.0))
    assert s.merged_version == 4 and not s.in_flight
    assert torch.equal(s.merged, s.theta)
    assert not s.update(torch.ones(4), base=4) and s.update(torch.ones(4), base=4)
    c = s.counts.record()
    assert (c["updates"], c["pushes"], c["merges"], c["staleness_sum"], c["staleness_max"]) == (6, 1, 1, 3, 1)


def test_after_the_stop_an_lps_applies_nothing_and_counts_what_it_answered():
    """Rank 0's training ended (`stop`): each later delivery is answered, not applied, and its compute
    seconds counted as discarded; the updates before it stay counted as applied."""
    s = LocalServer(torch.zeros(4), ServerOptim(0.1, 0.9, 2), merge_weight=0.5, accumulation=2)
    assert not s.update(torch.ones(4), base=0, compute_s=1.0)
    theta, version = s.theta.clone(), s.version
    s.stop()
    assert not s.update(torch.ones(4), base=1, compute_s=2.5)  # would have been due to push: not now
    assert torch.equal(s.theta, theta) and s.version == version and not s.in_flight
    c = s.counts.record()
    assert (c["updates"], c["after_stop"], c["compute_s"], c["discarded_compute_s"]) == (1, 1, 1.0, 2.5)
    assert "discarded_s" not in c


def test_the_mode_declares_independent_learners_and_answers_the_trainer_s_questions():
    """The trainer asks a mode with `learners_independent` through compbench.sync.IndependentLearners
    (no probing): the mode must define both of its methods."""
    from compbench.sync import IndependentLearners
    from compbench.sync.halos import Halos

    assert Halos.sync_traits.learners_independent
    for name in ("stop_requested", "stop_learners"):
        assert callable(getattr(Halos, name)), name
        assert getattr(Halos, name).__doc__ and name in IndependentLearners.__dict__


@pytest.mark.parametrize("overrides, message", [
    (["engine.np=4", "sync.regions=3"], "sync.regions=3 does not divide engine.np=4 workers; pass a divisor"),
    (["sync.regions=0"], "sync.regions=0 must be an integer >= 1"),
    (["sync.accumulation=0"], "sync.accumulation=0 must be an integer >= 1"),
    (["sync.local_lr=0"], "sync.local_lr=0 must be a number > 0"),
    (["sync.global_momentum=1"], "sync.global_momentum=1 must be a number in [0, 1)"),
    (["sync.merge_weight=0"], "sync.merge_weight=0 must be a number in (0, 1]"),
    (["checkpoint=true"], "checkpoint=true: sync=halos does not save its state; pass checkpoint=false"),
    # the workers meet in no collective mid-run (SyncTraits.learners_independent)
    (["checkpoint_every_steps=2"], "checkpoint_every_steps=2: sync=halos's learners train at their own pace"),
    (["on_nonfinite=skip"], "on_nonfinite=skip: sync=halos's learners train at their own pace"),
    (["resume=auto"], "resume=auto: sync=halos does not save its state; pass resume=null"),
    (["engine=horovod"], "sync=halos runs on engine=torch, not engine=horovod; add engine=torch"),
    (["compressor=topk"], "sync=halos"),
    (["engine.elastic=true"], "sync=halos"),
])
def test_bad_settings_are_refused_with_one_line(overrides, message):
    args = [*TINY, "sync=halos", "sync.inner_steps=2", "engine=torch", "engine.np=2", "optim=adamw",
            *overrides]
    with pytest.raises(ValueError) as e:
        config.check(config.compose(args))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_cli_refuses_regions_that_do_not_divide_the_workers_before_writing_anything(tmp_path):
    proc = compbench("train", *TINY, "sync=halos", "engine=torch", "engine.np=2", "sync.regions=3",
                     f"outputs_root={tmp_path / 'outputs'}", cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: sync.regions=3 does not divide engine.np=2 workers")
    assert not (tmp_path / "outputs").exists()
