"""`compbench claims [--suite cnn|text|field|elastic] [--quick] [--out DIR] [--only ID,...] [--seeds N]
[k=v ...]`.

Suites: cnn (the default: the seed papers' findings on Fashion-MNIST, compbench.claims.findings) and
text (the transformer-era findings on Shakespeare with model=gpt, compbench.claims.text) and field
(the field's other methods on the text workload, compbench.claims.field) and elastic (a failed
worker's cost to per-step and local-update methods, compbench.claims.elastic). There is no
`--suite all`: the suites differ in data, model and budget, and each writes its own folder; run them
one after the other.

Runs every run of the selected claims for each seed through
`compbench train` (compbench.cli.run.train: the same config check, launcher and results.json as any run),
one after another, into DIR/runs/NAME-sSEED/. A run whose results.json says completed is skipped, so a
suite stopped half-way (Ctrl-C, a reboot) continues where it stopped; a half-written run folder is
removed and run again. Then it writes DIR/claims.md, DIR/claims.csv and DIR/plots/CLAIM.png and prints
the table. Extra key=value overrides apply to every run (e.g. engine=torch, net.emulate_gbps=1); a
finished run made with other overrides is refused (pass another --out) rather than mixed in. The text
suite also writes DIR/methods.md and methods.csv: per run its final validation loss, bytes per step,
effective ratio and tokens/s.

Exit status: 0 when every run completed (whether or not each claim holds: that is the finding), 1 when
a run failed (its claims say "no data"), 2 for a usage error, 130 for Ctrl-C.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Mapping
from pathlib import Path

from compbench.base.args import ArgumentParser, override_key
from compbench.base.errors import INTERRUPTED_EXIT
from compbench.claims.elastic import SUITE as ELASTIC
from compbench.claims.field import FIELD
from compbench.claims.findings import CNN, Claim, Results, Stat, Suite, measured
from compbench.claims.text import TEXT
from compbench.cli.matrix import Job, check_jobs, run_jobs, summary_of

HEADER = ("claim", "source", "setting", "expected", "measured (mean +- spread over seeds)", "holds?")
METHOD_HEADER = ("method", "overrides", "final val loss (mean +- spread)", "kB sent/step", "effective ratio",
                 "tokens/s")
SUITES = {s.name: s for s in (CNN, TEXT, FIELD, ELASTIC)}


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="compbench claims", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=tuple(SUITES), default="cnn",
                        help="cnn (default): Fashion-MNIST, the seed papers; text: Shakespeare, model=gpt, "
                             "the transformer-era methods; field: the field's other methods on the same; "
                             "elastic: a failed worker's cost (engine.elastic, root)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke version, 1 seed (~10 minutes; not evidence): "
                             + "; ".join(s.quick_help for s in SUITES.values()))
    parser.add_argument("--out", default=None,
                        help="output folder (default outputs/claims[-quick], outputs/claims-SUITE[-quick])")
    parser.add_argument("--only", default=None, help="comma-separated claim ids (default: all)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds of every run (default: the suite's 2, 3 for runs it names; --quick 1)")
    parser.add_argument("overrides", nargs="*", help="key=value applied to every run")
    args = parser.parse_args(argv)
    suite = SUITES[args.suite]
    claims = _select(args.only, suite.claims)
    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds} must be >= 1")
    seeds = suite.seeds_of(dict.fromkeys(n for c in claims for n in c.runs), args.seeds, args.quick)
    _keep_fixed(suite, args.overrides)
    stem = "outputs/claims" if suite is CNN else f"outputs/claims-{suite.name}"
    out = Path(args.out or (f"{stem}-quick" if args.quick else stem))
    base = [*(suite.quick if args.quick else suite.base), *args.overrides]
    runs = suite.quick_runs if args.quick else suite.runs
    jobs = _plan(claims, seeds, base, out, runs)
    code = _run(jobs)
    if code == INTERRUPTED_EXIT:  # Ctrl-C: the user stops the suite; the next call continues it
        return code
    results, errors = _collect(claims, seeds, out, suite.metric)
    rows = [_row(c, results, errors) for c in claims]
    _write(out, rows, claims, results, suite, args.quick)
    if suite.method_table:
        _write_methods(out, claims, results, errors, runs)
    if args.quick:
        print(_estimate(jobs, suite))
    return code


def _keep_fixed(suite: Suite, overrides: list[str]) -> None:
    """Refuse an override of a setting the suite's claims are about (`Suite.fixed`)."""
    fixed = {f.partition("=")[0]: f for f in suite.fixed}
    for override in overrides:
        key = override_key(override)
        if key in fixed and override.lstrip("+") != fixed[key]:
            raise ValueError(f"{override}: the {suite.name} suite's claims are about {fixed[key]}; drop "
                             f"{key} (or run the methods yourself with compbench train)")


