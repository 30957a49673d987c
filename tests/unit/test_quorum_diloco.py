"""sync=quorum_diloco's synchronizer without processes (compbench.sync.quorum_merge): the merge's weights
against hand-computed token-weighted means, DiLoCo's mean for equal weights, and the rules of who
waits, who is late, what is discarded and when a merge happens, on a clock the test sets; its
settings refused at compose time with one line. The real process groups: tests/dist/test_quorum_diloco.py."""

from __future__ import annotations

import pytest
import torch

from compbench.compose import config
from compbench.records import goodput
from compbench.sync.quorum_merge import Contribution, QuorumSettings, QuorumState, merge_weights, merged_delta
from tests.helpers import TINY, compbench


def test_the_merge_is_the_token_weighted_mean():
    deltas = [torch.tensor([6.0, 1.0]), torch.tensor([0.0, 2.0]), torch.tensor([3.0, -4.0])]
    tokens = [100, 300, 200]
    # by hand: (100·6 + 300·0 + 200·3) / 600 = 2, (100·1 + 300·2 + 200·(−4)) / 600 = −1/6
    assert merged_delta(deltas, tokens, "tokens").tolist() == pytest.approx([2.0, -1 / 6])
    assert merge_weights(tokens, "tokens") == pytest.approx([1 / 3, 1.0, 2 / 3])
    # uniform: the plain mean, whatever the tokens
    assert merged_delta(deltas, tokens, "uniform").tolist() == pytest.approx([3.0, -1 / 3])


def test_equal_tokens_give_diloco_s_mean_bit_for_bit():
    """A sum then one division, as the allreduce of sync=diloco averages (weights 1.0 exactly)."""
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(1000, generator=gen) for _ in range(3))
    assert torch.equal(merged_delta([a, b], [64, 64], "tokens"), (a + b) / 2)
    assert torch.equal(merged_delta([a, b, c], [7, 7, 7], "tokens"), (a + b + c) / 3)
    assert merge_weights([5, 5], "tokens") == [1.0, 1.0]


def _state(learners=4, **settings) -> QuorumState:
    plain = {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False, **settings}
    return QuorumState([torch.zeros(2), torch.zeros(1)], learners, QuorumSettings(**plain))


def _c(rank, base, step, delta, tokens=10, compute_s=1.0) -> Contribution:
    return Contribution(rank, base, step, tokens, compute_s, torch.tensor(delta))


def _started(state: QuorumState, now: float = 0.0) -> QuorumState:
    for rank in range(state.learners):
        state.answered(rank, now)
    return state


def test_a_merge_waits_for_the_quorum_then_the_window_and_the_straggler_joins_the_next_one_late():
    s = _started(_state(quorum=3, window=1.0))
    for rank in (0, 2, 3):  # the quorum delivers on θ_0; each waits for the merge it is in
        assert s.deliver(_c(rank, 0, 3, [float(rank), 0.0, 1.0]), now=1.0) == []
    assert s.outstanding() == [1] and not s.due(1.5)  # the window waits for learner 1 until 2.0
    assert s.due(2.0)
    assert s.merge(2.0) == [0, 2, 3]
    # θ ← θ − lr·mean(Δ) with lr 1: mean of (0,0,1), (2,0,1), (3,0,1)
    assert s.flat_theta().tolist() == pytest.approx([-5 / 3, 0.0, -1.0])
    for rank in (0, 2, 3):
        s.answered(rank, 2.0)
    # the straggler delivers on θ_0 after merge 1: late by one merge, answered at once with θ_1
    assert s.deliver(_c(1, 0, 3, [3.0, 3.0, 3.0], compute_s=3.0), now=2.5) == [1]
    s.answered(1, 2.5)
    for rank in (0, 2, 3):
        s.deliver(_c(rank, 1, 6, [0.0, 0.0, 0.0]), now=3.0)
    assert s.outstanding() == [1] and s.due(4.0)
    s.merge(4.0)
    led = s.ledger.record()
    assert led["merges"] == 2 and led["merges_short"] == 2 and led["late_merged"] == 1 and led["fresh"] == 6
    assert led["per_rank"]["1"] == {"merged": 0, "late_merged": 1, "discarded": 0, "missed": 2}
    assert led["merged_compute_s"] == pytest.approx(9.0)  # six fresh rounds of 1 s and the late one of 3 s
    # merge 2 took the late Δ with the fresh ones: mean of (0,0,0) x3 and (3,3,3)
    assert s.flat_theta().tolist() == pytest.approx([-5 / 3 - 0.75, -0.75, -1.75])


