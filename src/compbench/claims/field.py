"""The field suite (`compbench claims --suite field`): the findings of the methods beyond the text
suite's, on the text suite's workload (compbench.claims.text: model=gpt on char-level Shakespeare, 2
workers x batch 32, the same steps, warm-up, evaluation and seeds) and with its checks.

Runs: DDP-AdamW and DiLoCo (H=30) as references; LAMB (sync=onebit_lamb never frozen: DeepSpeed's
1-bit LAMB warm-up is LAMB, without bias correction) and 1-bit LAMB with a 15% warm-up, both at
optim.lr LAMB_LR (LAMB's step is relative to each tensor's norm); NoLoCo with H=30 (sync=noloco: with
2 workers its one pair is both, so the row tests its outer update, not its gossip), SPARTA
(sync=sparta, p=0.005) and SPARTA + DiLoCo (sync=sparta_diloco, H=30); MuLoCo (experiment=muloco:
H=30 inner Muon steps, sign-compressed outer gradients with error feedback) and AdamW-DiLoCo with the
same compressed outer gradients (experiment=muloco optim=adamw); DES-LOC (sync=desloc, K_x=10,
K_u=3 K_x, K_v=6 K_x, the paper's recommendation) and Local Adam (sync=desloc with all three periods
K_x). SEEDS=2 seeds per run: 11 runs x 2 seeds = 22 trainings, about 40 minutes on 2 cores by the
--quick run's step times (--quick itself: 10.5 minutes).

Checks, besides the text suite's: "at equal bytes": bytes sent per step within SAME (5%) of each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from compbench.claims.findings import Claim, Results, Stat
from compbench.claims.text import (
    MATCH,
    NEAR,
    QUICK_STEPS,
    STEPS,
    TEXT,
    WARMUP,
    H,
    fewer_bytes,
    loses,
    near,
)

LAMB_LR = 1e-2       # LAMB's and 1-bit LAMB's optim.lr: 80-step probe, see docs/guide/claims.md
LAMB_FEWER = 4.6     # 1-bit LAMB's published communication-volume reduction
SPARTA_P = 0.005     # SPARTA's fraction of the parameters averaged per step (ExoGym's default)
SPARTA_FEWER = 100   # SPARTA: 1/p = 200x fewer bytes than DDP's per step, half of it as the bound
SAME = 0.05          # "at equal bytes": bytes per step within 5% of each other
KX = 10              # DES-LOC's parameter period (its moments': 3 KX and 6 KX); Local Adam's period


def runs(steps: int) -> Mapping[str, tuple[str, ...]]:
    """name -> overrides on top of the text suite's BASE (QUICK): the 1-bit warm-up follows the steps."""
    return {
        "ddp-adamw": ("optim=adamw", "compressor=none", "comm=allreduce"),
        "diloco": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}"),
        "lamb": ("optim=adamw", f"optim.lr={LAMB_LR:g}", "sync=onebit_lamb", f"sync.freeze_step={steps + 1}"),
        "onebit-lamb": ("optim=adamw", f"optim.lr={LAMB_LR:g}", "sync=onebit_lamb",
                        f"sync.freeze_step={round(WARMUP * steps)}"),
        "noloco": ("optim=adamw", "sync=noloco", f"sync.inner_steps={H}"),
        "sparta": ("optim=adamw", "sync=sparta", f"sync.p={SPARTA_P:g}"),
        "sparta-diloco": ("optim=adamw", "sync=sparta_diloco", f"sync.p={SPARTA_P:g}",
                          f"sync.inner_steps={H}"),
        "muloco": ("experiment=muloco", f"sync.inner_steps={H}"),
        "diloco-adamw-ef": ("experiment=muloco", "optim=adamw", f"sync.inner_steps={H}"),
        "desloc": ("sync=desloc", "optim=adamw", f"sync.param_period={KX}",
                   f"sync.first_moment_period={3 * KX}", f"sync.second_moment_period={6 * KX}"),
        "local-adam": ("sync=desloc", "optim=adamw", f"sync.param_period={KX}",
                       f"sync.first_moment_period={KX}", f"sync.second_moment_period={KX}"),
    }


RUNS = runs(STEPS)
QUICK_RUNS = runs(QUICK_STEPS)


def same_bytes(a: Stat, b: Stat) -> bool:
    """a and b send the same bytes per step, within SAME."""
    sent, other = a.bytes_per_step, b.bytes_per_step
    return sent is not None and other is not None and other > 0 and abs(sent - other) <= SAME * other


def _onebit_lamb(r: Results) -> bool:
    matches = abs(r["onebit-lamb"].mean - r["lamb"].mean) <= MATCH * r["lamb"].mean
    return matches and fewer_bytes(r["onebit-lamb"], r["lamb"], LAMB_FEWER)


