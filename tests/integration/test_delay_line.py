"""compbench's delay line (compbench.network.delay_line, .delay): latency without the kernel's netem.
The line's arithmetic (order kept under jitter, loss at its rate) without root; with root, a ping-pong
through a job's links takes at least its round trip, a training job runs through the line, a line that
dies ends the job with one line, and nothing (namespace, process) is left behind."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest

from compbench.network import delay, probes
from compbench.network.delay import Impairment
from compbench.network.delay_line import Line
from compbench.network.netem import RankLinks, can_shape, list_namespaces
from tests.helpers import TINY, compbench, start_compbench

needs_line = pytest.mark.skipif(not (can_shape() and delay.has_tun()),
                                reason="needs root, iproute2 and /dev/net/tun")

A, B = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])


def _packet(src: bytes, dst: bytes, n: int) -> bytes:
    return bytes([0x45]) + bytes(11) + src + dst + n.to_bytes(4, "big")


def test_the_line_holds_each_packet_for_both_links_and_keeps_order_under_jitter():
    line = Line({A: 0.010, B: 0.005}, jitter_s=0.004, seed=1)
    for n in range(200):
        line.hold(_packet(A, B, n), now=n * 1e-4)
    assert not line.due(0.0109)  # 15 ms less the jitter's 4 ms: nothing before 11 ms
    out = line.due(1.0)
    assert [int.from_bytes(p[20:24], "big") for p in out] == list(range(200))  # in order
    assert len(out) == 200


def test_the_line_drops_at_its_loss_rate():
    n, rate = 20000, 0.05
    line = Line({A: 0.0}, loss=rate, seed=3)
    for i in range(n):
        line.hold(_packet(A, B, i), now=0.0)
    kept = len(line.due(0.0))
    bound = 4 * math.sqrt(n * rate * (1 - rate))  # 4 standard deviations of the binomial
    assert abs((n - kept) - n * rate) <= bound


def test_other_packets_pass_at_once():
    line = Line({A: 1.0})
    line.hold(bytes([0x60]) + bytes(39), now=5.0)  # IPv6
    assert len(line.due(5.0)) == 1


def _ping(latency_us: float, n: int = 20) -> tuple[float, float]:
    """(median, min) round trip in seconds between two workers' links through the line (bridged,
    without it, at 0)."""
    line = Impairment(latency_us, mode="line") if latency_us else None
    with RankLinks([1.0, 1.0], latency_us, line=line) as links:
        rtts = probes.round_trips(links, n)
    return statistics.median(rtts), min(rtts)


def _left_behind() -> tuple[list[str], str]:
    mine = [n for n in list_namespaces() if n.startswith(f"compbench-{os.getpid()}-")]
    procs = subprocess.run(["pgrep", "-f", "compbench.network.delay_line"], capture_output=True, text=True)
    return mine, procs.stdout.strip()


@pytest.mark.dist
@needs_line
def test_a_round_trip_through_the_line_takes_at_least_twice_the_delay_and_nothing_is_left():
    _, low = _ping(10_000)
    assert low >= 0.020  # a packet each way held for 10 ms: never faster (an upper bound is the slow tier's)
    assert _left_behind() == ([], "")


@pytest.mark.slow
@needs_line
def test_the_round_trip_is_twice_the_delay_within_5_percent_and_50_us():
    base, _ = _ping(0.0)  # no line: the link's own round trip
    for latency_us in (100, 1000, 20_000, 200_000):
        median, _ = _ping(latency_us, n=10 if latency_us > 50_000 else 20)
        want = 2 * latency_us / 1e6
        assert abs(median - base - want) <= 0.05 * want + 50e-6, (latency_us, median, base)


@pytest.mark.slow
@needs_line
def test_a_bulk_transfer_with_50_ms_each_way_fills_a_gigabit_link():
    """TCP's window grows to the bandwidth-delay product (12.5 MB) because the job's namespaces get the
    buffers for it (compbench.network.netem.size_socket_buffers)."""
    with RankLinks([1.0, 1.0], 50_000, line=Impairment(50_000, mode="line")) as links:
        rate, _ = probes.bulk_gbps(links, seconds=14.0, settle=5.0)
    assert rate >= 0.9, rate


@pytest.mark.slow
@needs_line
def test_the_line_drops_datagrams_at_its_rate_within_a_binomial_bound():
    n, rate = 5000, 0.05
    with RankLinks([1.0, 1.0], 100, line=Impairment(100, loss=rate, mode="line", seed=7)) as links:
        lost = n - probes.received(links, n)
    assert abs(lost - n * rate) <= 3.29 * math.sqrt(n * rate * (1 - rate)), lost


def _train_through_the_line(out, *settings: str):
    """A short TINY job of 2 torch workers on a shaped 1 Gbit/s link with `settings` (its delay)."""
    return compbench("train", *TINY, "eval_points=1", "checkpoint=false", "engine.np=2", "engine=torch",
                     *(["net.emulate_gbps=1"] if not any("rank_gbps" in s for s in settings) else []),
                     *settings, f"output_dir={out}")


@pytest.mark.dist
@needs_line
def test_a_job_trains_through_the_line_and_each_step_waits_a_round_trip(tmp_path):
    out = tmp_path / "run"
    proc = _train_through_the_line(out, "max_steps=6", "net.emulate_latency_us=5000", "net.delay_line=line")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "through compbench's delay line" in proc.stdout
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["comm_exposed_ms"] >= 10.0  # an allreduce waits at least one round trip of 2 x 5 ms
    assert _left_behind() == ([], "")


@pytest.mark.dist
@needs_line
def test_a_line_that_dies_ends_the_job_with_one_line(tmp_path):
    out = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "compbench", "train", *TINY, "max_steps=100000",
                            "epochs=1000", "checkpoint=false", "engine.np=2", "engine=torch",
                            "net.emulate_gbps=1", "net.emulate_latency_us=2000", "net.delay_line=line",
                            f"output_dir={out}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out / "tb").exists():
            time.sleep(0.2)
        pids = subprocess.run(["pgrep", "-f", "compbench.network.delay_line"], capture_output=True,
                              text=True).stdout.split()
        assert pids, "no delay line running"
        for pid in pids:
            os.kill(int(pid), signal.SIGKILL)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 1
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "the delay line of" in lines[0] and "ended" in lines[0], err[-2000:]
    assert _left_behind() == ([], "")


@pytest.mark.dist
@needs_line
def test_ctrl_c_leaves_no_namespace_line_or_worker_behind(tmp_path):
    out = tmp_path / "run"
    job = start_compbench("train", *TINY, "max_steps=100000", "epochs=1000", "checkpoint=false",
                          "engine.np=2", "engine=torch", "net.emulate_gbps=1", "net.emulate_latency_us=2000",
                          "net.delay_line=line", f"output_dir={out}")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out / "tb").exists():
            time.sleep(0.2)
        assert _left_behind()[1], "no delay line running"
        os.killpg(job.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130
    workers = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.strip()
    assert _left_behind() == ([], "") and workers == ""


@needs_line
def test_each_workers_link_delays_by_its_own_amount():
    """Workers 1 ms and 4 ms away from the switch: a round trip between them crosses both links twice,
    so no round trip is faster than 10 ms (one link's delay alone would give 2 or 8 ms). How close the
    fastest comes to 10 ms is the line's fidelity, which needs the cores: the slow tier's bound below
    (beside two busy loops per core every one of 60 trips came out 1-14 ms long)."""
    with RankLinks([1.0, 1.0], line=Impairment(rank_latency_us=(1000.0, 4000.0)),
                   rank_latency_us=[1000.0, 4000.0]) as links:
        rtts = probes.round_trips(links, 20)
    assert min(rtts) >= 0.010, rtts
    assert _left_behind() == ([], "")


@pytest.mark.slow
@needs_line
def test_the_fastest_round_trip_over_two_links_of_their_own_delays_is_within_half_a_millisecond():
    """The fidelity of the per-link delays on a machine nobody else loads: the fastest of 60 round
    trips at most 0.5 ms above the 10 ms of two links of 1 and 4 ms each way."""
    with RankLinks([1.0, 1.0], line=Impairment(rank_latency_us=(1000.0, 4000.0)),
                   rank_latency_us=[1000.0, 4000.0]) as links:
        rtts = probes.round_trips(links, 60)
    assert 0.010 <= min(rtts) <= 0.0105, rtts


@pytest.mark.dist
@needs_line
def test_a_job_runs_on_links_of_their_own_delays(tmp_path):
    out = tmp_path / "run"
    proc = _train_through_the_line(out, "max_steps=3", "net.emulate_rank_gbps=[1,1]",
                                   "net.emulate_rank_latency_us=[500,2500]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = "one-way delays of rank 0 500, rank 1 2500 us per link through compbench's delay line"
    assert said in proc.stdout
    assert json.loads((out / "results.json").read_text())["summary"]["comm_exposed_ms"] >= 6.0  # 2 x 3 ms


RANK_LINKS = ["net.emulate_gbps=null", "net.emulate_rank_gbps=[1,1]"]


@needs_line
@pytest.mark.parametrize(("settings", "message"), [
    (["net.emulate_rank_latency_us=[10,10]"],
     "net.emulate_rank_latency_us is the delay of each worker's own link; set net.emulate_rank_gbps=[1,1] "
     "too (a link per worker)"),
    ([*RANK_LINKS, "net.emulate_rank_latency_us=[10]"],
     "net.emulate_rank_latency_us=[10] must be a list of 2 one-way delays in microseconds, one per worker "
     "of engine.np=2"),
    ([*RANK_LINKS, "net.emulate_rank_latency_us=[10,-1]"],
     "net.emulate_rank_latency_us[1]=-1 must be >= 0 microseconds"),
    ([*RANK_LINKS, "net.emulate_rank_latency_us=[10,10]", "net.emulate_latency_us=5"],
     "net.emulate_latency_us (one delay between any two workers) and net.emulate_rank_latency_us (a delay "
     "per worker's link) are two ways to delay the links; set one of them"),
    ([*RANK_LINKS, "net.emulate_rank_latency_us=[10,20]", "net.emulate_jitter_us=40"],
     "net.emulate_jitter_us=40 must be within [0, the shortest delay between two workers, 30 us]"),

    (["net.emulate_latency_us=1000", "net.delay_line=fast"],
     "net.delay_line=fast must be one of auto, netem, line (auto: netem where the kernel has it, else "
     "compbench's delay line)"),
    (["net.emulate_latency_us=10", "net.emulate_jitter_us=20"],
     "net.emulate_jitter_us=20 must be within [0, net.emulate_latency_us=10]: packets keep their order, so a "
     "delay varies by at most itself"),
    (["net.emulate_jitter_us=-1"], "net.emulate_jitter_us=-1 must be within [0, net.emulate_latency_us=0]"),
    (["net.emulate_loss=1"], "net.emulate_loss=1 must be a rate in [0, 0.2], e.g. net.emulate_loss=0.01"),
    (["net.emulate_loss=-0.1"], "net.emulate_loss=-0.1 must be a rate in [0, 0.2]"),
    (["net.emulate_latency_us=100", "net.emulate_loss=0.1", "net.delay_line=netem"],
     "net.emulate_jitter_us and net.emulate_loss come from compbench's delay line (netem's jitter reorders "
     "packets); set net.delay_line=auto or line"),
    (["net.emulate_gbps=null", "net.emulate_loss=0.1"],
     "net.emulate_jitter_us and net.emulate_loss need a shaped link: set net.emulate_gbps (and "
     "net.emulate_latency_us for jitter)"),
])
def test_a_bad_delay_setting_is_one_line(tmp_path, settings, message):
    proc = compbench("train", *TINY, "net.emulate_gbps=1", *settings, f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {message}"), line
    assert not (tmp_path / "run").exists()


@pytest.mark.dist
@needs_line
def test_jitter_and_loss_reach_the_line(tmp_path):
    out = tmp_path / "run"
    proc = _train_through_the_line(out, "max_steps=3", "net.emulate_latency_us=2000",
                                   "net.emulate_jitter_us=500", "net.emulate_loss=0.001")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2000 us one-way delay +- 500 us, 0.001 loss through compbench's delay line" in proc.stdout


@needs_line
def test_netem_forced_where_the_kernel_has_none_is_one_line(tmp_path):
    if delay.has_netem():
        pytest.skip("this kernel has netem")
    proc = compbench("train", *TINY, "net.emulate_gbps=1", "net.emulate_latency_us=1000",
                     "net.delay_line=netem", f"output_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: net.delay_line=netem: this kernel has no netem qdisc (sch_netem); use net.delay_line=auto or "
        "line (compbench's delay line in user space)"]
    assert not (tmp_path / "run").exists()
