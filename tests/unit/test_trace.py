"""net.trace's parser and schedule (compbench.network.trace): the format's rules, each refusal's
row and fix, the piecewise-constant settings and their time-weighted mean."""

from __future__ import annotations

import pytest

from compbench.network.trace import (
    SHIPPED_DIR,
    Change,
    LinkState,
    load_trace,
    parse_trace,
    resolve,
    shipped,
)

HEAD = "t_s,rank,mbps,delay_ms,loss\n"
THREE_PHASES = (HEAD + "# 200, 20, 200 Mbit/s; rank 1's delay up in the middle\n"
                "0,*,200,1,0\n2,*,20,1,0\n2,1,20,5,0.01  # its own row\n4,*,200,1,0\n")


def test_piecewise_constant_settings_and_schedule():
    trace = parse_trace(THREE_PHASES, 2)
    assert trace.duration_s == 4
    assert trace.at(0, 0) == LinkState(200, 1, 0)
    assert trace.at(1.999, 1) == LinkState(200, 1, 0)
    assert trace.at(2, 0) == LinkState(20, 1, 0)
    assert trace.at(2, 1) == LinkState(20, 5, 0.01)  # its own row overrides the * row at the same time
    assert trace.at(3.5, 1) == LinkState(20, 5, 0.01)
    assert trace.at(100, 1) == LinkState(200, 1, 0)  # after the end the last row holds
    assert trace.changes() == (
        Change(0, 0, LinkState(200, 1, 0)), Change(0, 1, LinkState(200, 1, 0)),
        Change(2, 0, LinkState(20, 1, 0)), Change(2, 1, LinkState(20, 5, 0.01)),
        Change(4, 0, LinkState(200, 1, 0)), Change(4, 1, LinkState(200, 1, 0)))
    assert trace.max_state(1) == LinkState(200, 5, 0.01)


def test_mean_rate_is_time_weighted():
    trace = parse_trace(THREE_PHASES, 2)
    assert trace.mean_mbps(0, 0, 6) == pytest.approx((200 * 2 + 20 * 2 + 200 * 2) / 6)
    assert trace.mean_mbps(0, 1, 3) == pytest.approx((200 + 20) / 2)
    assert trace.mean_mbps(0, 2.5, 3.5) == pytest.approx(20)
    assert trace.mean_mbps(0, 3, 3) == 20
    assert trace.mean_mbps(1, 10, 20) == 200  # beyond the end: the last row


def test_a_repeated_setting_is_no_change():
    trace = parse_trace(HEAD + "0,*,100,0,0\n5,*,100,0,0\n9,0,50,0,0\n", 2)
    assert [(c.t_s, c.rank) for c in trace.changes()] == [(0, 0), (0, 1), (9, 0)]
    assert trace.duration_s == 9


BAD = [
    ("t,rank,mbps,delay_ms,loss\n0,*,1,0,0\n", "row 1: the header is"),
    (HEAD + "0,*,fast,0,0\n", "row 2: mbps='fast' is not a number"),
    (HEAD + "0,*,0,0,0\n", "row 2: mbps=0 must be within"),
    (HEAD + "0,*,-5,0,0\n", "write a failed link as mbps=0.001"),
    (HEAD + "0,*,10,-1,0\n", "row 2: delay_ms=-1 must be within [0, 250] ms"),
    (HEAD + "0,*,10,0,1\n", "row 2: loss=1 must be a rate in [0, 1)"),
    (HEAD + "0,*,10,0,nan\n", "loss=nan is not a finite number"),
    (HEAD + "0,*,10,0,0\n5,*,10,0,0\n3,*,10,0,0\n", "row 4: t_s=3 is before the previous row's 5; sort"),
    (HEAD + "0,0,10,0,0\n1,1,10,0,0\n", "rank(s) 1 have no setting at t_s=0 (a gap"),
    (HEAD + "0,*,10,0,0\n0,2,10,0,0\n", "row 3: rank=2 is beyond the job's 2 worker(s)"),
    (HEAD + "0,*,10,0,0\n0,x,10,0,0\n", "rank='x' must be a worker's rank"),
    (HEAD + "0,*,10,0,0\n0,1,10,0,0\n0,1,20,0,0\n", "row 4: rank 1 is set twice at t_s=0"),
    (HEAD + "0,1,10,0,0\n0,*,10,0,0\n", "put one * row first"),
    (HEAD + "0,*,10,0\n", "row 2: 4 values, expected 5"),
    (HEAD + "-1,*,10,0,0\n", "t_s=-1 is before the start"),
    ("", "the file is empty"),
]


@pytest.mark.parametrize(("body", "says"), BAD, ids=[says for _, says in BAD])
def test_bad_input_names_the_row_and_the_fix(body, says):
    with pytest.raises(ValueError, match="^net.trace=t.csv") as e:
        parse_trace(body, 2, "t.csv")
    assert says in str(e.value)
    assert "\n" not in str(e.value)


def test_files_and_shipped_names(tmp_path):
    path = tmp_path / "link.csv"
    path.write_text(THREE_PHASES)
    assert load_trace(path, 2).at(3, 0).mbps == 20
    assert resolve(str(path)) == path
    with pytest.raises(ValueError, match="no such file"):
        resolve(str(tmp_path / "missing.csv"))
    with pytest.raises(ValueError, match="is not a shipped trace"):
        resolve("nosuchtrace")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not a text file"):
        load_trace(tmp_path / "bin.csv", 2)
    for name in shipped():
        assert resolve(name) == SHIPPED_DIR / f"{name}.csv"


def test_the_shipped_traces_are_what_the_script_makes(tmp_path):
    """scripts/make_traces.py writes the shipped files as they are (its assumptions, deterministic), and
    each loads for 2 workers: the diurnal day in 240 s, the bursts, rank 1's minute of outage."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "make_traces.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True)
    assert shipped() == ("bursts", "diurnal", "outage")
    for name in shipped():
        assert (tmp_path / f"{name}.csv").read_text() == (SHIPPED_DIR / f"{name}.csv").read_text(), name
    day = load_trace(resolve("diurnal"), 2)
    assert day.duration_s == 240 and day.at(0, 0) == day.at(240, 1)
    assert day.at(200, 0) == LinkState(100, 24, 0.001)  # 20:00: the evening peak
    assert day.at(40, 0).mbps == pytest.approx(400)  # 04:00: the quietest
    out = load_trace(resolve("outage"), 2)
    assert out.at(90, 1).mbps == 0.001 and out.at(90, 0).mbps == 100 and out.at(120, 1).mbps == 100
    assert out.mean_mbps(1, 0, 180) == pytest.approx((100 * 120 + 0.001 * 60) / 180)
    with pytest.raises(ValueError, match="rank=1 is beyond the job's 1 worker"):
        load_trace(resolve("outage"), 1)
    rates = {c.state.mbps for c in load_trace(resolve("bursts"), 3).changes()}
    assert max(rates) == 200 and all(40 <= r <= 100 for r in rates - {200}) and len(rates) == 8