def _noloco(r: Results) -> bool:
    return near(r["noloco"], r["diloco"])


def _sparta(r: Results) -> bool:
    return near(r["sparta"], r["ddp-adamw"]) and fewer_bytes(r["sparta"], r["ddp-adamw"], SPARTA_FEWER)


def _sparta_diloco(r: Results) -> bool:
    return r["sparta-diloco"].mean < r["diloco"].mean


def _muloco(r: Results) -> bool:
    return loses(r["diloco-adamw-ef"], r["muloco"]) and same_bytes(r["muloco"], r["diloco-adamw-ef"])


def _desloc(r: Results) -> bool:
    # Local Adam sends x, u and v every K_x steps; DES-LOC (1 + 1/3 + 1/6)/3 = 1/2 of it: 2x, 5% slack.
    return (abs(r["desloc"].mean - r["local-adam"].mean) <= MATCH * r["local-adam"].mean
            and fewer_bytes(r["desloc"], r["local-adam"], 2 / 1.05))


CLAIMS: tuple[Claim, ...] = (
    Claim("onebit-lamb-matches-lamb", "1-bit LAMB (Li et al., HiPC 2022)",
          f"sync=onebit_lamb at optim.lr {LAMB_LR:g}, dense LAMB warm-up {WARMUP:.0%} of the steps, then "
          "1-bit momentum with EF and the frozen trust ratio, vs the same never frozen (LAMB)",
          f"1-bit LAMB matches LAMB's convergence at up to {LAMB_FEWER:g}x less communication (the paper's "
          f"finding): mean loss within {MATCH:.0%} of LAMB's at >= {LAMB_FEWER:g}x fewer bytes per step",
          ("lamb", "onebit-lamb"), _onebit_lamb, show_bytes=True),
    Claim("noloco-close-to-diloco", "NoLoCo (Kolehmainen et al., 2025)",
          f"sync=noloco, H={H}, groups of 2, outer lr 0.7, momentum 0.3 (2 workers: one pair, both)",
          f"NoLoCo close to DiLoCo without a global all-reduce: its loss within {NEAR:.0%} of DiLoCo's",
          ("diloco", "noloco"), _noloco, show_bytes=True),
    Claim("sparta-near-ddp", "SPARTA (ExoGym, Exo Labs 2025)",
          f"sync=sparta, p={SPARTA_P:g} of the parameters averaged after every local AdamW step",
          f"SPARTA trains near DDP-AdamW (loss within {NEAR:.0%}) at >= {SPARTA_FEWER}x fewer bytes per step",
          ("ddp-adamw", "sparta"), _sparta, show_bytes=True),
    Claim("sparta-improves-diloco", "SPARTA + DiLoCo (ExoGym, Exo Labs 2025)",
          f"sync=sparta_diloco (p={SPARTA_P:g} every step, DiLoCo H={H}) vs sync=diloco",
          "SPARTA's sparse averaging inside DiLoCo's rounds lowers DiLoCo's loss (lower mean loss)",
          ("diloco", "sparta-diloco"), _sparta_diloco, show_bytes=True),
    Claim("muloco-beats-adamw-diloco", "MuLoCo (Therien, Huang, Rish, Belilovsky, 2025)",
          f"experiment=muloco (H={H} inner Muon steps, EF-SignSGD outer gradients, error feedback) vs "
          "the same with optim=adamw",
          "MuLoCo beats AdamW-DiLoCo at equal bytes (lower loss, seed intervals disjoint; bytes per step "
          f"within {SAME:.0%})",
          ("diloco-adamw-ef", "muloco"), _muloco, show_bytes=True),
    Claim("desloc-halves-local-adam", "DES-LOC (Iacob et al., 2025)",
          f"sync=desloc K_x={KX}, K_u={3 * KX}, K_v={6 * KX} vs Local Adam (all three every {KX} steps)",
          f"DES-LOC matches Local Adam (mean loss within {MATCH:.0%}) at >= 2x fewer bytes per step (the "
          "paper's 2x less than Local Adam)",
          ("local-adam", "desloc"), _desloc, show_bytes=True),
)

# The text suite's workload, metric, checks' baseline and notes, with the field's runs and claims.
FIELD = replace(
    TEXT, name="field", runs=RUNS, quick_runs=QUICK_RUNS, claims=CLAIMS,
    note=f"the field's methods on the text workload: model=gpt on Shakespeare (char), 2 workers x batch 32 "
         f"x 64 tokens, {STEPS} steps; spread = half the range over seeds\n\n",
    quick_help=f"field: {QUICK_STEPS} steps")
