"""The cost model's collectives of sharded training, by hand: ring all-gathers into a buffer and ring
reduce-scatters inside shard groups, qgZ's all-to-all inside them, FSDP's step, and the replica
exchange across the groups (HSDP)."""

from __future__ import annotations

import pytest

from compbench.comm import cost_model
from compbench.comm.cost_model import (
    Shape,
    across_groups,
    crosses_machines,
    features,
    fsdp_features,
    ring_allgather_into,
    ring_allreduce,
    ring_reduce_scatter,
)

MB = 1e6
LINK = 125e6  # 1 Gbit/s in bytes a second


def _acc() -> dict[str, float]:
    return cost_model._zero()


def test_groups_cross_machines_when_larger_than_one_or_straddling() -> None:
    shape = Shape(nodes=2, workers=8, gbps=1.0)  # 4 to a machine
    assert crosses_machines(shape, 8) and not crosses_machines(shape, 4) and not crosses_machines(shape, 2)
    assert crosses_machines(shape, 3)  # some group of 3 straddles two machines
    assert not crosses_machines(Shape(nodes=1, workers=8, gbps=1.0), 8)  # one machine: no link


def test_a_ring_allgather_into_a_buffer_passes_g_minus_1_chunks_over_a_machine_link() -> None:
    acc = _acc()
    ring_allgather_into(acc, Shape(nodes=4, workers=4, gbps=1.0), 4 * MB)  # a 4 MB buffer, 1 MB each
    assert acc["queued"] == 1  # one collective: no sizes exchanged first
    assert acc["rounds"] == 3
    assert acc["cross_s"] == pytest.approx(3 * MB / LINK)
    assert acc["machine_bytes"] == pytest.approx(4 * 3 * MB)  # every worker sends 3 chunks


def test_a_group_inside_a_machine_loads_no_link() -> None:
    acc = _acc()
    ring_allgather_into(acc, Shape(nodes=2, workers=4, gbps=1.0), 4 * MB, calls=2, group=2)
    assert acc["cross_s"] == 0 and acc["rounds"] == 2 * 1 and acc["queued"] == 2
    assert acc["machine_bytes"] == pytest.approx(2 * 4 * 2 * MB)  # 4 workers send half the buffer


def test_a_ring_allreduce_is_a_reduce_scatter_then_an_allgather() -> None:
    shape = Shape(nodes=8, workers=8, gbps=10.0)
    both, allreduce = _acc(), _acc()
    ring_reduce_scatter(both, shape, 8 * MB)
    ring_allgather_into(both, shape, 8 * MB)
    ring_allreduce(allreduce, shape, 8 * MB)
    for term in ("rounds", "cross_s", "machine_bytes"):
        assert both[term] == pytest.approx(allreduce[term]), term
    assert both["queued"] == 2 and allreduce["queued"] == 1


def test_reduce_scatter_in_groups_spanning_machines() -> None:
    acc = _acc()
    # groups of 4 over machines of 2: each ring crosses; 3 rounds of 1/4 of 8 MB
    ring_reduce_scatter(acc, Shape(nodes=4, workers=8, gbps=1.0), 8 * MB, group=4)
    assert acc["rounds"] == 3
    assert acc["cross_s"] == pytest.approx(3 * 2 * MB / LINK)
    assert acc["machine_bytes"] == pytest.approx(8 * 3 / 4 * 8 * MB)


def test_alltoall_in_groups() -> None:
    world, grouped, inside = _acc(), _acc(), _acc()
    shape = Shape(nodes=2, workers=8, gbps=1.0)
    cost_model.alltoall(world, shape, 8 * MB)
    cost_model.alltoall(grouped, shape, 8 * MB, group=8)
    assert world == grouped  # the world is one group
    cost_model.alltoall(inside, shape, 8 * MB, group=4)  # a group per machine: nothing crosses
    assert inside["cross_s"] == 0 and inside["rounds"] == 1
    assert inside["machine_bytes"] == pytest.approx(8 * 3 / 4 * 8 * MB)
    spans = _acc()
    # groups of 4 over machines of 2: 2 members here x 2 there, 2 MB each
    cost_model.alltoall(spans, Shape(nodes=4, workers=8, gbps=1.0), 8 * MB, group=4)
    assert spans["cross_s"] == pytest.approx(2 * 2 * 2 * MB / LINK)


