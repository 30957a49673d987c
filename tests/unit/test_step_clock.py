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

    def recycle(self) -> None:
        pass

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


def test_the_unloaded_estimate_takes_the_wire_from_the_clock_and_the_rest_from_cpu_time():
    """A loaded machine stretched the compute's wall time (40 ms for 20 ms of CPU); the estimate of
    an unloaded step is the communication's wall time (15 ms, of which 3 ms CPU of its own) plus the
    CPU time of the rest over the compute threads."""

    class Clock(HostClock):
        now = 0.0

        def mark(self) -> float:
            return self.now / 1e3

    clock, cpu = Clock(), [0.0]
    stats = StepStats(clock)
    stats.cpu_time = lambda: cpu[0]
    stats.begin_step()
    with stats.time("compute"):
        clock.now, cpu[0] = 40.0, 0.020  # 20 ms of CPU in 40 ms of wall time
    with stats.time("comm"):
        clock.now, cpu[0] = 55.0, 0.023  # the wire: 15 ms, 3 ms of them CPU (the transport's)
    with stats.time("optimizer"):
        clock.now, cpu[0] = 65.0, 0.028
    stats.end_step()
    assert stats.ms["step"] == 65.0
    assert stats.unloaded_ms(threads=1) == 15.0 + 25.0  # not 15 + 28: the wire's CPU is in its wall time
    assert stats.unloaded_ms(threads=2) == 15.0 + 12.5
    assert StepStats(EventClock(torch.device("cuda", 0))).unloaded_ms(1) is None  # a GPU's steps: no estimate


def test_the_event_clock_reuses_its_events_step_after_step(monkeypatch):
    """A GPU's phase edges record pooled CUDA events: a new step records the last step's events
    again (after its figures were read) instead of creating new ones."""
    created: list[FakeEvent] = []

    class FakeEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.recorded, self.at = 0, 0.0
            created.append(self)

        def record(self, stream: object = None) -> None:
            self.recorded += 1
            self.at = float(len(created) + sum(e.recorded for e in created))

        def elapsed_time(self, other: FakeEvent) -> float:
            return other.at - self.at

        def synchronize(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    stats = StepStats(EventClock(torch.device("cuda", 0)))
    per_step = []
    for _ in range(3):
        stats.reset()
        stats.begin_step()
        with stats.time("compute"):
            with stats.time("compress"):
                pass
        with stats.time("comm"):
            pass
        stats.end_step()
        assert stats.ms["step"] > 0  # the step's figures, read before the next reset
        per_step.append(len(created))
    assert per_step[0] == per_step[1] == per_step[2] == 8  # eight edges a step, the same eight events
    assert all(e.recorded == 3 for e in created)
