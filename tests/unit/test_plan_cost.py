"""SeCoPa's cost model against hand-computed cases (ALGORITHMS.md, HiPress section), the plan file
format, and the line fits."""

import math

import pytest

from compbench.schedulers.secopa_cost import (
    Line,
    Primitives,
    decide,
    ps_compressed,
    ps_dense,
    read_plan,
    ring_compressed,
    ring_dense,
    write_plan,
)
from compbench.schedulers.secopa_fit import fit_line, net_lines

# Small integer lines so that every case below is easy to check by hand.
# enc(x) = 2x + 1, dec(y) = max(5, y), aggr(x) = x, gather(x) = bcast(x) = 3x + 10, send(x) = x + 4.
P = Primitives(enc=Line(2, 1), dec=Line(1, 0, overhead=5), aggr=Line(1), gather=Line(3, 10),
               bcast=Line(3, 10), send=Line(1, 4))
# The same with a slow network: gather(x) = bcast(x) = 100x + 10.
SLOW = Primitives(enc=P.enc, dec=P.dec, aggr=P.aggr, gather=Line(100, 10), bcast=Line(100, 10), send=P.send)
S, N, RHO = 12, 3, 0.5


def test_line_is_max_of_overhead_and_affine():
    assert Line(2, 1)(3) == 7
    assert Line(1, 0, overhead=5)(3) == 5
    assert Line(1, 0, overhead=5)(6) == 6


@pytest.mark.parametrize("k, expected", [
    # gather(12/K) + bcast(12/K) + 2*aggr(12/K)
    (1, 46 + 46 + 24),
    (2, 28 + 28 + 12),
    (3, 22 + 22 + 8),
])
def test_ps_dense(k, expected):
    assert ps_dense(S, k, N, P) == expected


@pytest.mark.parametrize("k, expected", [
    # gather(6) + bcast(6) + min(2,3)*enc(12) + min(3,4)*dec(6) + 2*aggr(12)
    (1, 28 + 28 + 2 * 25 + 3 * 6 + 24),
    # gather(3) + bcast(3) + min(3,3)*enc(6) + min(4,4)*dec(3)=max(5,3) + 2*aggr(6)
    (2, 19 + 19 + 3 * 13 + 4 * 5 + 12),
    # gather(2) + bcast(2) + min(4,3)*enc(4) + min(5,4)*dec(2) + 2*aggr(4)
    (3, 16 + 16 + 3 * 9 + 4 * 5 + 8),
])
def test_ps_compressed(k, expected):
    assert ps_compressed(S, k, N, RHO, P) == expected


@pytest.mark.parametrize("k, expected", [
    (1, 4 * 16 + 24),   # 2(N-1)*send(12) + (N-1)*aggr(12)
    (2, 4 * 10 + 12),
    (3, 4 * 8 + 8),
])
def test_ring_dense(k, expected):
    assert ring_dense(S, k, N, P) == expected


@pytest.mark.parametrize("k, expected", [
    (1, 4 * 10 + 3 * 25 + 3 * 6 + 24),  # 2(N-1)*send(6) + N*enc(12) + N*dec(6) + (N-1)*aggr(12)
    (2, 4 * 7 + 3 * 13 + 3 * 5 + 12),
    (3, 4 * 6 + 3 * 9 + 3 * 5 + 8),
])
def test_ring_compressed(k, expected):
    assert ring_compressed(S, k, N, RHO, P) == expected


def test_fast_network_keeps_it_dense_with_the_best_dense_k():
    d = decide("w", S, N, "ps", P, lambda m: RHO)
    assert (d.compress, d.k, d.dense_s, d.k_dense, d.compressed_s, d.k_compressed) == (False, 3, 52, 3, 87, 3)
    assert d.line() == "w,12,n,3"
    r = decide("w", S, N, "ring", P, lambda m: RHO)
    assert (r.compress, r.k, r.dense_s, r.compressed_s) == (False, 3, 40, 74)


