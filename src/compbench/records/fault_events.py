"""The injected faults of a run, one JSON line each in RUN_DIR/faults.jsonl: written by the worker that
injects one (compbench.train.faults), read by the trainer's records and by the elastic launcher,
which brings in a spare host once a kill is due for a replacement (compbench.launch.elastic)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE = "faults.jsonl"


def append_event(run_dir: Path, event: dict[str, Any]) -> None:
    with open(run_dir / FILE, "a") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The injected events so far (a half-written last line, from a process killed mid-write, is skipped)."""
    try:
        lines = (run_dir / FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events
