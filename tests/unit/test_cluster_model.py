"""The node-aware what-if model: its terms for Gloo's rings and all-to-all, and its fit."""

from __future__ import annotations

import math
import random

import pytest

from compbench.comm import cost_model
from compbench.comm.cost_model import Shape, features, fit

MB = 1e6


def _row(comm: str, sent: float, calls: int = 1, dense: float = 100 * MB) -> dict:
    return {"comm": comm, "bytes_sent_per_step": sent, "bytes_dense_per_step": dense,
            "bytes_allreduce_per_step": 0.0, "compressed_calls_per_step": calls, "dense_calls_per_step": 0}


def test_ring_allgather_sends_n_minus_1_payloads_over_each_machine_link() -> None:
    t = features(_row("allgather", MB), Shape(nodes=2, workers=8, gbps=1.0))
    assert t["rounds"] == 2 * 7  # the sizes' allgather, then the payloads'
    assert t["cross_s"] == pytest.approx(7 * MB / 125e6)  # 1 Gbit/s = 125 MB/s
    assert t["machine_bytes"] == pytest.approx(8 * 7 * MB)


def test_one_machine_has_no_link_term() -> None:
    t = features(_row("allgather", MB), Shape(nodes=1, workers=4, gbps=1.0))
    assert t["cross_s"] == 0 and t["rounds"] == 2 * 3


def test_alltoall_loads_a_machine_link_with_l_times_n_minus_l_messages() -> None:
    acc = cost_model._zero()
    cost_model.alltoall(acc, Shape(nodes=2, workers=8, gbps=1.0), 8 * MB)
    assert acc["cross_s"] == pytest.approx(4 * 4 * MB / 125e6)  # 4 senders x 4 remote peers x 1 MB
    assert acc["rounds"] == 1


def test_hierarchical_crosses_with_one_payload_per_node() -> None:
    shape = Shape(nodes=4, workers=8, gbps=10.0)
    hier = features(_row("hierarchical", MB), shape)
    flat = features(_row("allgather", MB), shape)
    assert hier["cross_s"] == pytest.approx(3 / 7 * flat["cross_s"])  # K-1 = 3 payloads, not N-1 = 7
    # members send the dense 100 MB to their leader and get it back: 4 nodes x 1 member x 2
    assert hier["machine_bytes"] == pytest.approx(4 * 7 * MB + 2 * 4 * 100 * MB)
    # blocking: (in, sizes + payloads between nodes, out) = 4 collectives x (N-1) peers
    assert hier["waited"] == 4 * 7 and hier["queued"] == 0
    assert flat["queued"] == 2 and flat["waited"] == 0  # the sizes, then the payloads


def test_fit_recovers_the_coefficients_it_was_made_with() -> None:
    truth = cost_model.Fit(ms_per_waited=2.0, ms_per_queued=0.2, ms_per_round=0.5, link_factor=1.1,
                              machine_gb_per_s=3.0)
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        shape = Shape(nodes=rng.choice([1, 2, 4]), workers=8, gbps=rng.choice([1.0, 10.0]))
        comm = rng.choice(["allgather", "ps", "hierarchical", "allreduce"])
        rows.append(features(_row(comm, rng.uniform(0.1, 100) * MB, calls=rng.randint(1, 20)), shape))
    got = fit(rows, [truth.comm_ms(t) for t in rows])
    for name in ("ms_per_waited", "ms_per_queued", "ms_per_round", "link_factor", "machine_gb_per_s"):
        assert math.isclose(getattr(got, name), getattr(truth, name), rel_tol=1e-6), name


def test_fit_refuses_too_few_rows() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        fit([features(_row("allgather", MB), Shape(2, 2, 1.0))], [1.0])


def test_unknown_comm_is_named() -> None:
    with pytest.raises(ValueError, match="comm=tree"):
        features(_row("tree", MB), Shape(2, 4, 1.0))


def test_dense_path_is_queued_even_under_a_blocking_communicator() -> None:
    row = {**_row("ps", 2 * MB, calls=2), "bytes_allreduce_per_step": MB, "dense_calls_per_step": 4}
    t = features(row, Shape(nodes=2, workers=4, gbps=1.0))
    assert t["queued"] == 4  # the dense allreduces
    assert t["waited"] == 2 * 4 * 3  # per call: counts, shards, the servers' allgather (2); 3 peers
