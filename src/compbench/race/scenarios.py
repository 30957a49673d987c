"""The race's fault scenarios as data (`compbench race --faults NAME,...`): what each injects into a
run (the `fault` group's settings, compbench.train.faults, and engine.elastic where a worker dies),
what it needs of a method, and what the what-if model takes of it (compbench.race.under_fault).

- `none`: no fault (the default; a run's folder keeps its name without a scenario).
- `straggler3x`: rank 1 computes 3x as long each step (fault=straggler fault.slow_rank=1
  fault.slow_factor=3): a lock-step exchange waits for it; a quorum need not.
- `kill-rejoin`: rank 1 dies at step 60 (SIGKILL, its machine with it) and a replacement joins 30
  steps later (fault=kill fault.at_step=60 fault.rejoin_after_steps=30, engine.elastic=true: the
  survivors go on from their last commit, compbench.train.elastic).
- `dropout`: every worker but rank 0 drops out at a step with probability 1/90 (seeded: the same
  seed, the same drop-outs), each back 10 steps later (fault.kill_prob, fault.rejoin_after_steps,
  engine.elastic=true): on 2 workers a peer drops out once every 90 steps on average, 3 rounds of
  the DiLoCo family's H=30. The fault plan has no kill "every N rounds" (fault.kill_rank kills once
  per run): the drop-outs come at random, at that mean rate, not on a period.

A scenario that kills needs a method that survives a change of its workers: engine.elastic=true,
which the method's synchronization mode and communicator declare (SyncTraits.elastic,
CommTraits.elastic) and a sharded model refuses (its shards are fixed to its workers). A scenario
names the workers it needs (a rank 1 to slow or kill: 2 or more). A method that cannot run under a
scenario is not run under it: the race lists it as such with the reason (race.md's fault section
and the command's output), and refuses a method named with --only that cannot (a method asked for
by name is not left out silently).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NONE = "none"


@dataclass(frozen=True)
class Scenario:
    """A fault scenario: its name (in folders and tables), what it is in words, its overrides, and
    what it needs of a method: `elastic` (a worker dies: engine.elastic=true) and `min_workers`."""

    name: str
    text: str
    overrides: tuple[str, ...]
    elastic: bool = False
    min_workers: int = 1
    slow_factor: float = 1.0  # the straggler's, for the what-if (compbench.race.under_fault); 1: none


SCENARIOS = {s.name: s for s in (
    Scenario(NONE, "no fault", ()),
    Scenario("straggler3x", "one worker 3x slower (rank 1)",
             ("fault=straggler", "fault.slow_rank=1", "fault.slow_factor=3"), min_workers=2, slow_factor=3.0),
    Scenario("kill-rejoin", "one worker killed at step 60, a replacement 30 steps later (rank 1)",
             ("fault=kill", "fault.kill_rank=1", "fault.at_step=60", "fault.rejoin_after_steps=30",
              "engine.elastic=true"), elastic=True, min_workers=2),
    Scenario("dropout", "a peer drops out at random once every 90 steps on average, back 10 steps later",
             ("fault=kill", "fault.kill_rank=null", "fault.at_step=null", f"fault.kill_prob={1 / 90:.6f}",
              "fault.rejoin_after_steps=10", "engine.elastic=true"), elastic=True, min_workers=2),
)}
FAULT_KEYS = ("fault", "fault.")  # the scenarios' to set: a `fault` override beside them is refused
ELASTIC_KEY = "engine.elastic"


def parse_faults(text: str) -> tuple[Scenario, ...]:
    """--faults NAME,...: known scenarios, each once (ValueError of one line naming the fix)."""
    items = [x.strip() for x in text.split(",")]
    choose = ", ".join(f"{s.name} ({s.text})" for s in SCENARIOS.values())
    unknown = [x for x in items if x not in SCENARIOS]
    if unknown:
        raise ValueError(f"--faults {text}: unknown scenario {unknown[0] or '(an empty item)'}; choose from "
                         f"{choose}, e.g. --faults none,straggler3x")
    twice = next((x for i, x in enumerate(items) if x in items[:i]), None)
    if twice is not None:
        raise ValueError(f"--faults {text} names {twice} twice; give each once")
    return tuple(SCENARIOS[x] for x in items)


@dataclass(frozen=True)
class Parts:
    """What a method's run is made of, as its composed config picked it: what a scenario reads."""

    workers: int
    sync: str
    comm: str
    sharding: str
    per_worker: bool = False  # its mode's SyncTraits.per_worker_key is set (steps per worker)


def why_not(parts: Parts, scenario: Scenario) -> str | None:
    """Why a method of these parts cannot run under `scenario` (None: it can), from what its parts
    declare (compbench.catalog.registry.declared)."""
    from compbench.catalog import registry

    if parts.workers < scenario.min_workers:
        return (f"it runs on {parts.workers} worker(s), and {scenario.name} needs {scenario.min_workers} "
                "or more (a rank 1)")
    if not scenario.elastic:
        return None
    if not registry.declared("sync", parts.sync).elastic:
        return f"sync={parts.sync} cannot change its number of workers (SyncTraits.elastic)"
    if not registry.declared("comm", parts.comm).elastic:
        return f"comm={parts.comm} keeps per-rank state cut for its workers (CommTraits.elastic)"
    if parts.per_worker:
        return (f"sync={parts.sync}'s steps per worker are the workers' as they started "
                "(SyncTraits.per_worker_key)")
    if parts.sharding != NONE:
        return f"sharding={parts.sharding}: its shards are fixed to its workers"
    return None


def parts_of(overrides: Sequence[str]) -> Parts:
    """The parts of a run made with `overrides` (its config composed, not checked)."""
    from compbench.catalog import registry
    from compbench.compose import config

    cfg = config.compose(list(overrides))
    picked = cfg.choices
    key = registry.declared("sync", picked["sync"]).per_worker_key
    return Parts(int(cfg.engine.get("np", 1)), str(picked["sync"]), str(picked["comm"]),
                 str(picked.get("sharding", NONE)), key is not None and cfg.sync.get(key) is not None)
