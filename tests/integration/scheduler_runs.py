"""One rank of the scheduler equivalence check: `python scheduler_runs.py ENGINE OUT_DIR`.

Trains the tiny MLP for 5 steps with compressor=none under every scheduler variant, through the real
trainer, engine and pipeline, in this one process (one engine start for all variants), and exits
non-zero unless every variant's parameters equal layerwise's to 1e-5. SeCoPa follows a plan file
that sends every other tensor "compressed" in up to 3 partitions (comm=ps; also comm=ring on torch).
scheduler=bucket must equal layerwise exactly also compressed (topk over allgather and over ps: the
packed exchanges of the real engines). Then one compressed run of `groups=auto` (topk), whose
results.json the test reads."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from compbench.catalog import registry
from compbench.compose.config import check, compose
from compbench.train.loop import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: make `tests` importable
from tests.helpers import TINY  # noqa: E402

VARIANTS = {
    "layerwise": [],
    "layerwise-no-overlap": ["scheduler.overlap=false"],
    "mergecomp-0": ["scheduler=mergecomp", "scheduler.groups=0"],
    "mergecomp-1": ["scheduler=mergecomp", "scheduler.groups=1"],
    "mergecomp-3": ["scheduler=mergecomp", "scheduler.groups=3"],
    # trials of 2 steps: the grouping changes twice within the 5 steps
    "mergecomp-auto": ["scheduler=mergecomp", "scheduler.groups=auto", "scheduler.trial_steps=2"],
    "bucket": ["scheduler=bucket"],
    "bucket-small": ["scheduler=bucket", "scheduler.bucket_mb=0.02"],  # two buckets
}
TOPK = ["compressor=topk", "ratio=0.1", "memory=residual"]
# compressed: bucket == layerwise exactly, over the packed allgather and the packed ps exchange
EXACT = {f"{scheduler}-topk-{comm}": [*TOPK, f"comm={comm}", f"scheduler={scheduler}"]
         for comm in ("allgather", "ps") for scheduler in ("layerwise", "bucket")}
AUTO_TOPK = ["compressor=topk", "ratio=0.1", "memory=residual", "comm=allgather", "scheduler=mergecomp",
             "scheduler.groups=auto", "scheduler.trial_steps=2", "scheduler.search_steps=8", "max_steps=12"]


def main(engine_name: str, out: Path) -> int:
    torch.set_num_threads(1)
    engine = registry.build(registry.option_config("engine", engine_name), drop=("np",))
    common = [*TINY, "compressor=none", "eval=false", "max_steps=5", "epochs=1", "batch_size=8",
              "checkpoint=false",
              f"engine={engine_name}"]
    params, failures = {}, []

    def fit(name: str, overrides: list[str]) -> Trainer:
        run_dir = out / name
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(check(compose([*common, *overrides, f"output_dir={run_dir}"])), engine, run_dir)
        trainer.fit()
        return trainer

    variants = dict(VARIANTS)
    plan = out / "partitions.csv"
    variants["secopa-ps"] = ["scheduler=secopa", f"scheduler.plan={plan}", "comm=ps"]
    if engine_name == "torch":
        variants["secopa-ring"] = ["scheduler=secopa", f"scheduler.plan={plan}", "comm=ring"]
    try:
        for name, extra in variants.items():
            trainer = fit(name, extra)
            assert trainer.step == 5, trainer.step
            params[name] = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
            if name == "layerwise" and engine.rank == 0:
                plan.write_text("".join(
                    f"{k},{v.numel()},{'y' if i % 2 == 0 else 'n'},{min(3, v.numel())}\n"
                    for i, (k, v) in enumerate(trainer.model.named_parameters())))
            engine.barrier()
        fit("auto-topk", AUTO_TOPK)
        ref = params["layerwise"]
        for name, p in params.items():
            for k in ref:
                diff = (p[k] - ref[k]).abs().max().item()
                if diff > 1e-5:
                    failures.append(f"{name}: {k} differs from layerwise by {diff:.3g}")
        exact = {name: fit(name, extra).model.state_dict() for name, extra in EXACT.items()}
        for comm in ("allgather", "ps"):
            a, b = exact[f"layerwise-topk-{comm}"], exact[f"bucket-topk-{comm}"]
            failures += [f"bucket-topk-{comm}: {k} differs from layerwise" for k in a
                         if not torch.equal(a[k], b[k])]
    finally:
        engine.shutdown()
    if failures:
        print(f"rank {engine.rank}: " + "; ".join(failures), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2])))