def test_fsdp_step_counts_its_collectives_and_their_rounds() -> None:
    """5 units at stage 3 on 4 workers, each its own machine: 10 all-gathers and 5 reduce-scatters."""
    shape = Shape(nodes=4, workers=4, gbps=1.0)
    ring = fsdp_features(shape, 4, gather_bytes=4 * MB, gathers=10, scatter_bytes=4 * MB, scatters=5)
    assert ring["queued"] == 15 and ring["waited"] == 0
    assert ring["rounds"] == ring["delayed_rounds"] == 15 * 3
    assert ring["cross_s"] == pytest.approx(15 * 3 * MB / LINK)  # (g-1)/g of each buffer
    qgz = fsdp_features(shape, 4, gather_bytes=4 * MB, gathers=10, scatter_bytes=MB, scatters=5,
                        scatter_alltoall=True)
    assert qgz["rounds"] == 10 * 3 + 5  # an all-to-all is one round
    assert qgz["cross_s"] == pytest.approx((10 * 3 * MB + 5 * 3 / 4 * MB) / LINK)
    inside = fsdp_features(Shape(nodes=2, workers=8, gbps=1.0), 4, 4 * MB, 10, 4 * MB, 5)
    assert inside["cross_s"] == 0 and inside["delayed_rounds"] == 0 and inside["rounds"] == 45


def test_hpz_gathers_backward_inside_the_machine() -> None:
    shape = Shape(nodes=2, workers=8, gbps=1.0)
    hpz = fsdp_features(shape, 8, 8 * MB, gathers=5, scatter_bytes=8 * MB, scatters=5, node_gathers=5)
    plain = fsdp_features(shape, 8, 8 * MB, gathers=10, scatter_bytes=8 * MB, scatters=5)
    assert hpz["queued"] == plain["queued"] == 15
    assert hpz["rounds"] == 5 * 7 + 5 * 3 + 5 * 7  # forward's over 8, backward's over a machine's 4
    assert hpz["delayed_rounds"] == 5 * 7 + 5 * 7
    assert hpz["cross_s"] == pytest.approx(10 * 7 * MB / LINK)  # forward's gathers and the scatters
    assert plain["cross_s"] == pytest.approx(15 * 7 * MB / LINK)


def _allreduce(nbytes: float) -> dict:
    return {"comm": "allreduce", "bytes_sent_per_step": nbytes, "bytes_allreduce_per_step": nbytes,
            "bytes_dense_per_step": nbytes, "compressed_calls_per_step": 0, "dense_calls_per_step": 1}


def test_the_replica_exchange_runs_g_rings_of_n_over_g_at_once() -> None:
    # HSDP on 2 machines of 4, a shard group a machine: 4 rings of 2 workers, each crossing the link
    terms = across_groups(_allreduce(MB), Shape(nodes=2, workers=8, gbps=1.0), group=4)
    ring = features(_allreduce(MB), Shape(nodes=2, workers=2, gbps=1.0))
    assert terms["rounds"] == ring["rounds"] == terms["delayed_rounds"] == 2
    assert terms["queued"] == 1
    assert terms["cross_s"] == pytest.approx(4 * MB / LINK)  # 4 rings x 2 rounds x 1/2 MB
    assert terms["machine_bytes"] == pytest.approx(4 * ring["machine_bytes"])
    # groups of 2 on machines of 4: 4 replicas, 2 of each on a machine; 2 of the rings share the link
    small = across_groups(_allreduce(MB), Shape(nodes=2, workers=8, gbps=1.0), group=2)
    assert small["rounds"] == 2 * 3
    assert small["cross_s"] == pytest.approx(2 * 1.5 * MB / LINK)
    # one group of all: nothing to exchange
    none = across_groups(_allreduce(MB), Shape(nodes=2, workers=8, gbps=1.0), group=8)
    assert not any(none.values())