def test_too_stale_is_discarded_and_counted_and_pending_work_at_the_end_too():
    s = _started(_state(learners=2, quorum=1, window=0.5, max_staleness=1))
    s.version = 3  # three merges happened without learner 1
    assert s.deliver(_c(1, 1, 3, [1.0, 1.0, 1.0], compute_s=2.0), now=1.0) == [1]  # staleness 2 > 1
    assert s.ledger.late_discarded == 1 and s.ledger.discarded_s == 2.0
    s.answered(1, 1.0)
    s.deliver(_c(1, 2, 6, [1.0, 1.0, 1.0], compute_s=2.0), now=2.0)  # staleness 1: pending for merge 4
    s.leave(0, 2.0)
    s.leave(1, 2.0)
    assert s.done
    s.close()
    assert s.ledger.left_at_end == 1 and s.ledger.discarded_s == 4.0
    record = goodput.record([(5.0, 6.0), (4.0, 6.0)], wall_s=10.0, discarded_s=s.ledger.discarded_s)
    assert record["goodput"] == pytest.approx(0.25) and record["discarded_share"] == pytest.approx(0.2)
    assert record["idle_share"] == pytest.approx(0.55)
    assert record["step_goodput"] == pytest.approx(5 / 12, abs=1e-4)  # rounded to 4 places


def test_a_learner_behind_the_others_is_answered_at_once_and_its_delta_still_counts():
    s = _started(_state(learners=3, quorum=2, window=None))
    s.deliver(_c(0, 0, 9, [0.0, 0.0, 0.0]), now=1.0)  # learner 0 reports 9 steps
    assert s.deliver(_c(2, 0, 6, [0.0, 0.0, 0.0]), now=1.0) == [2]  # on θ_0 too, 3 steps behind
    assert s.outstanding() == [1]  # window None: the merge waits for learner 1, training on θ_0
    assert not s.due(100.0)
    s.deliver(_c(1, 0, 9, [0.0, 0.0, 0.0]), now=2.0)
    assert s.due(2.0) and s.merge(2.0) == [0, 1]  # learner 2 was not waiting
    assert s.ledger.fresh == 3


def test_the_adaptive_window_is_a_multiple_of_the_median_round_time():
    s = _started(_state(learners=3, quorum=2, window="adaptive", window_factor=0.5), now=0.0)
    s.deliver(_c(0, 0, 3, [0.0] * 3), now=2.0)
    s.deliver(_c(1, 0, 3, [0.0] * 3), now=4.0)  # rounds of 2 s and 4 s: median 3 s
    assert s.window_s() == pytest.approx(1.5) and s.deadline() == pytest.approx(5.5)
    assert not s.due(5.4) and s.due(5.5)


def test_the_quorum_shrinks_with_the_learners_that_left():
    s = _started(_state(learners=3, quorum=3, window=None))
    s.leave(2, 0.5)
    s.deliver(_c(0, 0, 3, [0.0] * 3), now=1.0)
    s.deliver(_c(1, 0, 3, [0.0] * 3), now=1.0)
    assert s.due(1.0)


def test_the_synchronizer_s_state_round_trips():
    s = _started(_state(learners=2, quorum=1, window=1.0, outer_momentum=0.9, nesterov=True))
    s.deliver(_c(0, 0, 3, [1.0, 2.0, 3.0]), now=1.0)
    s.merge(1.0)
    s.deliver(_c(1, 0, 3, [1.0, 1.0, 1.0]), now=2.0)  # late, pending
    saved = s.state_dict()
    other = _state(learners=2, quorum=1, window=1.0, outer_momentum=0.9, nesterov=True)
    other.load_state_dict(saved)
    assert torch.equal(other.flat_theta(), s.flat_theta()) and other.version == 1
    assert [c.rank for c in other.late] == [1] and other.ledger.record() == s.ledger.record()
    for state in (s, other):
        state.answered(0, 2.0)
        state.deliver(_c(0, 1, 6, [0.5, 0.5, 0.5]), now=3.0)
        state.merge(3.0)
    assert torch.equal(other.flat_theta(), s.flat_theta())  # the outer momentum came along


