"""The text suite (`compbench claims --suite text`): the transformer-era findings of ALGORITHMS.md
("Transformer-era methods") on char-level Shakespeare with the small nanoGPT (model=gpt: 4 layers,
width 128, 0.8M parameters, context 64), 2 workers x batch 32 (4,096 tokens per step).

Setting (every run adds BASE, then its own overrides, then `seed=S`): STEPS steps (max_steps; the
training set is ~1,080 steps per epoch, so a run sees about half of it), a constant learning rate
after a linear warm-up of 5% of an epoch (54 steps; a cosine over `epochs` would be cut off by
max_steps at an arbitrary point), evaluated at the end on 512 windows of the held-out plays.
SEEDS=2 seeds per run, 3 for the three of RUN_SEEDS: 6 runs x 2 + 3 runs x 3 = 21 trainings.

Runs: DDP-AdamW (dense allreduce of the gradients every step), top-k and random-k at 1% with
residual error feedback under AdamW over allgather, DiLoCo with H=30 inner AdamW steps, SparseLoCo
(experiment=sparseloco: H=30, 1.56% chunked top-k in 2 bits), DeMo (optim=sgd: lr DEMO_LR, no weight
decay), 1-bit Adam with a dense warm-up of 15% of the steps (sync.freeze_step) and its recipe's
300-step learning-rate warm-up (120 in --quick) and weight decay 0, and DDP-AdamW with that same
schedule and decay (adamw-onebit-schedule), and 1-bit Adam's own rule never compressed
(onebit-adam-dense: sync.freeze_step past the last step), the claim's control. DeepSpeed's rule has no
bias correction, so its early steps are 3-6x Adam's (3.4x at the freeze) and it is a different
optimizer from AdamW at the same lr: against AdamW the claim would measure the rule, not the 1-bit
compression (docs/results.md, "1-bit Adam's control"). 1-bit Adam and its controls run 3 seeds
(RUN_SEEDS: 1-bit Adam once missed in one seed of two). The field's other methods have their own
suite on the same workload (`--suite field`, compbench.claims.field).

Budget: the full suite in about 95 minutes on 2 cores (1-bit Adam's runs take ~10 minutes each on
the shaped link), --quick in 10; measured on this project's 2-core
machine, see docs/results.md "Text workload".

Checks (decided before the runs; the final validation loss is lower-is-better):
- "loses to" / "beats": the seeds' [min, max] intervals of the losses are disjoint, in that order.
- "approaches" / "stays near": the mean loss is at most NEAR (5%) above DDP-AdamW's.
- "matches": the mean losses differ by at most MATCH (2%) of the reference's (1-bit Adam's: its own
  rule, dense, on its schedule), either way: a lower loss beyond it is not "the same convergence".
- "at >= Nx fewer bytes": bytes sent per step (results.json's bytes_sent_per_step, a mean over
  whole rounds for DiLoCo-type runs) at most 1/N of the other run's.
"""

from __future__ import annotations

from collections.abc import Mapping

from compbench.claims.findings import Claim, Results, Stat, Suite

STEPS = 600          # per run, full suite
QUICK_STEPS = 240    # per run, --quick
SEEDS = 2
RUN_SEEDS = {"onebit-adam": 3, "onebit-adam-dense": 3, "adamw-onebit-schedule": 3}
H = 30               # DiLoCo's and SparseLoCo's inner steps per round
DEMO_LR = 1e-3       # DeMo's sign step (optim=sgd's lr): tuned on 200 steps, see docs/results.md
WARMUP = 0.15        # 1-bit Adam's (and 1-bit LAMB's, the field suite) dense warm-up: a fraction of steps
ONEBIT_RATE_WARMUP = 300  # 1-bit Adam's rate warm-up (its recipe's) over STEPS; in proportion for --quick
NEAR = 0.05          # "approaches", "stays near": at most 5% above DDP-AdamW's loss
MATCH = 0.02         # "matches": within 2% of DDP-AdamW's loss
FEWER = 30           # ">= 30x fewer bytes"

_COMMON = ("model=gpt", "dataset=shakespeare", "engine.np=2", "batch_size=32", "epochs=1",
           "optim.lr_schedule=constant", "optim.warmup_epochs=0.05", "progress=false", "checkpoint=false",
           "on_nonfinite=ignore")
BASE = (*_COMMON, f"max_steps={STEPS}")
QUICK = (*_COMMON, f"max_steps={QUICK_STEPS}")


def runs(steps: int) -> Mapping[str, tuple[str, ...]]:
    """name -> overrides on top of BASE (QUICK): only the 1-bit methods' warm-ups depend on the steps."""
    rate_warmup = f"optim.warmup_steps={round(ONEBIT_RATE_WARMUP * steps / STEPS)}"
    onebit = ("optim=adamw", "sync=onebit_adam")
    return {
        "ddp-adamw": ("optim=adamw", "compressor=none", "comm=allreduce"),
        "topk-adamw": ("optim=adamw", "compressor=topk", "ratio=0.01", "memory=residual", "comm=allgather"),
        "randk-adamw": ("optim=adamw", "compressor=randk", "ratio=0.01", "memory=residual", "comm=allgather"),
        "diloco": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}"),
        "sparseloco": ("experiment=sparseloco", "optim=adamw", f"sync.inner_steps={H}"),
        "demo": ("sync=demo", "optim=sgd", f"optim.lr={DEMO_LR:g}", "optim.weight_decay=0"),
        # its recipe's 300-step rate warm-up, named: BASE's optim.warmup_epochs would replace it
        "onebit-adam": (*onebit, f"sync.freeze_step={round(WARMUP * steps)}", rate_warmup),
        # the claim's control: the same rule (no bias correction) and schedule, its warm-up never ending
        "onebit-adam-dense": (*onebit, f"sync.freeze_step={steps + 1}", rate_warmup),
        # the same schedule and weight decay (1-bit Adam's recipe sets 0) without compression
        "adamw-onebit-schedule": ("optim=adamw", "compressor=none", "comm=allreduce", rate_warmup,
                                  "optim.weight_decay=0"),
    }