def _select(only: str | None, claims: tuple[Claim, ...] = CNN.claims) -> list[Claim]:
    if only is None:
        return list(claims)
    ids = {c.id: c for c in claims}
    wanted = [s.strip() for s in only.split(",") if s.strip()]
    unknown = [w for w in wanted if w not in ids]
    if unknown or not wanted:
        raise ValueError(f"--only {only}: unknown claim {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(ids)}")
    return [ids[w] for w in wanted]


def _plan(claims: list[Claim], seeds: Mapping[str, int], base: list[str], out: Path,
          runs: Mapping[str, tuple[str, ...]] = CNN.runs) -> list[Job]:
    """Every (run folder, overrides) of the selection, `seeds[name]` seeds of each, checked before any
    run starts (compbench.cli.matrix: finished runs are kept, stale or half-written ones handled)."""
    names = list(dict.fromkeys(n for c in claims for n in c.runs))
    jobs = [(out / "runs" / f"{name}-s{seed}", [*base, *runs[name], f"seed={seed}"])
            for name in names for seed in range(seeds[name])]
    check_jobs(jobs, out / "runs" / "_check")
    return jobs


def _run(jobs: list[Job]) -> int:
    return run_jobs(jobs, "claims")


def _collect(claims: list[Claim], seeds: Mapping[str, int], out: Path,
             metric: str = "final_acc1") -> tuple[dict[str, Stat], dict[str, str]]:
    """Each run's Stat over its seeds, and why a run has none (its first failed seed's error: a
    diverged run, for instance, is a finding the table must show, not hide)."""
    stats, errors = {}, {}
    for name in dict.fromkeys(n for c in claims for n in c.runs):
        summaries = [summary_of(out / "runs" / f"{name}-s{s}") for s in range(seeds[name])]
        done = [s for s in summaries
                if s and s.get("status") == "completed" and s.get(metric) is not None]
        if len(done) == len(summaries):
            stats[name] = Stat(tuple(float(s[metric]) for s in done), _mean_of(done, "bytes_sent_per_step"),
                               _mean_of(done, "bytes_dense_per_step"), _mean_of(done, "tokens_per_s"))
            continue
        seed, summary = next((i, s) for i, s in enumerate(summaries) if s not in done)
        errors[name] = f"seed {seed} " + (f"failed: {summary.get('error', '?')}" if summary
                                          else "did not run")
    return stats, errors


def _mean_of(summaries: list[dict], key: str) -> float | None:
    """The mean over the seeds that recorded `key` (None when none did, or recorded 0)."""
    values = [s[key] for s in summaries if s.get(key)]
    return sum(values) / len(values) if values else None


def _row(claim: Claim, results: Results, errors: dict[str, str] | None = None) -> tuple[str, ...]:
    missing = [n for n in claim.runs if n not in results]
    if missing:
        why = "; ".join(f"{n} {(errors or {}).get(n, 'did not complete')}" for n in missing)
        return (claim.id, claim.source, claim.setting, claim.expected, f"no data: {why}", "no data")
    return (claim.id, claim.source, claim.setting, claim.expected, measured(claim, results),
            "yes" if claim.check(results) else "NO")


