"""A run on a trace (`net.trace`), drawn: the links' rate over time (the trace the run copied to
RUN_DIR/trace.csv, each rank's link, with the times the player applied each change) above the run's
throughput over time (tokens/s for a language model, samples/s for a classifier), on one clock, the
trace's (from the workers' start). `compbench report` draws one per traced run (plots/trace_JOB.png).

Placing the run on the trace's clock: the player logs the clock's start as a Unix time
(RUN_DIR/trace_applied.csv, compbench.network.trace_player), and TensorBoard's events hold each
throughput point at the run's start plus its training clock (compbench.train.metrics: the steps'
wall time, evaluations and checkpoints left out). A point is drawn at that time less the trace's
start: the workers' start-up is on the axis, and an evaluation or checkpoint during the run moves
the points after it left by its duration (the figure says so; a run with eval=false and
checkpoint=false has none).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from compbench.network.trace import Trace, load_trace
from compbench.network.trace_player import APPLIED_FILE, TRACE_FILE

_THROUGHPUT = (("train/tokens_per_s", "tokens/s, all workers"),
               ("train/throughput", "samples/s, all workers"))


def traced_runs(root: Path, rows: list[dict[str, Any]]) -> list[tuple[str, Path]]:
    """(job, run folder) of each report row whose run replayed a trace (it has trace.csv and the log)."""
    found = []
    for row in rows:
        run_dir = root / row["job"]
        if (run_dir / TRACE_FILE).is_file() and (run_dir / APPLIED_FILE).is_file():
            found.append((row["job"], run_dir))
    return found


def read_applied(run_dir: Path) -> tuple[float, int, list[tuple[float, int]]]:
    """From RUN_DIR/trace_applied.csv: the trace's start as a Unix time, the job's workers (the ranks
    the t = 0 rows name), and each change after t = 0 as (applied_s, rank)."""
    with open(run_dir / APPLIED_FILE, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{run_dir / APPLIED_FILE} has no rows: the run's clock never started")
    start = float(rows[0]["unix_s"]) - float(rows[0]["applied_s"])
    world = 1 + max(int(r["rank"]) for r in rows if float(r["t_s"]) == 0)
    later = [(float(r["applied_s"]), int(r["rank"])) for r in rows if float(r["t_s"]) > 0]
    return start, world, later


def throughput(run_dir: Path) -> tuple[str, list[tuple[float, float]]]:
    """The run's throughput as (its unit, [(Unix time, value)]) from its TensorBoard events; ('', [])
    when it kept none (loggers without tensorboard)."""
    if not (run_dir / "tb").is_dir():
        return "", []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    for tag, unit in _THROUGHPUT:
        if tag in tags:
            return unit, [(e.wall_time, e.value) for e in events.Scalars(tag)]
    return "", []


def _steps(trace: Trace, rank: int, end: float) -> tuple[list[float], list[float]]:
    """Rank `rank`'s rate as a step line's points up to `end` (each setting held to the next)."""
    xs = [t for t in trace.times[rank] if t <= end] + [end]
    return xs, [trace.at(t, rank).mbps for t in xs]


def trace_figure(run_dir: Path, out: Path, context: str = "") -> Path:
    """Draw run `run_dir`'s trace above its throughput into `out` (PNG); returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, world, later = read_applied(run_dir)
    trace = load_trace(run_dir / TRACE_FILE, world)
    unit, points = throughput(run_dir)
    run = [(wall - start, value) for wall, value in points]
    end = max([trace.duration_s, *(t for t, _ in run), *(t for t, _ in later)]) * 1.02 or 1.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, height_ratios=(1, 1.3))
    same = all(trace.times[k] == trace.times[0] and trace.states[k] == trace.states[0] for k in range(world))
    for rank in range(1 if same else world):
        xs, ys = _steps(trace, rank, end)
        label = "every rank's link" if same else f"rank {rank}'s link"
        # later ranks dashed and thinner: a link that equals another's stays visible under it
        (line,) = top.step(xs, ys, where="post", label=label, linewidth=2.2 if rank == 0 else 1.4,
                           linestyle="-" if rank == 0 else (0, (4, 2 + rank)))
        for t, k in later:
            if k == rank or same:
                top.axvline(t, color=line.get_color(), linestyle=":", linewidth=0.8)
    if later:
        top.plot([], [], ":", color="0.3", linewidth=0.8, label="a change as applied (its measured time)")
    top.set_ylabel("link rate (Mbit/s, each way)")
    top.set_ylim(bottom=0, top=1.1 * max(max(s.mbps for s in states) for states in trace.states))
    after = "; after its end the last row holds" if trace.duration_s < end / 1.02 else ""
    top.set_title(f"net.trace: {trace.duration_s:g} s{after}", fontsize=9)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    top.grid(alpha=0.3)
    if run:
        bottom.plot(*zip(*run, strict=True), marker=".", linewidth=1)
        bottom.set_ylim(bottom=0, top=1.1 * max(v for _, v in run))
        bottom.set_ylabel(f"throughput ({unit})")
        bottom.set_title("the run's throughput at its start + its training clock (evaluations and "
                         "checkpoints not counted:\neach moves the points after it left by its duration)",
                         fontsize=8)
    else:
        bottom.text(0.5, 0.5, "the run kept no throughput with its times (loggers without tensorboard)",
                    transform=bottom.transAxes, ha="center")
    bottom.set_xlim(0, end)
    bottom.set_xlabel("time since the workers started (s, the trace's clock)")
    bottom.grid(alpha=0.3)
    if context:
        fig.text(0.01, 0.005, context, fontsize=7, color="0.3", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04 if context else 0, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out


def trace_figures(root: Path, rows: list[dict[str, Any]], out_dir: Path, context: str = "") -> list[Path]:
    """One figure per traced run under `root` (plots/trace_JOB.png, JOB's folders joined by '_')."""
    return [trace_figure(run_dir, out_dir / f"trace_{'run' if job == '.' else job.replace('/', '_')}.png",
                         context) for job, run_dir in traced_runs(root, rows)]