def test_slow_network_compresses():
    # gather(x) = bcast(x) = 100x + 10: dense K=3 costs 410+410+8; compressed K=3 costs 210+210+27+20+8.
    d = decide("fc", S, N, "ps", SLOW, lambda m: RHO)
    assert (d.compress, d.k, d.dense_s, d.compressed_s) == (True, 3, 828, 475)
    assert d.line() == "fc,12,y,3"


def test_expensive_encode_prefers_fewer_partitions():
    # A fixed 100 per encode: PS encodes min(K+1, N) times, 2 for K=1 and 3 for K=2, 3. With a small
    # payload (rho=0.01) and free aggregation, K=1 wins although the network alone favours K=3.
    costly = Primitives(enc=Line(0, 0, overhead=100), dec=P.dec, aggr=Line(0), gather=Line(100, 10),
                        bcast=Line(100, 10), send=P.send)
    s = 48
    # K=1: 2*(100*0.48+10) + 2*100 + 3*5 = 331; K=2: 2*(100*0.24+10) + 300 + 4*5 = 388;
    # K=3: 2*(100*0.16+10) + 300 + 4*5 = 372
    costs = [ps_compressed(s, k, N, 0.01, costly) for k in (1, 2, 3)]
    assert [round(c, 9) for c in costs] == [331, 388, 372]
    d = decide("fc", s, N, "ps", costly, lambda m: 0.01)
    assert (d.compress, d.k) == (True, 1) and math.isclose(d.compressed_s, 331)


def test_ties_keep_the_smaller_k_and_selection_rules_hold():
    flat = Primitives(*(Line(0, 0, overhead=1) for _ in range(6)))
    assert decide("t", 100, 4, "ring", flat, lambda m: 0.1).k_dense == 1
    slow = SLOW
    assert not decide("b", S, N, "ps", slow, lambda m: RHO, allowed=False).compress   # min_dims said no
    limited = decide("fc", S, N, "ps", slow, lambda m: RHO, min_partition=5)           # parts must keep > 5
    assert limited.compress and limited.k == 2
    assert not decide("w", S, 1, "ps", slow, lambda m: RHO).compress                  # one worker
    with pytest.raises(ValueError, match="comm=ps or comm=ring"):
        decide("w", S, N, "allgather", P, lambda m: RHO)


def test_plan_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "plan.csv"
    write_plan(path, [decide("a.weight", S, N, "ps", P, lambda m: RHO)])
    assert path.read_text() == "a.weight,12,n,3\n"
    assert read_plan(path)["a.weight"].k == 3
    path.write_text("# comment\n\nx,10,y,2\n")
    line = read_plan(path)["x"]
    assert (line.numel, line.compress, line.k) == (10, True, 2)
    for bad in ("x,10,maybe,2\n", "x,10,y,0\n", "x,ten,y,2\n", "x,10,y,2\nx,10,n,1\n"):
        path.write_text(bad)
        with pytest.raises(ValueError, match="plan.csv"):
            read_plan(path)
    with pytest.raises(ValueError, match="does not exist"):
        read_plan(tmp_path / "missing.csv")


def test_fit_line_recovers_a_line_and_net_model():
    xs = [1e3, 1e4, 1e5, 1e6]
    line = fit_line(xs, [2e-6 + 3e-9 * x for x in xs])
    assert math.isclose(line.w, 3e-9, rel_tol=1e-6) and math.isclose(line.b, 2e-6, rel_tol=1e-6)
    assert math.isclose(line.overhead, 5e-6)
    assert fit_line(xs, [5.0, 4.0, 3.0, 2.0]).w == 0.0  # decreasing noise: a constant, never a negative slope
    net = net_lines(gbps=8, latency_us=10, world=3)    # 1 GB/s: 4 ns per float, 2 peers
    assert math.isclose(net["send"](1e6), 10e-6 + 4e-3)
    assert math.isclose(net["gather"](1e6), 10e-6 + 8e-3)
    with pytest.raises(ValueError, match="net.gbps"):
        net_lines(gbps=0, latency_us=10, world=3)