def test_the_stop_answers_the_waiting_discards_what_is_pending_and_every_later_delivery():
    """Rank 0's training ended (quorum_merge's `stop`): no merge follows; the learner waiting for one
    is answered at once, pending work and every later delivery are discarded and counted."""
    s = _started(_state(learners=3, quorum=3, window=None))
    s.deliver(_c(0, 0, 3, [1.0, 1.0, 1.0], compute_s=1.0), now=1.0)
    s.deliver(_c(2, 0, 3, [1.0, 1.0, 1.0], compute_s=1.5), now=1.0)  # both wait for learner 1
    theta = s.flat_theta().clone()
    assert s.stop() == [0, 2] and s.stopping
    assert not s.due(5.0) and s.ledger.left_at_end == 2 and s.ledger.discarded_s == 2.5
    assert s.deliver(_c(1, 0, 3, [9.0, 9.0, 9.0], compute_s=3.0), now=6.0) == [1]  # at once, the stop
    led = s.ledger.record()
    assert led["after_stop"] == 1 and led["discarded_compute_s"] == 5.5 and led["merges"] == 0
    assert led["per_rank"]["1"]["discarded"] == 1 and torch.equal(s.flat_theta(), theta)
    for rank in range(3):
        s.leave(rank, 7.0)
    assert s.done
    s.close()
    assert s.ledger.discarded_s == 5.5  # nothing counted twice


def test_the_mode_declares_independent_learners_and_answers_the_trainer_s_questions():
    """The trainer asks a mode with `learners_independent` through compbench.sync.IndependentLearners
    (no probing): the mode must define both of its methods."""
    from compbench.sync import IndependentLearners
    from compbench.sync.quorum_diloco import QuorumDiLoCo

    assert QuorumDiLoCo.sync_traits.learners_independent
    for name in ("stop_requested", "stop_learners"):
        assert callable(getattr(QuorumDiLoCo, name)), name
        assert getattr(QuorumDiLoCo, name).__doc__ and name in IndependentLearners.__dict__


@pytest.mark.parametrize("overrides, message", [
    (["engine.np=2", "sync.quorum=3"], "sync.quorum=3 is more than engine.np=2 workers; pass sync.quorum<=2"),
    (["sync.quorum=0"], "sync.quorum=0 must be an integer >= 1"),
    (["sync.window_s=0"], "sync.window_s=0 must be seconds > 0"),
    (["sync.window_s=soon"], "sync.window_s=soon is unknown; pass seconds"),
    (["sync.window_factor=0"], "sync.window_factor=0 must be a number > 0"),
    (["sync.weighting=flops"], "sync.weighting=flops is unknown; pass sync.weighting=tokens"),
    (["sync.max_staleness=-1"], "sync.max_staleness=-1 must be an integer >= 0"),
    (["engine=horovod"], "sync=quorum_diloco runs on engine=torch, not engine=horovod; add engine=torch"),
    (["engine.elastic=true"], "sync=quorum_diloco"),
    # the learners meet in no collective mid-run (SyncTraits.learners_independent)
    (["on_nonfinite=skip"], "on_nonfinite=skip: sync=quorum_diloco's learners train at their own pace"),
    (["checkpoint_every_steps=4"], "checkpoint_every_steps=4: sync=quorum_diloco's learners train at their"),
])
def test_bad_settings_are_refused_with_one_line(overrides, message):
    args = [*TINY, "sync=quorum_diloco", "sync.inner_steps=2", "engine=torch", "optim=adamw", *overrides]
    with pytest.raises(ValueError) as e:
        config.check(config.compose(args))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_cli_refuses_a_quorum_above_the_workers_before_writing_anything(tmp_path):
    proc = compbench("train", *TINY, "sync=quorum_diloco", "engine=torch", "engine.np=2", "sync.quorum=3",
                     f"outputs_root={tmp_path / 'outputs'}", cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: sync.quorum=3 is more than engine.np=2 workers")
    assert not (tmp_path / "outputs").exists()
