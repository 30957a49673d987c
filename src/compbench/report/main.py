"""`compbench report DIR [--latency-us A | --fit FIT.json] [--per-node L]`: Markdown + CSV tables,
four PNG plots and what-if scaling for one run or a sweep (every results.json under DIR; failed jobs
are listed with their error)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from compbench.base.args import ArgumentParser
from compbench.comm.cost_model import Fit
from compbench.records.results import SPLIT, split_ms
from compbench.report.trace_plot import trace_figures
from compbench.report.whatif import (
    ASSUMPTIONS,
    break_even_workers,
    default_fit,
    load_fit,
    predict_step_ms,
    profile_from_results,
)

COLUMNS = ["job", "status", "compressor", "ratio", "comm", "memory", "scheduler", "engine", "workers",
           "throughput", "compute_ms", "compress_ms", "comm_ms", "comm_exposed_ms", "decompress_ms",
           "optimizer_ms", "other_ms", "step_ms", "bytes_per_step", "ratio_effective", "final_acc1",
           "break_even_workers", "error"]
# Language-model runs (compbench.train.task): validation loss and tokens/s where a classifier has
# accuracy and samples/s; a report with any LM run shows these columns (and plots) too.
LM_COLUMNS = {"throughput": ["tokens_per_s"], "final_acc1": ["eval_loss", "ppl", "ood_loss"]}
WHATIF_N = (2, 8, 64, 512)
WHATIF_GBPS = (1, 10, 25, 100)


def load_runs(root: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(root.rglob("results.json"), key=lambda p: (len(p.parts), str(p))):
        data = _read_results(path)
        s, cfg = data.get("summary", {}), data.get("config", {})
        choices = cfg.get("choices", {})
        row: dict[str, Any] = {
            "job": str(path.parent.relative_to(root)) or ".", "status": s.get("status", "?"),
            "compressor": choices.get("compressor"), "ratio": cfg.get("compressor", {}).get("ratio"),
            "comm": choices.get("comm"), "memory": choices.get("memory"),
            "scheduler": choices.get("scheduler"), "sync": choices.get("sync", "step"),
            "engine": choices.get("engine"), "workers": data.get("environment", {}).get("world_size"),
            "throughput": s.get("throughput"), "bytes_per_step": s.get("bytes_sent_per_step"),
            "ratio_effective": s.get("ratio_effective"), "final_acc1": s.get("final_acc1"),
            "error": s.get("error", ""),
        }
        sharded = s.get("sharded")
        if sharded:  # sharding=fsdp|hsdp: its layout and FSDP's bytes per direction
            row.update(sharding=f"{sharded['layout']}/{sharded['shard_group']}",
                       gathered_per_step=sharded.get("bytes_gathered_per_step"),
                       scattered_per_step=sharded.get("bytes_scattered_per_step"))
        memory = s.get("memory_mb") or []
        if memory:  # what one worker holds (rank 0's) and the largest peak of any worker
            row["state_mb"] = sum(memory[0][k] for k in ("parameters", "gradients", "optimizer"))
            peaks = [m["peak"] for m in memory if m.get("peak") is not None]
            row["peak_mb"] = max(peaks) if peaks else None
        if "final_eval_loss" in s:  # a language model
            row.update(tokens_per_s=s.get("tokens_per_s"), eval_loss=s.get("final_eval_loss"),
                       ppl=s.get("final_ppl"), ood_loss=s.get("final_ood_loss"))
        for phase in ("compute", "compress", "comm", "comm_exposed", "decompress", "optimizer", "step"):
            row[f"{phase}_ms"] = s.get(f"{phase}_ms")
        split = split_ms(s)  # older results.json have no other_ms: the same difference
        row["other_ms"] = split["other"] if split else None
        if row["status"] == "completed" and s.get("bytes_dense_per_step") and s.get("bytes_sent_per_step"):
            row["break_even_workers"] = break_even_workers(s["bytes_dense_per_step"],
                                                           s["bytes_sent_per_step"])
            row["_results"] = data
        rows.append(row)
    return rows


def columns_for(rows: list[dict[str, Any]]) -> list[str]:
    """COLUMNS, with a language model's columns in place of accuracy and samples/s where every run is
    one, or beside them where some are."""
    lm = [r for r in rows if "eval_loss" in r]
    # A synchronization mode other than per step (diloco, demo, ...): its column after the scheduler's.
    columns = list(COLUMNS)
    if any(r.get("sync") != "step" for r in rows):
        columns.insert(columns.index("scheduler") + 1, "sync")
    if any(r.get("sharding") for r in rows):  # sharded runs: their layout and bytes per direction
        at = columns.index("bytes_per_step") + 1
        columns[at:at] = ["gathered_per_step", "scattered_per_step"]
        columns.insert(columns.index("engine"), "sharding")
    if any(r.get("state_mb") is not None for r in rows):
        columns[columns.index("final_acc1"):columns.index("final_acc1")] = ["state_mb", "peak_mb"]
    if not lm:
        return columns
    out = []
    for c in columns:
        if len(lm) < len(rows) or c not in LM_COLUMNS:
            out.append(c)
        out += LM_COLUMNS.get(c, [])
    return out


def _read_results(path: Path) -> dict[str, Any]:
    """A results.json as compbench writes it: a JSON object (older files may hold bare NaN, which
    json reads as float nan; newer ones write null). Anything else names the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON ({e}); remove it or pass another directory") from None
    if not isinstance(data, dict) or not isinstance(data.get("summary", {}), dict):
        raise ValueError(f"{path} is not a compbench results.json (an object with config and summary); "
                         f"remove it or pass another directory")
    return data


