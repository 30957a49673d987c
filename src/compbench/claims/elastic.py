"""The elastic suite (`compbench claims --suite elastic`): what a failed worker costs each kind of
method, on the text suite's workload (compbench.claims.text: model=gpt on char-level Shakespeare, 2
workers x batch 32, the same steps, warm-up, evaluation and seeds), every run with engine.elastic=true
(Horovod Elastic; root, for the workers' private namespace).

Runs, each once as is and once with rank 1 killed half-way (fault.kill_rank=1, fault.at_step=STEPS/2:
the survivor trains the second half alone, on half the global batch): DDP-AdamW (dense allreduce every
step), top-k 1% with residual error feedback (a per-step compressor: its departed worker's residual is
lost), DiLoCo H=30 (local AdamW steps, the kill falls inside a round, which the survivor redoes).

Claim (DiLoCo's paper: robust to workers dropping out): a local-update method loses less of its
quality to the same failure than per-step training does. Its measure is each method's loss increase
over its own run without the failure; the seeds' mean increases are compared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from compbench.claims.findings import Claim, Results
from compbench.claims.text import BASE, QUICK, QUICK_STEPS, STEPS, TEXT, H

ELASTIC = ("engine.elastic=true",)
METHODS = {
    "ddp-adamw": ("optim=adamw", "compressor=none", "comm=allreduce"),
    "topk-adamw": ("optim=adamw", "compressor=topk", "ratio=0.01", "memory=residual", "comm=allgather"),
    "diloco": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}"),
}


def runs(steps: int) -> Mapping[str, tuple[str, ...]]:
    """Each method as is and with rank 1 killed at the start of the middle step."""
    kill = ("fault.kill_rank=1", f"fault.at_step={steps // 2}")
    out: dict[str, tuple[str, ...]] = {}
    for name, overrides in METHODS.items():
        out[name] = overrides
        out[f"{name}-fail"] = (*overrides, *kill)
    return out


def increase(r: Results, method: str) -> float:
    """The loss a method's run with the failure ends above its run without (mean over seeds)."""
    return r[f"{method}-fail"].mean - r[method].mean


def _local_update_loses_less(r: Results) -> bool:
    return increase(r, "diloco") < min(increase(r, "ddp-adamw"), increase(r, "topk-adamw"))


CLAIMS: tuple[Claim, ...] = (
    Claim("diloco-loses-less-to-a-failure", "DiLoCo (Douillard et al., 2023), workers dropping out",
          f"engine.elastic=true, 2 workers, rank 1 killed at the middle step; sync=diloco H={H} vs "
          "DDP-AdamW and top-k 1% with error feedback",
          "a local-update method loses less quality to a failed worker than per-step training: DiLoCo's "
          "loss increase over its own run without the failure is below both per-step methods'",
          tuple(runs(STEPS)), _local_update_loses_less, show_bytes=True),
)

SUITE = replace(
    TEXT, name="elastic", runs=runs(STEPS), quick_runs=runs(QUICK_STEPS), claims=CLAIMS,
    base=(*BASE, *ELASTIC), quick=(*QUICK, *ELASTIC), fixed=ELASTIC,
    note=f"a failed worker on the text workload: model=gpt on Shakespeare (char), 2 workers x batch 32 x 64 "
         f"tokens, {STEPS} steps, engine.elastic=true, rank 1 killed at step {STEPS // 2} in the -fail runs; "
         "spread = half the range over seeds\n\n",
    quick_help=f"elastic: {QUICK_STEPS} steps")
