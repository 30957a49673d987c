"""Every phase against its floor (compbench.records.floors), and the frames that carry an uneven payload in
one collective (compbench.engines.wire)."""

import pytest
import torch

from compbench.compressors import build_compressor
from compbench.engines import wire
from compbench.records.floors import (
    format_floors,
    measure_sampled_read_ns,
    optimizer_passes,
    phase_floors,
    wire_ms,
)

SUMMARY = {"compute_ms": 30.0, "compress_ms": 8.0, "comm_exposed_ms": 3.0, "decompress_ms": 2.0,
           "optimizer_ms": 12.0, "other_ms": 1.0, "bytes_sent_per_step": 125_000 + 16_000,
           "bytes_dense_per_step": 64e6 + 16_000, "bytes_allreduce_per_step": 16_000}


def test_optimizer_passes_count_the_state_it_reads_and_writes():
    assert optimizer_passes({"name": "sgd", "momentum": 0.0}) == 3
    assert optimizer_passes({"name": "sgd", "momentum": 0.9}) == 5
    assert optimizer_passes({"name": "adamw"}) == optimizer_passes({"name": "adam"}) == 7
    assert optimizer_passes({"name": "lion"}) is None


def test_wire_time_by_pattern():
    # 2 workers at 1 Gbit/s: the allgather's payload once, the dense allreduce's 2(N-1)/N = 1 times
    assert wire_ms(SUMMARY, 2, "allgather", 1.0) == pytest.approx(141_000 * 8 / 1e9 * 1e3)
    # 4 workers: 3 payloads through each link, 1.5 times the dense part
    assert wire_ms(SUMMARY, 4, "allgather", 1.0) == pytest.approx((3 * 125_000 + 1.5 * 16_000) * 8e-6)
    assert wire_ms(SUMMARY, 4, "allreduce", 1.0) == pytest.approx(1.5 * 141_000 * 8e-6)
    assert wire_ms(SUMMARY, 2, "allgather", None) is None


def test_phase_floors_price_passes_at_the_read_pass():
    floors = phase_floors(SUMMARY, world_size=2, read_gbps=10.0, link_gbps=1.0, memory_passes=2,
                          optim={"name": "sgd", "momentum": 0.9}, pattern="allgather")
    p = floors["phases"]
    assert p["compress"]["floor_ms"] == pytest.approx(3 * 64e6 / 10e9 * 1e3)  # encode + residual's 2
    assert p["decompress"]["floor_ms"] == pytest.approx(64e6 / 10e9 * 1e3)
    assert p["optimizer"]["floor_ms"] == pytest.approx(5 * (64e6 + 16_000) / 10e9 * 1e3)
    assert p["comm_exposed"]["floor_ms"] == pytest.approx(141_000 * 8e-6)
    assert p["compute"]["floor_ms"] is None and p["other"]["floor_ms"] == 0.0
    assert p["compress"]["x_floor"] == pytest.approx(8.0 / 19.2)
    lines = format_floors(floors)
    assert "read pass 10.0 GB/s, link 1 Gbit/s" in lines[0] and len(lines) == 7
    assert any(line.split()[:2] == ["exposed", "comm"] for line in lines)


def test_a_uniform_sample_adds_its_reads_to_the_compress_floor():
    kw = dict(world_size=2, read_gbps=10.0, link_gbps=1.0, memory_passes=0,
              optim={"name": "sgd", "momentum": 0.0}, pattern="allgather")
    plain = phase_floors(SUMMARY, **kw)
    sampled = phase_floors({**SUMMARY, "sampled_reads_per_step": 160_000}, sampled_read_ns=4.0, **kw)
    assert sampled["phases"]["compress"]["floor_ms"] == pytest.approx(
        plain["phases"]["compress"]["floor_ms"] + 160_000 * 4.0 / 1e6)
    assert "160,000 sampled reads at 4 ns" in sampled["phases"]["compress"]["basis"]
    assert "sampled read 4 ns" in format_floors(sampled)[0]
    assert plain["sampled_read_ns"] is None and "sampled" not in format_floors(plain)[0]


def test_the_sampled_read_is_priced_per_element():
    ns = measure_sampled_read_ns(32 << 20, 80_000)
    assert 0 < ns < 1e4  # a cache miss costs around 100 ns at most; sorted, a few
    assert measure_sampled_read_ns(32 << 20, 0) > 0  # at least one read


