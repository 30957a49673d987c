"""The races as data: a workload (BASE overrides), the methods (name -> overrides), the links (a rate
in Mbit/s, shaped with net.emulate_gbps, and a one-way delay in ms, net.emulate_latency_us: netem or
compbench's delay line), the target and the training-time budget of every run.

The links of the text, field and cnn races: 10, 100 and 1000 Mbit/s without delay (a data centre's),
and 200 Mbit/s with 25 ms each way (a link between sites: a round trip of 50 ms).

text (default): the text workload of `compbench claims --suite text` (model=gpt on Shakespeare, 2
workers x batch 32 x 64 tokens, constant lr after a 5% warm-up), engine=torch, validation on 256
windows of the held-out works (no out-of-domain text: the race needs one loss). Methods at their
wire floor: DDP-AdamW (dense allreduce of the gradients in DDP's 1 MB buckets, overlapping
back-propagation) and its 16-bit twin (ddp-fp16: the fp16 wire of every data-centre run), DiLoCo
on one worker with the global batch (diloco-1worker: no communication, DiLoCo's outer optimizer
alone), DiLoCo
(H=30) and Streaming DiLoCo (3 fragments, 4-bit QSGD outer gradients) with the eager update,
SparseLoCo (experiment=sparseloco, eager), DeMo and 1-bit Adam with their recipes: one collective
set per step. Target: validation loss 2.3 (DDP-AdamW gets there in ~225 steps, ~40 s on an idle
2-core machine); budget 90 s of training per run.

field: the field's other methods on the text workload, with DDP-AdamW and DiLoCo as references:
MuLoCo (experiment=muloco: Muon inner steps, 1-bit outer gradients with error feedback, eager),
DES-LOC (sync=desloc at K_x=10, K_u=30, K_v=60), 1-bit LAMB (optim.lr 1e-2, the claims suite's),
NoLoCo (H=30) and SPARTA (p=0.005). The text race's links, target and budget.

cnn: the seeds' compressors on Fashion-MNIST (model=cnn, 2 workers x batch 64, the claims suite's
setting): fp32, DGC and DRAGONN at 0.1%, top-k at 1%, QSGD (8 bits) and PowerSGD (rank 1), each with
its recipe. Target: test accuracy 85%; budget 60 s.

sharded: sharded data parallelism against DDP on a wider, shallower GPT (model=gpt, 2 layers of
width 256, 32-token windows, 2 workers x batch 16: 1.6M parameters), engine=torch: DDP-AdamW (as the
text race's), FSDP (ZeRO-3, fp32 all-gathers and reduce-scatters), ZeRO++-style FSDP (qwZ int8
weights, qgZ int8 gradients through an all-to-all; hpZ needs nodes) and HSDP + DiLoCo (4 workers:
shard groups of 2, DiLoCo's outer step across them every 10 steps). A worker's fp32 parameters,
gradients and AdamW state (25 MB under DDP) outweigh its activations (17 MB, measured): a 2-worker
FSDP run holds half of that state, about 0.8 of DDP's memory per worker in all (its activations are
not sharded, and it holds a unit's gathered weights and the next one's). A preset where the state
dwarfs the activations (fewer tokens a step, a wider model) would come nearer one half, but each
FSDP worker sends 1.5x the model's fp32 bytes a step (2 workers): at 100 Mbit/s it would not reach a
target within the race's time. The report's what-if says each method's memory per worker and whether
it fits (--memory-gb) at --workers, and at other model sizes (--params). Links 1 Gbit/s and 100
Mbit/s, one seed. Target: validation loss 2.5 (DDP-AdamW got there in ~75 steps, unshaped); budget
90 s of training per run: 8 runs, about 7 minutes on an idle 2-core machine by the model's step
times (every run to its budget: about 15).

--quick: one seed, the same links, a nearer target and a shorter budget (a smoke test of the
machinery and a first look; not evidence).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from compbench.race.scenarios import NONE, SCENARIOS


class Link(NamedTuple):
    """A race's link: its rate each way (Mbit/s) and its one-way delay between two workers (ms); or a
    link that changes, replayed from a trace (`trace`: a shipped trace's name or a file's absolute
    path, net.trace; compbench.race.on_trace), whose `mbps` is then the trace's mean rate of the
    slowest worker's link over the trace (what orders it among the links; nothing is shaped to it)
    and `delay_ms` 0. `scenario`: the fault scenario its runs ran under (compbench.race.scenarios;
    "" for none): a race's runs are told apart by their link and scenario together, so each scenario
    is a condition of its own in every table, verdict and folder."""

    mbps: float
    delay_ms: float = 0.0
    trace: str = ""
    scenario: str = ""

    def __str__(self) -> str:
        """As --links takes it: `100`, `200:25` with a delay, `trace:diurnal` replayed from a trace."""
        if self.trace:
            return f"trace:{self.trace}"
        return f"{self.mbps:g}:{self.delay_ms:g}" if self.delay_ms else f"{self.mbps:g}"

    @property
    def trace_name(self) -> str:
        """A trace's name: a shipped one's, or its file's stem."""
        return self.trace.rpartition("/")[2].removesuffix(".csv")

    @property
    def label(self) -> str:
        """In words, with its fault scenario's name where it has one."""
        if self.trace:
            text = f"trace {self.trace_name} (mean {self.mbps:.4g} Mbit/s)"
        else:
            text = f"{self.mbps:g} Mbit/s" + (f", {self.delay_ms:g} ms" if self.delay_ms else "")
        return f"{text}, {self.scenario}" if self.scenario else text

    @property
    def folder(self) -> str:
        """The link's part of a run's folder name, its fault scenario's after it (a link without delay
        or scenario keeps its older name)."""
        if self.trace:
            name = f"trace-{self.trace_name}"
        else:
            name = f"{self.mbps:g}mbps" + (f"-{self.delay_ms:g}ms" if self.delay_ms else "")
        return f"{name}-{self.scenario}" if self.scenario else name

    @property
    def fault(self) -> str:
        """Its fault scenario's name: `none` where it has none."""
        return self.scenario or NONE

    @property
    def shaped(self) -> Link:
        """The same link without its fault scenario."""
        return self._replace(scenario="")

    @property
    def overrides(self) -> tuple[str, ...]:
        """Its runs' overrides: the link's (net.*), then its fault scenario's."""
        faults = SCENARIOS[self.scenario].overrides if self.scenario else ()
        if self.trace:
            return (f"net.trace={self.trace}", *faults)
        delay = (f"net.emulate_latency_us={self.delay_ms * 1e3:g}",) if self.delay_ms else ()
        return (f"net.emulate_gbps={self.mbps / 1e3:g}", *delay, *faults)


