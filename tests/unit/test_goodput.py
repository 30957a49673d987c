"""summary.goodput's arithmetic (compbench.records.goodput) against hand-computed figures."""

import pytest

from compbench.records import goodput


def test_record_shares_of_the_workers_time():
    # 2 workers, 10 s: 5 + 4 s of compute, 1 s of it discarded -> 8 / 20 useful, 1 / 20 discarded
    g = goodput.record([(5.0, 6.0), (4.0, 6.0)], wall_s=10.0, discarded_s=1.0)
    assert g["goodput"] == 0.4 and g["discarded_share"] == 0.05 and g["idle_share"] == 0.55
    assert g["step_goodput"] == round(8 / 12, 4) and g["workers"] == 2
    assert g["per_worker"] == [{"compute_s": 5.0, "step_s": 6.0}, {"compute_s": 4.0, "step_s": 6.0}]


def test_elastic_goodput_counts_each_step_times_its_workers_over_the_workers_given():
    # 3 steps: 2, 1 (a worker dead), 2 workers; compute 100+20 ms a step, steps of 200 ms; 4 workers given
    history = {"elastic/workers": [2, 1, 2], "time/compute_ms": [100.0] * 3, "time/optimizer_ms": [20.0] * 3,
               "time/step_ms": [200.0] * 3}
    g = goodput.record_elastic(history, provisioned=4, wall_s=1.0)
    compute = (2 + 1 + 2) * 0.120
    assert g["compute_s"] == pytest.approx(compute)
    assert g["goodput"] == round(compute / 4.0, 4) and g["idle_share"] == round(1 - compute / 4.0, 4)
    assert g["step_goodput"] == round(compute / (5 * 0.2), 4)
    assert g["workers"] == 4 and g["per_worker"] is None and g["discarded_share"] == 0.0


def test_elastic_records_out_of_step_are_refused():
    history = {"elastic/workers": [2, 2], "time/compute_ms": [1.0], "time/optimizer_ms": [1.0],
               "time/step_ms": [1.0, 1.0]}
    with pytest.raises(ValueError, match="out of step"):
        goodput.record_elastic(history, provisioned=2, wall_s=1.0)