def _fmt(v: Any) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def whatif_section(rows: list[dict[str, Any]], model: Fit, per_node: int, source: str) -> str:
    out = [f"## What-if scaling ({per_node} worker(s) per machine; {source})", "",
           "Every figure below is the model's, extrapolated from each run's own workers and link (what it "
           "measured is its row above).", "", ASSUMPTIONS, ""]
    for r in rows:
        if "_results" not in r:
            continue
        prof = profile_from_results(r["_results"])
        out.append(f"### {r['job']}: {r['compressor']} ratio={_fmt(r['ratio'])} comm={r['comm']} "
                   f"(break-even N vs dense allreduce: {_fmt(r.get('break_even_workers'))})")
        out.append("")
        out.append("| workers | " + " | ".join(f"{g} Gbit/s" for g in WHATIF_GBPS) + " |")
        out.append("|---|" + "---|" * len(WHATIF_GBPS))
        for n in WHATIF_N:
            cells = [f"{predict_step_ms(prof, n, g, model, per_node):.1f} ms" for g in WHATIF_GBPS]
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def breakdown(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The stacked step-time bars: each phase of SPLIT, then `other` (the step minus the phases,
    clamped at 0: medians of the parts may exceed the median step by a hair), per row."""
    parts = {p: [r.get(f"{p}_ms") or 0.0 for r in rows] for p in SPLIT}
    parts["other"] = [max(0.0, r.get("other_ms") or 0.0) for r in rows]
    return parts


def bar_labels(rows: list[dict[str, Any]]) -> list[str]:
    """One label per run, "compressor\nratio", with its job (the run's folder) where two runs would
    share one: runs that differ only by seed (or any other setting) get bars of their own, never one
    bar stacked over another."""
    base = [f"{r['compressor']}\n{_fmt(r['ratio'])}" for r in rows]
    return [f"{b}\n{r['job']}" if base.count(b) > 1 else b for b, r in zip(base, rows, strict=True)]


def run_context(root: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What ran, as the runs recorded it (each results.json's environment and config): how many ran on
    a loaded machine (compbench.records.provenance), other work's runnable tasks per core while they
    trained, the load average around them, and the seeds."""
    loaded, per_core, averages, seeds, known = 0, [], [], set(), 0
    for r in rows:
        try:
            data = _read_results(root / r["job"] / "results.json")
        except ValueError:
            continue
        env, cfg = data.get("environment") or {}, data.get("config") or {}
        if cfg.get("seed") is not None:
            seeds.add(cfg["seed"])
        if "loaded" not in env and "loaded" not in (data.get("summary") or {}):
            continue
        known += 1
        loaded += bool(env.get("loaded", (data.get("summary") or {}).get("loaded")))
        if env.get("others_runnable") is not None and env.get("cores"):
            per_core.append(float(env["others_runnable"]) / float(env["cores"]))
        averages += [float(env[k]) for k in ("load_before", "load_after") if env.get(k) is not None]
    return {"runs": len(rows), "known": known, "loaded": loaded, "per_core": per_core, "averages": averages,
            "seeds": sorted(seeds, key=str)}


def context_line(ctx: dict[str, Any]) -> str:
    """One line: the seeds and the load of the runs (a report says whether its runs were loaded)."""
    seeds = ", ".join(map(str, ctx["seeds"])) or "not recorded"
    if not ctx["known"]:
        return f"seeds {seeds}; the load not recorded"
    about = []
    if ctx["per_core"]:
        about.append(f"other work {_span(ctx['per_core'], '.2f')} busy loops per core")
    if ctx["averages"]:
        about.append(f"load average {_span(ctx['averages'], '.1f')}")
    detail = f" ({', '.join(about)})" if about else ""
    return f"seeds {seeds}; {ctx['loaded']} of {ctx['known']} runs on a loaded machine{detail}"


def _span(values: list[float], spec: str) -> str:
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _human_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def plots(rows: list[dict[str, Any]], out_dir: Path, context: str = "") -> list[Path]:
    """The report's figures: throughput (axis from 0) and quality against the compression ratio, each
    run's step split, and the bytes each run sent a step (a linear axis, every bar labelled); each with
    `context` (the seeds and the load) under it. Every label inside its figure (bbox_inches=tight)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["status"] == "completed"]
    out_dir.mkdir(exist_ok=True)
    paths = []

    def save(fig: Any, name: str) -> None:
        if context:
            fig.text(0.01, 0.005, context, fontsize=7, color="0.3", ha="left", va="bottom")
        fig.tight_layout(rect=(0, 0.05 if context else 0, 1, 1))
        paths.append(out_dir / name)
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)

    def by_compressor(metric: str, ylabel: str, fname: str, from_zero: bool) -> None:
        fig, ax = plt.subplots(figsize=(6, 4))
        for comp in sorted({str(r["compressor"]) for r in done}):
            pts = sorted((r["ratio"] if r["ratio"] is not None else 1.0, r.get(metric)) for r in done
                         if str(r["compressor"]) == comp and r.get(metric) is not None)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=comp)
        ax.set_xscale("log")
        ax.set_xlabel("compression ratio (fraction of elements kept, log scale)")
        ax.set_ylabel(ylabel)
        if from_zero:  # a rate is read as a ratio of heights: from 0, or a 7% gap looks like a cliff
            ax.set_ylim(bottom=0, top=max(1e-9, 1.1 * ax.dataLim.y1))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, title="compressor", title_fontsize=8)
        else:
            ax.text(0.5, 0.5, "no completed run recorded it", transform=ax.transAxes, ha="center")
        save(fig, fname)

    if any("eval_loss" in r for r in done):  # language models
        by_compressor("tokens_per_s", "throughput (tokens/s, all workers)", "tokens_per_s_vs_ratio.png", True)
        by_compressor("eval_loss", "final validation loss (nats per token)", "loss_vs_ratio.png", False)
    else:
        by_compressor("throughput", "throughput (samples/s, all workers)", "throughput_vs_ratio.png", True)
        by_compressor("final_acc1", "final test accuracy (%)", "accuracy_vs_ratio.png", False)

    labels = bar_labels(done)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(done)), 4))
    bottom = [0.0] * len(done)
    for phase, vals in breakdown(done).items():
        ax.bar(labels, vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("time per step (ms, median)")
    ax.set_title("each run's median step, split by phase (the parts add up to it)", fontsize=9)
    ax.set_ylim(bottom=0)
    if done:
        ax.legend(fontsize=8, title="phase", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0)
    save(fig, "step_breakdown.png")

    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(done)), 4))
    sent = [float(r["bytes_per_step"] or 0) for r in done]
    most = max(sent, default=0.0)
    unit, size = next(((u, x) for u, x in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)) if most >= x), ("B", 1.0))
    bars = ax.bar(labels, [v / size for v in sent])
    ax.bar_label(bars, [_human_bytes(v) for v in sent], fontsize=7)  # a small payload beside a dense one
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"bytes sent per step per worker ({unit})")
    ax.set_title("bytes each run put on the wire per step (linear axis; labels: the values)", fontsize=9)
    save(fig, "bytes_per_step.png")
    return paths


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="compbench report")
    parser.add_argument("dir")
    parser.add_argument("--latency-us", type=float, default=10.0, help="what-if: latency per round")
    parser.add_argument("--fit", help="what-if: fit.json of scripts/whatif_cluster.py (not --latency-us)")
    parser.add_argument("--per-node", type=int, default=1, help="what-if: workers per machine")
    args = parser.parse_args(argv)
    if args.per_node < 1:
        raise ValueError(f"--per-node {args.per_node} must be >= 1 (workers per machine)")
    model = load_fit(args.fit) if args.fit else default_fit(args.latency_us)
    source = f"fitted: {args.fit}" if args.fit else f"{args.latency_us} us per message round"
    root = Path(args.dir)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory; pass a run or sweep directory (outputs/...)")
    rows = load_runs(root)
    if not rows:
        raise ValueError(f"no results.json under {root}; pass a run or sweep directory")
    columns = columns_for(rows)
    table = markdown_table(rows, [c for c in columns if c != "error"])
    failed = [r for r in rows if r["status"] != "completed"]
    context = context_line(run_context(root, rows))
    md = ["# compbench report", "", f"{len(rows)} run(s) under `{root}`, {len(failed)} failed; {context}.",
          "", table, ""]
    if failed:
        md += ["## Failed runs", ""] + [f"- `{r['job']}`: {r['error']}" for r in failed] + [""]
    pngs = plots(rows, root / "plots", context)
    pngs += trace_figures(root, rows, root / "plots", context)  # runs on a net.trace: its rate above theirs
    md += (["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in pngs]
           + ["", whatif_section(rows, model, args.per_node, source)])
    (root / "report.md").write_text("\n".join(md) + "\n")
    with open(root / "report.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    print(table)
    print(f"\nwrote {root / 'report.md'}, {root / 'report.csv'} and {len(pngs)} plots in {root / 'plots'}")
    return 0