LINKS = (Link(10), Link(100), Link(1000), Link(200, 25))


@dataclass(frozen=True)
class Race:
    name: str
    base: tuple[str, ...]
    methods: Mapping[str, tuple[str, ...]]
    baseline: str              # the method every other is compared with (DDP)
    links: tuple[Link, ...]
    target: str                # "target_loss=V" or "target_acc1=V"
    budget_s: float            # max_train_s of every run
    seeds: int
    quick_target: str
    quick_budget_s: float
    units: str                 # "tokens" or "samples"
    # methods that run more seeds than `seeds` in the full race (one that once missed in a seed);
    # --seeds N and --quick set every method's
    method_seeds: Mapping[str, int] = field(default_factory=dict)

    def seeds_of(self, method: str, seeds: int | None, quick: bool) -> int:
        """A method's seeds: --seeds N, else 1 for --quick, else its own or the race's."""
        if seeds is not None:
            return seeds
        return 1 if quick else max(self.seeds, self.method_seeds.get(method, 0))

    @property
    def metric(self) -> str:
        return "eval/loss" if self.target.startswith("target_loss") else "eval/acc1"

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "eval/acc1"


H = 30  # DiLoCo-family inner steps per round
TEXT = Race(
    name="text",
    base=("model=gpt", "dataset=shakespeare", "dataset.ood=null", "dataset.eval_windows=256",
          "engine=torch", "engine.np=2", "batch_size=32", "epochs=1", "optim.lr_schedule=constant",
          "optim.warmup_epochs=0.05", "progress=false", "checkpoint=false", "on_nonfinite=ignore"),
    methods={
        # DDP's bucketing (buckets of 1 MB, DDP's first bucket, in back-propagation order, each one
        # allreduce sent from the backward hooks): 4 allreduces a step instead of one per tensor (52),
        # whose round trips a link with delay would charge one after another (648 against 280 ms a
        # step at 200 Mbit/s with 5 ms; 264 against 217 at 1 Gbit/s without delay)
        "ddp-adamw": ("optim=adamw", "compressor=none", "comm=allreduce", "scheduler=bucket",
                      "scheduler.bucket_mb=1"),
        # the baselines a reviewer asks for: the 16-bit dense wire every data-centre run uses, and
        # DiLoCo on one worker with the same global batch (no communication: what of DiLoCo's result
        # is its outer optimizer)
        "ddp-fp16": ("optim=adamw", "compressor=fp16", "comm=allreduce", "scheduler=bucket",
                     "scheduler.bucket_mb=1"),
        "diloco": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}", "sync.eager=true"),
        # DiLoCo's own update (no eager step): the exchange exposed once a round, the replicas equal after
        # it; the lock-step reference of the modes that do not wait (quorum, per-worker steps, HALoS:
        # none has the eager step). On this workload the eager step costs tokens (docs' results page)
        "diloco-plain": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}"),
        # DiLoCo's outer step one round late (sync=delayed_diloco, PCCL's asynchronous DiLoCo): each
        # round's exchange travels behind the next round's inner steps; every worker's θ stays the same.
        # PCCL's example's outer SGD (lr 0.7, no momentum): on this workload's 240 steps it ended at 2.82
        # against 3.03 with DiLoCo's Nesterov momentum applied to late averages (docs' synchronization)
        "diloco-delayed": ("optim=adamw", "sync=delayed_diloco", f"sync.inner_steps={H}", "sync.staleness=1",
                           "sync.outer_momentum=0", "sync.nesterov=false"),
        # DiLoCo around a quorum synchronizer (sync=quorum_diloco, after Decoupled DiLoCo): a merge needs
        # one learner of the two and waits the adaptive window for the other (no fault: both are in)
        "diloco-quorum": ("optim=adamw", "sync=quorum_diloco", f"sync.inner_steps={H}", "sync.quorum=1"),
        # DiLoCo with per-worker sync intervals (torchft's per-replica sync_every): each round's H_r from
        # the last round's measured compute (a 3x straggler trains about H/3 steps), token-weighted
        # average; DiLoCo's own update, as diloco-plain
        "diloco-perworker": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}",
                             "sync.inner_steps_per_worker=adaptive"),
        # HALoS (sync=halos): a local parameter server per region (here each worker its own region) and a
        # global one, neither waiting for a worker; the paper's K=32 pushes would never come in a run this
        # short, so 4 (and the momentum every 4 updates), with the larger steps a short run takes
        "halos": ("optim=adamw", "sync=halos", "sync.regions=2", "sync.inner_steps=8", "sync.accumulation=4",
                  "sync.local_delay=4", "sync.local_lr=0.5", "sync.global_lr=0.5"),
        "diloco-1worker": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}", "engine.np=1",
                           "batch_size=64"),
        "streaming": ("optim=adamw", "sync=diloco", f"sync.inner_steps={H}", "sync.fragments=3",
                      "sync.eager=true", "compressor=qsgd", "compressor.levels=7", "comm=allgather"),
        "sparseloco": ("experiment=sparseloco", "optim=adamw", f"sync.inner_steps={H}", "sync.eager=true"),
        "demo": ("sync=demo", "optim=sgd", "optim.lr=1e-3", "optim.weight_decay=0"),
        # the race's common warm-up (base's optim.warmup_epochs), not the recipe's 300 steps, which
        # would take most of a 90-second budget at 10 Mbit/s: every method races on one schedule
        "onebit-adam": ("optim=adamw", "sync=onebit_adam", "sync.freeze_step=40"),
    },
    baseline="ddp-adamw", links=LINKS, target="target_loss=2.3", budget_s=90, seeds=2,
    quick_target="target_loss=2.7", quick_budget_s=20, units="tokens",
    method_seeds={"onebit-adam": 3})  # it once stayed near 3 nats in one seed of two (docs/results.md)

