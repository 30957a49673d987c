"""net.emulate_gbps: a private network namespace with a shaped loopback really limits a job's
throughput, leaves the machine's own loopback alone, and is gone afterwards, also after a failure;
net.emulate_rank_gbps: a link per worker, the slowest bounding a collective, on both engines."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from compbench.launch.processes import run_processes
from compbench.network import netem

ROOT = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
needs_root = pytest.mark.skipif(not ROOT, reason="needs root and iproute2 (ip, tc)")

# Rank 0 writes the median time of a few 8 MB allreduces (after a warm-up one).
ALLREDUCE = """
import json, os, statistics, sys, time
import torch
from compbench.engines.torch_dist import TorchEngine
e = TorchEngine()
x = torch.ones(2 * 1024 * 1024)  # 8 MB of fp32
e.allreduce(x, "warmup")
times = []
for i in range(3):
    t0 = time.perf_counter()
    y = e.allreduce(x, "x")
    times.append(time.perf_counter() - t0)
assert torch.equal(y, x)
if e.rank == 0:
    json.dump({"s": statistics.median(times)}, open(sys.argv[1], "w"))
e.shutdown()
"""

HOROVOD = """
import horovod.torch as hvd, torch
hvd.init()
assert hvd.allreduce(torch.ones(4) * hvd.rank(), op=hvd.Sum).tolist() == [1.0] * 4
hvd.shutdown()
"""


def _host_lo_qdisc() -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout


def _allreduce_seconds(tmp_path, name: str, netns=None) -> float:
    script, out = tmp_path / "allreduce.py", tmp_path / f"{name}.json"
    script.write_text(ALLREDUCE)
    code, message = run_processes([sys.executable, str(script), str(out)], "torch", 2, threads=1, netns=netns)
    assert code == 0, message
    return json.loads(out.read_text())["s"]


@pytest.mark.dist
@needs_root
def test_shaped_namespace_limits_throughput(tmp_path):
    host_lo = _host_lo_qdisc()
    plain = _allreduce_seconds(tmp_path, "plain")
    with netem.shaped(0.1, 2) as ns:
        assert ns.name in netem.list_namespaces()
        shaped = _allreduce_seconds(tmp_path, "shaped", ns)
    # Each rank sends about 8 MB (2 ranks: half in reduce-scatter, half in all-gather) over its own
    # 0.1 Gbit/s: ~0.67 s. Lower bound: the link really is that slow; upper bound: not much slower.
    expected = 8 * 2**20 * 8 / 0.1e9
    assert 0.6 * expected < shaped < 4 * expected, (shaped, expected, plain)
    assert shaped > 5 * plain, (shaped, plain)
    assert ns.name not in netem.list_namespaces()
    assert _host_lo_qdisc() == host_lo  # the machine's own loopback was never touched


@pytest.mark.dist
@needs_root
def test_namespace_removed_after_failure_and_horovod_runs_inside(tmp_path):
    script = tmp_path / "hvd.py"
    script.write_text(HOROVOD)
    with netem.shaped(1.0, 2) as ns:
        # Horovod's rendezvous server is opened inside the namespace, where the workers are.
        code, message = run_processes([sys.executable, str(script)], "horovod", 2, threads=1, netns=ns)
        assert code == 0, message
        code, message = run_processes([sys.executable, "-c", "import sys; sys.exit(3)"], "torch", 2, netns=ns)
        assert code == 1 and "exited with code 3" in message
    assert ns.name not in netem.list_namespaces()
    with pytest.raises(RuntimeError, match="boom"):  # an exception inside the block
        with netem.shaped(1.0, 2) as ns2:
            raise RuntimeError("boom")
    assert ns2.name not in netem.list_namespaces()


@pytest.mark.dist
@needs_root
def test_a_link_per_worker_bounds_a_collective_by_the_slowest_and_horovod_runs_across(tmp_path):
    host_lo = _host_lo_qdisc()
    with netem.RankLinks([1.0, 0.1]) as links:
        assert {links.switch, *links.names} <= set(netem.list_namespaces())
        seconds = _allreduce_seconds(tmp_path, "links", links)
        script = tmp_path / "hvd.py"
        script.write_text(HOROVOD)
        code, message = run_processes([sys.executable, str(script)], "horovod", 2, threads=1, netns=links)
        assert code == 0, message
    # Rank 1 sends about 8 MB over its 0.1 Gbit/s and receives as much through it: ~0.67 s, as the
    # shared link of test_shaped_namespace_limits_throughput at 0.1 per worker; rank 0's 1 Gbit/s
    # does not make it faster.
    expected = 8 * 2**20 * 8 / 0.1e9
    assert 0.6 * expected < seconds < 4 * expected, (seconds, expected)
    assert not {links.switch, *links.names} & set(netem.list_namespaces())
    assert not any((netem.NETNS_ETC / name).exists() for name in links.names)
    assert _host_lo_qdisc() == host_lo


@needs_root
def test_stale_namespaces_of_dead_processes_are_removed():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    name = f"compbench-{dead.pid}-abcdef"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert f"namespace {name}" in netem.remove_stale()
        assert name not in netem.list_namespaces()
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def test_checks_name_the_fix(monkeypatch):
    netem.check(None, 0)  # no shaping: nothing to check
    with pytest.raises(ValueError, match="must be a number of Gbit/s > 0"):
        netem.check(-1)
    with pytest.raises(ValueError, match="needs net.emulate_gbps too"):
        netem.check(None, 100)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    message = r"^net.emulate_gbps needs root \(run as root or drop net.emulate_gbps\)$"
    with pytest.raises(ValueError, match=message):
        netem.check(1.0)
    with pytest.raises(ValueError, match=r"net.emulate_rank_gbps=\[1\] must be a list of 2 rates"):
        netem.check(None, 0, [1], 2)
    with pytest.raises(ValueError, match=r"net.emulate_rank_gbps\[1\]=0 must be a number of Gbit/s > 0"):
        netem.check(None, 0, [1, 0], 2)
    with pytest.raises(ValueError, match="are two ways to shape the links; set one of them"):
        netem.check(1.0, 0, [1, 1], 2)
    with pytest.raises(ValueError, match=r"^net.emulate_rank_gbps needs root"):
        netem.check(None, 0, [1, 1], 2)