RUNS = runs(STEPS)
QUICK_RUNS = runs(QUICK_STEPS)


def loses(a: Stat, b: Stat) -> bool:
    """a's loss is above b's beyond seed noise (a's lowest seed above b's highest)."""
    return a.lo > b.hi


def near(a: Stat, ref: Stat, tolerance: float = NEAR) -> bool:
    return a.mean <= ref.mean * (1 + tolerance)


def fewer_bytes(a: Stat, b: Stat, factor: float) -> bool:
    """a sends at most 1/factor of b's bytes per step (False when either has no bytes recorded)."""
    sent, other = a.bytes_per_step, b.bytes_per_step
    return sent is not None and other is not None and other > 0 and sent * factor <= other


def _classic(r: Results) -> bool:
    return loses(r["topk-adamw"], r["ddp-adamw"]) and loses(r["randk-adamw"], r["topk-adamw"])


def _diloco(r: Results) -> bool:
    # 1/H of DDP's bytes, with 5% slack for the round's framing (allreduce of the whole outer gradient).
    return near(r["diloco"], r["ddp-adamw"]) and fewer_bytes(r["diloco"], r["ddp-adamw"], H / 1.05)


def _sparseloco(r: Results) -> bool:
    return loses(r["diloco"], r["sparseloco"]) and fewer_bytes(r["sparseloco"], r["diloco"], FEWER)


def _demo(r: Results) -> bool:
    return near(r["demo"], r["ddp-adamw"]) and fewer_bytes(r["demo"], r["ddp-adamw"], FEWER)


def _onebit(r: Results) -> bool:
    ref = r["onebit-adam-dense"].mean
    return abs(r["onebit-adam"].mean - ref) <= MATCH * ref




CLAIMS: tuple[Claim, ...] = (
    Claim("adamw-classic-compressors", "1-bit Adam (Tang et al., ICML 2021), 0/1 Adam (Lu et al., 2022)",
          "topk, randk at ratio 0.01 with memory=residual over allgather, optim=adamw",
          "per-step compressors with error feedback lose to DDP-AdamW under AdamW (higher loss, seed "
          "intervals disjoint), random-k the worst (above top-k)",
          ("ddp-adamw", "topk-adamw", "randk-adamw"), _classic, show_bytes=True),
    Claim("diloco-approaches-ddp", "DiLoCo (Douillard et al., 2023)",
          f"sync=diloco, H={H} inner AdamW steps, outer Nesterov SGD lr 0.7, dense outer gradient",
          f"DiLoCo's loss within {NEAR:.0%} of DDP-AdamW's at <= 1.05/H of its bytes per step",
          ("ddp-adamw", "diloco"), _diloco, show_bytes=True),
    Claim("sparseloco-beats-diloco", "SparseLoCo (Sarfi et al., 2025)",
          f"experiment=sparseloco (H={H}, chunked top-k 1.56% in 2 bits, error accumulator) vs sync=diloco",
          f"SparseLoCo beats DiLoCo (lower loss, seed intervals disjoint) at >= {FEWER}x fewer bytes",
          ("diloco", "sparseloco"), _sparseloco, show_bytes=True),
    Claim("demo-near-adamw", "DeMo (Peng, Quesnelle, Kingma, 2024)",
          f"sync=demo (DCT top-32 of 64x64 chunks), optim=sgd lr {DEMO_LR:g}",
          f"DeMo's loss within {NEAR:.0%} of DDP-AdamW's at >= {FEWER}x fewer bytes per step",
          ("ddp-adamw", "demo"), _demo, show_bytes=True),
    Claim("onebit-adam-matches-adam", "1-bit Adam (Tang et al., ICML 2021)",
          f"sync=onebit_adam, dense warm-up {WARMUP:.0%} of the steps, then 1-bit momentum with EF; its "
          f"recipe's {ONEBIT_RATE_WARMUP}-step rate warm-up and weight decay 0; its rule dense (never "
          "frozen) and AdamW on the same",
          f"1-bit Adam matches its dense rule after the warm-up: mean loss within {MATCH:.0%} of "
          "onebit-adam-dense's (DeepSpeed's Adam without bias correction) on the same schedule",
          ("adamw-onebit-schedule", "onebit-adam-dense", "onebit-adam"), _onebit, show_bytes=True),
)

TEXT = Suite(
    name="text", runs=RUNS, quick_runs=QUICK_RUNS, claims=CLAIMS, base=BASE, quick=QUICK, seeds=SEEDS,
    metric="final_eval_loss", metric_label="final validation loss (nats/token)", higher_is_better=False,
    baseline="ddp-adamw",
    note=f"model=gpt on Shakespeare (char), 2 workers x batch 32 x 64 tokens, {STEPS} steps; "
         f"spread = half the range over seeds\n\n",
    quick_note=f"quick smoke run ({QUICK_STEPS} steps, 1 seed): the machinery works; NOT evidence for or "
               "against any claim\n\n",
    quick_help=f"text: {QUICK_STEPS} steps", full_steps=lambda: STEPS, eval_s=3.0, method_table=True,
    run_seeds=RUN_SEEDS)