FIELD = Race(
    name="field", base=TEXT.base,
    methods={
        "ddp-adamw": TEXT.methods["ddp-adamw"],
        "diloco": TEXT.methods["diloco"],
        "muloco": ("experiment=muloco", f"sync.inner_steps={H}", "sync.eager=true"),
        "desloc": ("sync=desloc", "optim=adamw", "sync.param_period=10", "sync.first_moment_period=30",
                   "sync.second_moment_period=60"),
        "onebit-lamb": ("optim=adamw", "optim.lr=1e-2", "sync=onebit_lamb", "sync.freeze_step=40"),
        "noloco": ("optim=adamw", "sync=noloco", f"sync.inner_steps={H}"),
        "sparta": ("optim=adamw", "sync=sparta"),
    },
    baseline="ddp-adamw", links=LINKS, target=TEXT.target, budget_s=TEXT.budget_s,
    seeds=TEXT.seeds, quick_target=TEXT.quick_target, quick_budget_s=TEXT.quick_budget_s, units="tokens")

CNN = Race(
    name="cnn",
    base=("model=cnn", "dataset=fashion_mnist", "engine=torch", "engine.np=2", "batch_size=64", "epochs=3",
          "progress=false", "checkpoint=false", "on_nonfinite=ignore"),
    methods={
        "fp32": ("compressor=none", "comm=allreduce"),
        "dgc": ("compressor=dgc", "ratio=0.001", "comm=allgather"),
        "dragonn": ("compressor=dragonn", "ratio=0.001", "comm=allgather"),
        "topk": ("compressor=topk", "ratio=0.01", "comm=allgather"),
        "qsgd": ("compressor=qsgd", "comm=allgather"),
        "powersgd": ("compressor=powersgd", "comm=allreduce"),
    },
    baseline="fp32", links=LINKS, target="target_acc1=85", budget_s=60, seeds=2,
    quick_target="target_acc1=75", quick_budget_s=20, units="samples")