def _write(out: Path, rows: list[tuple[str, ...]], claims: list[Claim], results: Results, suite: Suite,
           quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    note = suite.quick_note if quick else suite.note
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    table = "\n".join(lines)
    (out / "claims.md").write_text(note + table + "\n")
    with open(out / "claims.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        writer.writerows(rows)
    plots = _plot(out / "plots", claims, results, {row[0]: row[-1] for row in rows}, suite)
    held = sum(r[-1] == "yes" for r in rows)
    print(note + table)
    print(f"claims: {held} of {len(rows)} hold; {out / 'claims.md'}, {out / 'claims.csv'}, "
          f"{len(plots)} plots in {out / 'plots'}", flush=True)


def _method_rows(claims: list[Claim], results: Results, errors: dict[str, str],
                 runs: Mapping[str, tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Per run of the claims: its overrides, final loss, kB sent per step, effective ratio (dense bytes
    over sent: what a per-step fp32 exchange would send, divided by what the run sent) and tokens/s."""
    rows: list[tuple[str, ...]] = []
    for name in dict.fromkeys(n for c in claims for n in c.runs):
        s = results.get(name)
        if s is None:
            rows.append((name, " ".join(runs[name]), f"no data: {errors.get(name, 'did not complete')}",
                         "-", "-", "-"))
            continue
        sent, dense = s.bytes_per_step, s.dense_per_step
        ratio = f"{dense / sent:.1f}x" if dense and sent else "-"
        rows.append((name, " ".join(runs[name]), f"{s.mean:.3f} +- {s.spread:.3f}",
                     f"{s.bytes_per_step / 1e3:.1f}" if s.bytes_per_step else "-", ratio,
                     f"{s.tokens_per_s:,.0f}" if s.tokens_per_s else "-"))
    return rows


def _write_methods(out: Path, claims: list[Claim], results: Results, errors: dict[str, str],
                   runs: Mapping[str, tuple[str, ...]]) -> None:
    rows = _method_rows(claims, results, errors, runs)
    lines = ["| " + " | ".join(METHOD_HEADER) + " |", "|" + "---|" * len(METHOD_HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    (out / "methods.md").write_text("\n".join(lines) + "\n")
    with open(out / "methods.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(METHOD_HEADER)
        writer.writerows(rows)
    print("\n".join(lines))
    print(f"claims: method table in {out / 'methods.md'}, {out / 'methods.csv'}", flush=True)


def _plot(folder: Path, claims: list[Claim], results: Results, verdicts: dict[str, str],
          suite: Suite = CNN) -> list[Path]:
    """One chart per claim: each run's mean final metric as a wide mark with the seeds' spread, its
    seeds as dots, the baseline as a line. The axis is zoomed on the runs (the gaps between methods are
    tenths of a nat or a few points), so no bars are drawn: a bar's length would read from an axis
    that does not start at zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for claim in claims:
        names = [n for n in claim.runs if n in results]
        if not names:
            continue
        fig, ax = plt.subplots(figsize=(1.4 * len(names) + 2, 3.5))
        means = [results[n].mean for n in names]
        ax.errorbar(range(len(names)), means, yerr=[results[n].spread for n in names], fmt="_", ms=28,
                    mew=2.5, capsize=4, color="#3b6ea5", label="mean (the seeds' spread)")
        for i, n in enumerate(names):
            ax.plot([i] * len(results[n].values), results[n].values, "k.", ms=5,
                    label="a seed" if i == 0 else None)
        if suite.baseline in results:
            ax.axhline(results[suite.baseline].mean, ls="--", color="gray", lw=1, label=suite.baseline)
        ax.legend(loc="best", fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        ax.set_ylabel(suite.metric_label)
        ax.set_title(f"{claim.id}: holds? {verdicts.get(claim.id, '?')}", fontsize=10)
        low = min(min(results[n].values) for n in names)
        high = max(max(results[n].values) for n in names)
        if suite.higher_is_better:  # accuracy in %: from 5 below the lowest seed to 100
            ax.set_ylim(max(0.0, low - 5), 100)
        else:  # a loss: zoomed on the runs, so that the gaps between methods show
            pad = max(0.05, 0.1 * (high - low))
            ax.set_ylim(max(0.0, low - pad), high + pad)
        fig.tight_layout()
        paths.append(folder / f"{claim.id}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def _estimate(jobs: list[tuple[Path, list[str]]], suite: Suite = CNN) -> str:
    """The full suite's wall time from this quick run: each run's start-up and evaluation overhead
    (wall minus training time) plus the full setting's steps at the step time measured here (the
    quick suite runs the same model, batch and workers; only the data, epochs or steps are fewer)."""
    steps = suite.full_steps()
    total, seen = 0.0, 0
    for run_dir, _ in jobs:
        s = summary_of(run_dir)
        try:
            wall = float((run_dir / "wall_s.txt").read_text())
        except (OSError, ValueError):
            continue
        if not s or not s.get("step_ms"):
            continue
        overhead = wall - s["train_time_s"]
        total += overhead + steps * s["step_ms"] / 1000 + suite.eval_s
        seen += 1
    if not seen:
        return "claims: no timed runs for an estimate"
    per_run = total / seen
    runs = sum(suite.seeds_of(dict.fromkeys(n for c in suite.claims for n in c.runs), None, False).values())
    return (f"claims: full suite estimate from these step times: {runs} runs x {per_run:.0f} s "
            f"= {runs * per_run / 60:.0f} min ({steps} steps per run)")