@pytest.mark.parametrize("name, kwargs, n, reads", [
    ("dragonn", {"ratio": 1e-3}, 16_777_216, 167_773),  # 1% of the tensor
    ("dragonn", {"ratio": 1e-3}, 4096, 3200),  # a small tensor: ratio 0.01, at least 32 / 0.01 samples
    ("dragonn", {"ratio": 1e-3}, 3000, 0),  # the whole tensor: an exact threshold, no sample
    ("graddrop", {"ratio": 1e-2}, 1_000_000, 10_000),
    ("graddrop", {"ratio": 1e-2}, 150, 0),
])
def test_compressors_declare_the_reads_of_their_uniform_sample(name, kwargs, n, reads):
    comp = build_compressor(name, **kwargs)
    assert comp.caps.random_sample and comp.sampled_reads(n) == reads
    assert not build_compressor("dgc", ratio=1e-3).caps.random_sample  # strided: inside its one pass


@pytest.mark.parametrize("header", [True, False])
def test_frames_round_trip_views_at_any_offset(header):
    payload = [torch.arange(5, dtype=torch.uint8), torch.randn(7),
               torch.arange(6, dtype=torch.int64).view(3, 2), torch.tensor([2.5], dtype=torch.float64)]
    blob = wire.frame(payload, header)
    assert blob.dtype == torch.uint8
    assert blob.numel() == sum(t.numel() * t.element_size() for t in payload) + (16 if header else 0)
    # two frames back to back, the second at an odd offset, then padding
    both = torch.cat([blob, blob, torch.zeros(9, dtype=torch.uint8)])
    first, length = wire.unframe(both, payload, header)
    second, _ = wire.unframe(both[length:], payload, header)
    assert length == blob.numel()
    for got in (first, second):
        for a, b in zip(got, payload, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if header:
        rows = torch.stack([both[:length], both[length : 2 * length]])
        dims = wire.read_headers(rows, payload)  # both frames' headers in one read
        assert dims[0] == dims[1] == [t.shape[0] if t.dim() else 1 for t in payload]
        assert wire.frame_length(dims[1], payload) == length
        again, _ = wire.unframe(both[length:], payload, header, dims[1])
        assert all(torch.equal(a, b) for a, b in zip(again, payload, strict=True))


def test_a_bucket_frame_is_cut_into_views_without_copies():
    # a bucket's payload: values and indices of odd lengths in turn (a payload-ordered body would put
    # every int64 after an odd number of float32s at an offset it cannot be viewed at)
    payload = [t for k in (3, 5, 8, 1) for t in (torch.randn(k), torch.arange(k, dtype=torch.int64))]
    payload += [torch.randn(2, 3).half(), torch.ones((), dtype=torch.float16)]  # 10: a header of 40 bytes
    blob = wire.frame(payload, header=True)
    got, length = wire.unframe(blob, payload, header=True)
    assert length == blob.numel()
    start, end = blob.data_ptr(), blob.data_ptr() + blob.numel()
    for a, b in zip(got, payload, strict=True):
        assert torch.equal(a, b) and a.shape == b.shape
        assert start <= a.data_ptr() < end  # a view of the received bytes, not a copy
    # after a header of 4 x 9 bytes the int64s cannot be viewed: their group is copied, once
    odd = payload[:-1]
    assert all(torch.equal(a, b) for a, b in zip(wire.unframe(wire.frame(odd, True), odd, True)[0], odd,
                                                 strict=True))


def test_a_sparse_hand_over_reads_what_it_received_instead_of_writing_a_dense_gradient():
    kw = dict(world_size=2, read_gbps=10.0, link_gbps=1.0, memory_passes=2,
              optim={"name": "sgd", "momentum": 0.9}, pattern="allgather")
    half = phase_floors(SUMMARY, handed_over=32e6, **kw)["phases"]["decompress"]
    # half the compressed bytes still decoded densely, the other half: its share of the 2 x 125 kB received
    assert half["floor_ms"] == pytest.approx((32e6 + 2 * 125_000 / 2) / 10e9 * 1e3)
    assert "received" in half["basis"]
    whole = phase_floors(SUMMARY, handed_over=1e12, **kw)["phases"]["decompress"]  # capped at the compressed
    assert whole["floor_ms"] == pytest.approx(2 * 125_000 / 10e9 * 1e3)
