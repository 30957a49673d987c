"""StepStats on any clock (compbench.records.stats): phases pause one another and add up to the step, the
communication and decoding inside an exposed span count as exposed too, and a GPU clock's marks are
read once, when the step's figures are. A scripted clock stands in for CUDA events (marks resolved
late) and makes every span exact."""

from __future__ import annotations

import torch

from compbench.records.stats import EventClock, HostClock, StepStats, SyncClock, clock_for


class ScriptedClock:
    """Marks are the times it is told; `settle` records that the step's figures were read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.settled = 0

    def mark(self) -> float:
        return self.now

    def elapsed_ms(self, a: float, b: float) -> float:
        assert self.settled, "a mark read before the clock settled"
        return b - a

    def settle(self, last: float) -> None:
        self.settled += 1


def test_the_phases_pause_each_other_and_add_up_to_the_step():
    clock = ScriptedClock()
    stats = StepStats(clock)
    stats.begin_step()
    stats.begin("compute")
    clock.now = 10
    stats.begin("compress")  # a backward hook compresses inside compute: compute pauses
    clock.now = 13
    stats.end("compress")
    clock.now = 20
    stats.end("compute")
    with stats.time("comm", exposed=True):  # the step waits for it
        clock.now = 25
        with stats.time("decompress"):
            clock.now = 27
        clock.now = 30
    clock.now = 34
    stats.end_step()
    ms = stats.ms
    assert clock.settled == 1
    assert dict(ms) == {"compute": 17, "compress": 3, "comm": 8, "decompress": 2, "comm_exposed": 10,
                        "step": 34}
    assert ms["step"] - sum(ms[p] for p in ("compute", "compress", "comm", "decompress")) == 4  # other
    assert stats.ms is ms and clock.settled == 1  # read once per step


def test_a_span_not_exposed_books_no_exposed_time():
    clock = ScriptedClock()
    stats = StepStats(clock)
    with stats.time("comm"):
        clock.now = 5
    assert stats.ms["comm"] == 5 and stats.ms["comm_exposed"] == 0


def test_the_device_picks_its_clock():
    assert isinstance(clock_for(torch.device("cpu")), HostClock)
    assert isinstance(clock_for(torch.device("cuda", 0)), EventClock)
    assert isinstance(clock_for(torch.device("cuda", 0), "sync"), SyncClock)
