"""The experiments behind the four claims that do not hold (issue 32, item 8): each tests the
hypothesis written beside its claim on docs/results.md, instead of guessing.

    python scripts/claims_followups.py [--out DIR] [--only NAME,...] [--seeds N]

Runs every experiment's runs through `compbench train` (compbench.cli.matrix: resumable, a finished run
is skipped), one after another, into DIR/runs/EXPERIMENT-RUN-sSEED/, then prints and writes
DIR/followups.md: per experiment its hypothesis, what would confirm it, and each run's metric (mean
over seeds and the seeds' values). The settings are the claims suites' (compbench.claims.findings
and compbench.claims.text) with one thing changed per experiment:

- sparseloco-rounds: SparseLoCo vs DiLoCo at H=10 (60 rounds in the same 600 steps) beside H=30 (20
  rounds). Hypothesis "too few rounds for its error accumulator": the gap to DiLoCo narrows with
  three times the rounds.
- onebit-adam-warmup: 1-bit Adam frozen after 15% (the claim's setting, now with the frozen-variance
  guard and weight decay 0) and after 40% of the steps, 2 seeds, against DDP-AdamW. Hypothesis "the
  variance was frozen too early": the 40% runs match Adam (within 2%) in every seed.
- onebit-adam-recipe: 1-bit Adam (frozen after 15%) with the suite's 54-step learning-rate warm-up, a
  300-step one, and a third of the rate, 3 seeds, against DDP-AdamW. Hypothesis "its warm-up without
  bias correction takes 3-6x Adam's steps for hundreds of steps": a longer warm-up or a lower rate
  trains in every seed.
- adamw-lr-sweep: AdamW on 1-bit Adam's schedule and weight decay (adamw-onebit-schedule) at lr
  1e-3 (the suite's), 2e-3 and 3e-3, 2 seeds. Hypothesis "AdamW at 1e-3 is lr-limited here, and 1-bit
  Adam's lower loss is its rule's larger steps (no bias correction), not its compression": AdamW at
  2-3x the rate ends within 2% of 1-bit Adam, as its dense rule does.
- sign-workers: signSGD and signum without error feedback and EF-signSGD with 8 workers x batch 16
  (the same 128 images per step as the CNN suite's 2 x 64). Hypothesis "with 2 workers the averaged
  signs keep enough magnitude; with more workers signs without EF fail": signsgd-noef ends below
  efsignsgd by more than the 2-worker gap.
- dgc-schedule: DGC's recipe vs residual EF vs fp32 over 9 epochs (3x the suite's 3) with the same
  1-epoch warm-up. Hypothesis "DGC's momentum correction needs a longer schedule": DGC ends within
  0.5 points of fp32 and above residual EF.
- noloco-workers: NoLoCo vs DiLoCo with 4 workers x batch 16 (the field suite's 2 x 32 tokens per
  step) on engine=torch (process groups for the pairs): with 2 workers NoLoCo's one pair is everyone,
  with 4 its gossip averages half the world per round. Claim "NoLoCo close to DiLoCo": within 5%.

Budget: about 45 minutes on 2 cores (sparseloco-rounds 4 runs x 2 min, onebit-adam-warmup 6 x 3,
sign-workers 3 x 3, dgc-schedule 3 x 3.5), noloco-workers 2 x 3 and adamw-lr-sweep 6 x 2.5.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from compbench.claims import findings, text
from compbench.cli.matrix import Job, check_jobs, run_jobs, summary_of


@dataclass(frozen=True)
class Experiment:
    name: str
    hypothesis: str
    confirms: str
    base: tuple[str, ...]
    runs: dict[str, tuple[str, ...]]
    metric: str  # results.json summary key
    seeds: int = 1


CNN_LONG = tuple(o if not o.startswith("epochs=") else "epochs=9" for o in findings.BASE)
CNN_WIDE = tuple(o.replace("engine.np=2", "engine.np=8").replace("batch_size=64", "batch_size=16")
                 for o in findings.BASE)
ONEBIT = ("optim=adamw", "sync=onebit_adam", f"sync.freeze_step={round(text.WARMUP * text.STEPS)}")
TEXT_WIDE = tuple(o.replace("engine.np=2", "engine.np=4").replace("batch_size=32", "batch_size=16")
                  for o in text.BASE)

EXPERIMENTS = (
    Experiment(
        "sparseloco-rounds", "too few rounds for SparseLoCo's error accumulator (20 rounds at H=30)",
        "SparseLoCo's gap to DiLoCo is smaller at H=10 (60 rounds) than at H=30",
        text.BASE,
        {"diloco-h30": ("optim=adamw", "sync=diloco", "sync.inner_steps=30"),
         "sparseloco-h30": ("experiment=sparseloco", "optim=adamw", "sync.inner_steps=30"),
         "diloco-h10": ("optim=adamw", "sync=diloco", "sync.inner_steps=10"),
         "sparseloco-h10": ("experiment=sparseloco", "optim=adamw", "sync.inner_steps=10")},
        "final_eval_loss"),
    Experiment(
        "onebit-adam-warmup", "1-bit Adam's variance was frozen too early (after 15% of 600 steps)",
        "1-bit Adam frozen after 40% matches DDP-AdamW (mean loss within 2%) in both seeds",
        text.BASE,
        {"ddp-adamw": ("optim=adamw", "compressor=none", "comm=allreduce"),
         **{f"onebit-adam-{pct}": ("optim=adamw", "sync=onebit_adam",
                                   f"sync.freeze_step={round(pct / 100 * text.STEPS)}") for pct in (15, 40)}},
        "final_eval_loss", seeds=2),
    Experiment(
        "onebit-adam-recipe", "1-bit Adam's dense warm-up, without bias correction, takes steps of 3-6 lr "
        "sign(g) for its first hundreds of steps (m / sqrt(v) with v ~ 0.001 t g^2), which derails seed 0 at "
        "DDP-AdamW's learning rate and its 54-step warm-up",
        "a longer learning-rate warm-up (300 steps) or a third of the rate trains in 3 seeds of 3 (final "
        "loss within 2% of DDP-AdamW's)",
        text.BASE,
        {"ddp-adamw": ("optim=adamw", "compressor=none", "comm=allreduce"),
         "onebit-adam": (*ONEBIT,),
         "onebit-adam-warm300": (*ONEBIT, "optim.warmup_epochs=0.2778"),  # 301 of its 1,084 steps an epoch
         "onebit-adam-lr3": (*ONEBIT, "optim.lr=3.3e-4")},
        "final_eval_loss", seeds=3),
    Experiment(
        "adamw-lr-sweep", "AdamW at lr 1e-3 is lr-limited on this workload: 1-bit Adam's lower loss is "
        "its rule's larger steps (no bias correction: 3-6x Adam's early, 3.4x at the freeze), not its "
        "compression",
        "AdamW on 1-bit Adam's schedule at 2x or 3x the rate ends within 2% of 1-bit Adam's loss (1.881 "
        "in the text claims at 308f621)",
        text.BASE,
        {f"adamw-lr{lr:g}": (*text.RUNS["adamw-onebit-schedule"], f"optim.lr={lr:g}")
         for lr in (1e-3, 2e-3, 3e-3)},
        "final_eval_loss", seeds=2),
    Experiment(
        "sign-workers", "signs without error feedback train on the CNN because only 2 workers average them",
        "with 8 workers signsgd-noef ends further below efsignsgd than with 2 (1.3 points)",
        CNN_WIDE,
        {name: findings.RUNS[name] for name in ("signsgd-noef", "signum-noef", "efsignsgd")},
        "final_acc1"),
    Experiment(
        "dgc-schedule", "DGC's momentum correction needs more than 3 epochs (its recipe is for 164)",
        "over 9 epochs DGC ends within 0.5 points of fp32 and above dgc-residual",
        CNN_LONG,
        {name: findings.RUNS[name] for name in ("fp32", "dgc", "dgc-residual")},
        "final_acc1"),
    Experiment(
        "noloco-workers", "NoLoCo's gossip (pairs of 4 workers) stays close to DiLoCo's all-reduce",
        "NoLoCo's loss within 5% of DiLoCo's with 4 workers",
        (*TEXT_WIDE, "engine=torch"),
        {"diloco": ("optim=adamw", "sync=diloco", f"sync.inner_steps={text.H}"),
         "noloco": ("optim=adamw", "sync=noloco", f"sync.inner_steps={text.H}")},
        "final_eval_loss"),
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/claims-followups")
    parser.add_argument("--only", default=None, help="comma-separated experiment names")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per run (default: the experiment's)")
    parser.add_argument("--runs", default=None,
                        help="comma-separated run names to keep (default: every run of each experiment)")
    args = parser.parse_args(argv)
    known = {e.name: e for e in EXPERIMENTS}
    names = args.only.split(",") if args.only else list(known)
    if unknown := [n for n in names if n not in known]:
        print(f"error: --only {','.join(unknown)}: not an experiment; choose from {', '.join(known)}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    chosen = [known[n] for n in names]
    kept = set(args.runs.split(",")) if args.runs else None
    if kept is not None and (unknown := kept - {run for e in chosen for run in e.runs}):
        print(f"error: --runs {','.join(sorted(unknown))}: not a run of the chosen experiments",
              file=sys.stderr)
        return 2
    jobs: list[Job] = [(out / "runs" / f"{e.name}-{run}-s{seed}", [*e.base, *overrides, f"seed={seed}"])
                       for e in chosen for seed in range(args.seeds or e.seeds)
                       for run, overrides in e.runs.items() if kept is None or run in kept]
    try:
        check_jobs(jobs, out)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    code = run_jobs(jobs, "followups")
    report = "\n".join(_table(e, out, args.seeds or e.seeds) for e in chosen)
    (out / "followups.md").write_text(report)
    print(report)
    return code


def _table(e: Experiment, out: Path, seeds: int) -> str:
    lines = [f"### {e.name}", "", f"Hypothesis: {e.hypothesis}. Confirmed if: {e.confirms}.", "",
             f"| run | {e.metric} (mean) | per seed | kB sent/step |", "|---|---|---|---|"]
    for run in e.runs:
        summaries = [summary_of(out / "runs" / f"{e.name}-{run}-s{s}") or {} for s in range(seeds)]
        values = [s[e.metric] for s in summaries if s.get(e.metric) is not None]
        sent = [s["bytes_sent_per_step"] for s in summaries if s.get("bytes_sent_per_step") is not None]
        shown = f"{mean(values):.3f}" if values else "no data"
        kb = f"{mean(sent) / 1e3:.1f}" if sent else "-"
        lines.append(f"| {run} | {shown} | {', '.join(f'{v:.3f}' for v in values)} | {kb} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