# The sharded race's GPT: wide and shallow, short windows and a small batch, so that a worker's fp32
# parameters, gradients and AdamW state (16 bytes a parameter: 25 MB) outweigh its activations (17 MB)
SHARDED_MODEL = ("model=gpt", "model.n_layer=2", "model.n_embd=256", "model.n_head=4", "dataset=shakespeare",
                 "dataset.block_size=32", "batch_size=16")
SHARDED = Race(
    name="sharded",
    base=(*SHARDED_MODEL, "dataset.ood=null", "dataset.eval_windows=256", "engine=torch", "epochs=1",
          "optim.lr_schedule=constant", "optim.warmup_steps=20", "eval_every_steps=25", "progress=false",
          "checkpoint=false", "on_nonfinite=ignore"),
    methods={  # the workers are each method's: HSDP needs two shard groups of 2
        "ddp-adamw": ("engine.np=2", *TEXT.methods["ddp-adamw"]),
        "fsdp": ("engine.np=2", "optim=adamw", "sharding=fsdp"),
        "zeropp": ("engine.np=2", "optim=adamw", "sharding=fsdp", "sharding.gather=int8",
                   "sharding.scatter=int8"),
        "hsdp-diloco": ("engine.np=4", "optim=adamw", "sharding=hsdp", "sharding.group_size=2", "sync=diloco",
                        "sync.inner_steps=10"),
    },
    baseline="ddp-adamw", links=(Link(1000), Link(100)), target="target_loss=2.5", budget_s=90, seeds=1,
    quick_target="target_loss=2.9", quick_budget_s=30, units="tokens")

RACES = {r.name: r for r in (TEXT, FIELD, CNN, SHARDED)}
