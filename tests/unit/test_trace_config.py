"""net.trace at compose time: every bad trace, and every setting it cannot go with, refused with one
line naming net.trace and the fix (exit 2 from the CLI, nothing written); a good trace composes."""

from __future__ import annotations

import pytest

from compbench.compose import config
from compbench.network.netem import can_shape
from tests.helpers import TINY, compbench

NP2 = "engine.np=2"
HEAD = "t_s,rank,mbps,delay_ms,loss\n"
GOOD = HEAD + "0,*,200,1,0\n2,*,20,1,0\n4,*,200,1,0\n"
needs_root = pytest.mark.skipif(not can_shape(), reason="needs root and iproute2 (a trace shapes the links)")


def _check(tmp_path, body: str | None, *overrides: str):
    path = tmp_path / "link.csv"
    if body is not None:
        path.write_text(body)
    return config.check(config.compose([*TINY, NP2, f"net.trace={path}", *overrides]))


BAD = [
    (None, (), "no such file"),
    ("t_s,rank,mbps\n0,*,1\n", (), "row 1: the header is"),
    (HEAD + "0,*,fast,0,0\n", (), "row 2: mbps='fast' is not a number"),
    (HEAD + "0,*,0,0,0\n", (), "row 2: mbps=0 must be within"),
    (HEAD + "0,*,-20,0,0\n", (), "row 2: mbps=-20 must be within"),
    (HEAD + "0,*,20,-3,0\n", (), "row 2: delay_ms=-3 must be within"),
    (HEAD + "0,*,20,0,1.5\n", (), "row 2: loss=1.5 must be a rate in [0, 1)"),
    (HEAD + "0,*,20,0,0\n9,*,20,0,0\n8,*,20,0,0\n", (), "row 4: t_s=8 is before the previous row's 9"),
    (HEAD + "0,0,20,0,0\n", (), "rank(s) 1 have no setting at t_s=0 (a gap"),
    (HEAD + "0,*,20,0,0\n0,3,20,0,0\n", (), "row 3: rank=3 is beyond the job's 2 worker(s)"),
    (GOOD, ("net.emulate_gbps=1",), "net.trace and net.emulate_gbps both shape the links"),
    (GOOD, ("net.emulate_rank_gbps=[1,1]",), "net.trace and net.emulate_rank_gbps both shape the links"),
    (GOOD, ("net.emulate_latency_us=100",), "net.trace and net.emulate_latency_us both shape the links"),
    (GOOD, ("net.emulate_loss=0.01",), "net.trace and net.emulate_loss both shape the links"),
    (GOOD, ("engine.elastic=true",), "net.trace with engine.elastic=true"),
]


@pytest.mark.parametrize(("body", "overrides", "says"), BAD, ids=[says for _, _, says in BAD])
def test_a_bad_trace_is_one_line_naming_net_trace_and_the_fix(tmp_path, body, overrides, says):
    with pytest.raises(ValueError) as e:
        _check(tmp_path, body, *overrides)
    message = str(e.value)
    assert message.startswith("net.trace") and says in message and "\n" not in message, message


def test_a_name_that_is_not_shipped_lists_the_shipped_ones():
    with pytest.raises(ValueError, match=r"^net.trace=sunday is not a shipped trace \(bursts, diurnal, "
                                         r"outage\)"):
        config.check(config.compose([*TINY, NP2, "net.trace=sunday"]))


@needs_root
def test_a_good_trace_and_the_shipped_ones_compose(tmp_path):
    assert _check(tmp_path, GOOD).net.trace.endswith("link.csv")
    for name in ("diurnal", "bursts", "outage"):
        config.check(config.compose([*TINY, NP2, f"net.trace={name}"]))


def test_the_cli_answers_one_line_exit_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEAD + "0,*,100,0,0\n5,1,-1,0,0\n")
    proc = compbench("train", *TINY, NP2, f"net.trace={bad}", f"output_dir={tmp_path / 'run'}", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: net.trace={bad} row 3: mbps=-1 must be within"), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]  # no run folder, no outputs/
