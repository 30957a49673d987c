"""The results schema: what a run records and how it reads back. `TAGS` / `LM_TAGS` are the one table
of every TensorBoard scalar (unit, one-line description), `SUMMARY` says how each figure of
results.json's summary is taken; `format_summary`, `headline` and `split_ms` read a results.json
back, `write_json_atomic` writes one. The trainer's recorder (compbench.train.metrics) writes by this
schema; report, sweep, race, bench and the run folder read by it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# comm_exposed: communication (and decoding) the step waited for after back-propagation ended,
# i.e. the part not hidden behind compute.
# The parts of `other` that are timed (the rest of it is the loop's own Python: batches, hooks'
# bookkeeping, the synchronization mode's step calls): the gradients' finiteness check, the
# scheduler writing the averages into .grad, and reading the step's loss (on a GPU: the wait for it).
OTHER_PARTS = ("check", "write_back", "loss_read")
PHASES = ("compute", "compress", "comm", "comm_exposed", "decompress", "optimizer", *OTHER_PARTS, "step")
# The disjoint parts of a step (comm_exposed is a part of comm + decompress): with `other`, the
# time none of them accounts for (OTHER_PARTS and the loop's own Python), they add up to the step.
SPLIT = ("compute", "compress", "comm", "decompress", "optimizer")
WARMUP_STEPS = 5  # summary medians skip these first steps (allocations, first collectives)

TAGS: dict[str, tuple[str, str]] = {
    "train/loss": ("nats", "cross-entropy of rank 0's batch at this step"),
    "train/throughput": ("samples/s", "samples trained per second, all workers: global batch / step time"),
    "train/lr": ("lr", "learning rate of the first parameter group, as scheduled for the next step"),
    "eval/acc1": ("%", "top-1 accuracy on the whole test set (all workers) at each evaluation"),
    "eval/loss": ("nats", "cross-entropy per sample on the whole test set (all workers) at each evaluation"),
    "time/compute_ms": ("ms", "forward and backward, less compression and communication run inside backward"),
    "time/compress_ms": ("ms", "error-feedback memory and encoding of the compressed tensors"),
    "time/comm_ms": ("ms", "starting and waiting for collectives, less encoding and decoding inside them"),
    "time/comm_exposed_ms": ("ms", "communication and decoding waited for after backward (not hidden)"),
    "time/comm_cpu_ms": ("ms", "on a CPU: the process's CPU time (all its threads) while communication was "
                               "the running phase: the part of comm that was work on this machine's cores "
                               "(packing, copies, the collectives' threads) rather than waiting"),
    "time/comm_skew_ms": ("ms", "a part of comm_exposed: rank 0's wait at the step's exchange for the last "
                                "rank to get there (the ranks' different speeds, not the wire; ranks on one "
                                "machine, compared on its shared clock at the end of training)"),
    "time/comm_exposed_less_skew_ms": ("ms", "comm_exposed less its decoding and less comm_skew, step by "
                                             "step: the exposed communication that was neither decoding "
                                             "nor the wait for the last rank (the wire, the collective, "
                                             "the framing)"),
    "time/decompress_ms": ("ms", "decoding received payloads into the averaged dense gradient"),
    "time/optimizer_ms": ("ms", "optimizer step and learning-rate schedule"),
    "time/other_ms": ("ms", "step - (compute + compress + comm + decompress + optimizer): time/check_ms, "
                            "time/write_back_ms, time/loss_read_ms and the loop's own Python"),
    "time/check_ms": ("ms", "a part of other: the gradients' finiteness check (on_nonfinite=raise or skip)"),
    "time/write_back_ms": ("ms", "a part of other: the scheduler writing the averaged gradients into .grad"),
    "time/loss_read_ms": ("ms", "a part of other: reading the step's loss (on a GPU: waiting for the step's "
                                "work to end)"),
    "time/step_ms": ("ms", "wall time of the whole training step on rank 0"),
    "time/step_unloaded_ms": ("ms", "on a CPU: the step's time on a machine nobody else loads, estimated "
                                    "as its communication's wall time plus the process CPU time of the "
                                    "rest over the compute threads"),
    "comm/bytes_sent": ("bytes", "bytes one worker put on the wire this step (payloads, headers, padding)"),
    "comm/bytes_sent_total": ("bytes", "bytes one worker put on the wire since the run began (resumes "
                              "included)"),
    "comm/bytes_dense": ("bytes", "fp32 bytes of the same gradients uncompressed, per worker and step"),
    "comm/ratio_effective": ("x", "at each step that sends: the dense bytes of the steps since the last one "
                                  "that sent over this step's bytes (a round's, for a periodic mode)"),
    "comm/bytes_allreduce": ("bytes", "part of bytes_sent that went uncompressed through the fp32 allreduce"),
    "comm/calls_compressed": ("calls", "collectives started per step for compressed tensors"),
    "comm/calls_dense": ("calls", "collectives started per step for tensors sent dense"),
    "compress/sampled_reads": ("elements", "elements the encodes read at random places (thresholds' uniform "
                                           "samples), per worker and step"),
}

# A language-model run (compbench.train.task) writes these instead of eval/acc1 and train/throughput.
LM_TAGS: dict[str, tuple[str, str]] = {
    **{k: v for k, v in TAGS.items() if k not in ("eval/acc1", "train/throughput")},
    "train/loss": ("nats", "cross-entropy per token of rank 0's batch at this step"),
    "train/tokens_per_s": ("tokens/s", "tokens predicted per second, all workers: global batch x context / "
                                       "step time"),
    "eval/loss": ("nats", "cross-entropy per token on the validation works (all workers) at each evaluation"),
    "eval/ppl": ("x", "perplexity on the validation works: exp(eval/loss)"),
    "eval/ood_loss": ("nats", "cross-entropy per token on the out-of-domain text (dataset.ood)"),
    "eval/ood_ppl": ("x", "perplexity on the out-of-domain text: exp(eval/ood_loss)"),
}
# Written besides those by the modes whose workers' parameters differ between exchanges
# (SyncTraits.replicas_diverge: compbench.train.replicas); eval/acc1_averaged by classifiers,
# eval/ppl_averaged by language models.
REPLICA_TAGS: dict[str, tuple[str, str]] = {
    "eval/loss_averaged": ("nats", "eval/loss of the workers' averaged parameters (eval/loss: each "
                                   "worker's own)"),
    "eval/acc1_averaged": ("%", "eval/acc1 of the workers' averaged parameters"),
    "eval/ppl_averaged": ("x", "eval/ppl of the workers' averaged parameters"),
    "replica/distance": ("x", "mean over workers of ||theta_r - mean theta|| / ||mean theta|| at each "
                              "evaluation"),
}
# Written by elastic runs (engine.elastic: compbench.train.elastic), at every step and each recovery.
ELASTIC_TAGS: dict[str, tuple[str, str]] = {
    "elastic/workers": ("workers", "workers that trained this step (engine.elastic: the world shrinks when "
                                   "one fails and grows when one joins)"),
    "elastic/lost_s": ("s", "at a recovery's step: seconds from the last commit to training again (the "
                            "dropped work, the failure's detection, the new rendezvous and the rebuild)"),
}
# Written by sharded runs (sharding=fsdp|hsdp: compbench.sync.sharded), at every step. Bytes as ZeRO++
# counts volume: a unit's whole gathered weights per all-gather, its whole gradient per reduce-scatter.
SHARDED_TAGS: dict[str, tuple[str, str]] = {
    "comm/bytes_gathered": ("bytes", "FSDP's weight all-gathers this step (forward and backward), each "
                                     "unit's whole gathered buffer as it travels (a part of bytes_sent)"),
    "comm/bytes_scattered": ("bytes", "FSDP's gradient reduce-scatters this step, each unit's whole input as "
                                      "it travels (a part of bytes_sent)"),
    "comm/bytes_replica": ("bytes", "the synchronization across shard groups (HSDP's replicas): bytes_sent "
                                    "less the gathered and scattered"),
    "comm/bytes_cross_node": ("bytes", "the gathered and scattered bytes of collectives whose group spans "
                                       "nodes"),
    "time/gathered_ms": ("ms", "wall time inside the weight all-gathers (encode, collective, decode): inside "
                               "compute's span, booked to compress, comm and decompress"),
    "time/scattered_ms": ("ms", "wall time inside the gradient reduce-scatters, as time/gathered_ms"),
}
_EVALUATED = {**TAGS, **LM_TAGS, **REPLICA_TAGS}
# Each evaluation's figures again, as series of their own against an x axis that compares runs from 0:
# the training milliseconds, and the bytes one worker sent, at the evaluation.
BY_AXIS = {f"by_{axis}/{tag}": (unit, f"{about}; the step axis is {what}")
           for tag, (unit, about) in _EVALUATED.items() if tag.startswith(("eval/", "replica/"))
           for axis, what in (("train_ms", "training milliseconds"), ("bytes_sent", "bytes one worker sent"))}
DESCRIBED = {**TAGS, **{k: v for k, v in LM_TAGS.items() if k not in TAGS}, **REPLICA_TAGS, **ELASTIC_TAGS,
             **SHARDED_TAGS, **BY_AXIS}

_MEDIAN = f"median of {{tag}} after {WARMUP_STEPS} warm-up steps ({{unit}})"
# Per-step rates: units (samples or tokens) over the step's time.
RATE_TAGS = ("train/throughput", "train/tokens_per_s")
# With a periodic synchronization (sync=diloco) the per-step figures are means over whole rounds.
ROUND_MEAN = (f"mean of each per-step figure over the whole rounds after {WARMUP_STEPS} warm-up steps "
              "(throughput: the rounds' samples or tokens over their time)")
SUMMARY: dict[str, str] = {
    "steps": "optimizer steps taken (skipped non-finite steps included)",
    "train_time_s": "wall time of the training loop on rank 0, evaluation included (s)",
    "train_s": "training seconds: the steps' wall times on rank 0, evaluations and checkpoints left out "
               "(the curve's clock) (s)",
    "eval_s": "evaluation seconds on rank 0 (s)",
    "faults": "engine.elastic or injected faults: recoveries by kind (failure, join, restart), seconds lost "
              "to them, and the steps trained at each world size",
    "final_acc1": "eval/acc1 at the last evaluation (the run's last step) (%)",
    "final_test_loss": "eval/loss at the last evaluation (nats per sample)",
    "not_evaluated": "why the run has no evaluation (eval=false)",
    "best_acc1": "highest eval/acc1 of any evaluation (%)",
    "stopped_by": "what ended the run early: target (stop_at_target) or max_train_s; null otherwise",
    "peak_bytes_per_step": "the most bytes one worker sent in one step (a round's exchange) (bytes)",
    "utilization": "compute_ms / step_ms: the part of a step spent computing (forward and backward)",
    "target": "the target (metric, value) and, where it was reached, the first evaluation that did: "
              "step, training seconds, wall seconds, samples or tokens, bytes sent",
    "final_loss": "train/loss at the last step (nats)",
    "memory_mb": "per worker, in rank order: megabytes of its parameters, gradients and optimizer state (its "
                 "shards where sharded) and of the activations and gathered weights forward saved, measured "
                 "on the first steps, and the process's peak (peak_of: what measured it)",
    "goodput": "the share of the workers' time that trained the model: (compute + optimizer seconds of every "
               "worker, less the compute a mode discarded) / (workers x train_time_s), with idle_share, "
               "discarded_share, step_goodput (over the steps' time only) and each worker's seconds "
               "(compbench.records.goodput)",
    "sharded": "sharding=fsdp|hsdp: the layout, and per step the bytes gathered, scattered, across replicas "
               "and across nodes, and the milliseconds inside the all-gathers and reduce-scatters",
    "throughput": _MEDIAN.format(tag="train/throughput", unit="samples/s"),
    **{f"{p}_ms": _MEDIAN.format(tag=f"time/{p}_ms", unit="ms") for p in PHASES},
    "comm_cpu_ms": _MEDIAN.format(tag="time/comm_cpu_ms", unit="ms") + ": CPU work inside comm_ms",
    "comm_skew_ms": _MEDIAN.format(tag="time/comm_skew_ms", unit="ms") + ": the part of comm_exposed_ms "
                    "rank 0 waited for the last rank to get to the exchange (null: ranks on machines of "
                    "their own, or an elastic run)",
    "comm_exposed_less_skew_ms": _MEDIAN.format(tag="time/comm_exposed_less_skew_ms", unit="ms")
    + ": the exposed communication that was neither decoding nor the wait for the last rank, taken "
      "step by step (not comm_exposed_ms - decompress_ms - comm_skew_ms: medians of the parts; null "
      "where comm_skew_ms is)",
    "step_ms_q1": "first quartile of time/step_ms after the warm-up steps (a round's mean for a periodic "
                  "mode) (ms): with step_ms_q3, the step time's spread",
    "step_ms_q3": "third quartile of time/step_ms after the warm-up steps (ms)",
    "step_unloaded_ms": "the step time on a machine nobody else loads, estimated on a CPU (median of "
                        "time/step_unloaded_ms after the warm-up steps: each step's communication wall "
                        "time plus the process CPU time of the rest over its compute threads) (ms); what a "
                        "loaded run's verdicts use (compbench.race.to_target)",
    "step_unloaded_ms_q1": "first quartile of time/step_unloaded_ms after the warm-up steps (ms)",
    "step_unloaded_ms_q3": "third quartile of time/step_unloaded_ms after the warm-up steps (ms)",
    "loaded": "whether other work competed for the cores: the load average at the end of training less "
              "the run's own compute threads, above the cores they leave free by half a core "
              "(environment: load_before, load_after, own_threads, cores)",
    "other_ms": "step_ms minus the medians of compute, compress, comm, decompress and optimizer (ms): "
                "the split adds up to step_ms",
    "bytes_sent_per_step": _MEDIAN.format(tag="comm/bytes_sent", unit="bytes per worker"),
    "bytes_dense_per_step": _MEDIAN.format(tag="comm/bytes_dense", unit="bytes per worker"),
    "ratio_effective": "bytes_dense_per_step / bytes_sent_per_step (x)",
    "bytes_allreduce_per_step": _MEDIAN.format(tag="comm/bytes_allreduce", unit="bytes per worker"),
    "compressed_calls_per_step": _MEDIAN.format(tag="comm/calls_compressed", unit="calls"),
    "dense_calls_per_step": _MEDIAN.format(tag="comm/calls_dense", unit="calls"),
    "sampled_reads_per_step": _MEDIAN.format(tag="compress/sampled_reads", unit="elements per worker"),
    # language-model runs
    "final_eval_loss": "eval/loss after the last evaluation (nats per token)",
    "best_eval_loss": "lowest eval/loss of any evaluation (nats per token)",
    "final_ppl": "eval/ppl after the last evaluation: exp(final_eval_loss)",
    "final_ood_loss": "eval/ood_loss after the last evaluation (nats per token)",
    "final_ood_ppl": "eval/ood_ppl after the last evaluation: exp(final_ood_loss)",
    "tokens_per_s": _MEDIAN.format(tag="train/tokens_per_s", unit="tokens/s"),
    # modes whose replicas differ between exchanges
    "final_loss_averaged": "eval/loss_averaged at the last evaluation: the workers' averaged parameters",
    "final_acc1_averaged": "eval/acc1_averaged at the last evaluation (%)",
    "final_replica_distance": "replica/distance at the last evaluation",
}
# The replica diagnostics' tags at the last evaluation -> their summary keys.
REPLICA_SUMMARY = {"eval/loss_averaged": "final_loss_averaged", "eval/acc1_averaged": "final_acc1_averaged",
                   "replica/distance": "final_replica_distance"}


def split_ms(summary: Mapping[str, Any]) -> dict[str, float] | None:
    """The step-time split of a summary, `other` included (step minus the phases): adds up to
    step_ms. None when the step time is unknown."""
    step = summary.get("step_ms")
    if step is None:
        return None
    parts = {p: float(summary.get(f"{p}_ms") or 0.0) for p in SPLIT}
    parts["other"] = float(step) - sum(parts.values())
    return parts


def _sharded_line(sh: dict[str, Any]) -> str:
    across = (f" + across {sh['replicas']} replica groups {_bytes(sh['bytes_replica_per_step'])}"
              if sh["replicas"] > 1 else "")
    return (f"  sharded      {sh['layout']} stage {sh['stage']}, groups of {sh['shard_group']}: per step "
            f"weights gathered {_bytes(sh['bytes_gathered_per_step'])} ({sh['gather']}) + gradients "
            f"scattered {_bytes(sh['bytes_scattered_per_step'])} ({sh['scatter']}){across}")


def _memory_line(per_rank: list[dict[str, Any]]) -> str:
    """Rank 0's split, and the largest peak of any worker."""
    m = per_rank[0]
    parts = " + ".join(f"{k} {m[k]:.4g}" for k in ("parameters", "gradients", "optimizer", "activations",
                                                     "gathered"))
    peaks = [r["peak"] for r in per_rank if r.get("peak") is not None]
    peak = f"; peak {max(peaks):.4g} MB ({m['peak_of']}, the largest of {len(per_rank)})" if peaks else ""
    return f"  memory       rank 0: {parts} MB{peak}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def format_summary(results: Mapping[str, Any], run_dir: Path) -> str:
    """The one-screen summary a run ends with (rank 0): the result, then where everything is."""
    s, hp = results["summary"], results["hparams"]

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None and math.isfinite(v) else "-"

    ratio = f"ratio={hp['ratio']} " if hp.get("ratio") is not None else ""
    sync = f" sync={hp['sync']}" if "sync" in hp else ""
    clock = (f"{num(s['train_s'], '.1f')} s training + {num(s['eval_s'], '.1f')} s evaluating "
             f"({num(s['train_time_s'], '.1f')} s in all)" if s.get("train_s") is not None
             else f"{num(s['train_time_s'], '.1f')} s")
    lines = [f"compbench: done. compressor={hp['compressor']} {ratio}comm={hp['comm']} "
             f"memory={hp['memory']}{sync} on {hp['world_size']} worker(s), {s['steps']} steps: {clock}",
             *_result_lines(s, num),
             f"  bytes/step   {_bytes(s['bytes_sent_per_step'])} sent of {_bytes(s['bytes_dense_per_step'])} "
             f"dense per worker: effective ratio {num(s['ratio_effective'], '.1f')}x"]
    if s.get("sharded"):
        lines.append(_sharded_line(s["sharded"]))
    if s.get("memory_mb"):
        lines.append(_memory_line(s["memory_mb"]))
    split = split_ms(s)
    if split is not None:
        parts = " + ".join(f"{p} {v:.1f}" for p, v in split.items())
        lines.append(f"  step time    {s['step_ms']:.1f} ms = {parts}")
        named = {p: s[f"{p}_ms"] for p in OTHER_PARTS if s.get(f"{p}_ms")}
        if named:  # what `other` holds, as measured
            rest = split["other"] - sum(named.values())
            inside = ", ".join(f"{p.replace('_', ' ')} {v:.1f}" for p, v in named.items())
            lines.append(f"  other        {split['other']:.1f} ms: {inside}, the loop's own {rest:.1f}")
    if s.get("utilization") is not None:
        lines.append(f"  utilization  {100 * s['utilization']:.1f}% of the step computing")
    if s.get("loaded"):
        env = results.get("environment") or {}
        others = ""
        if env.get("others_runnable") is not None and env.get("others_cores") is not None:
            others = (f"; other work: {env['others_runnable']:g} runnable tasks, {env['others_cores']:g} "
                      "cores used")
        lines.append(f"  LOADED       load {env.get('load_before')} before, {env.get('load_after')} after on "
                     f"{env.get('cores')} cores ({env.get('own_threads')} compute threads of this run"
                     f"{others}): other work competed, the times are the machine's as much as the method's")
    if s.get("target"):
        lines.append(f"  target       {_target_line(s['target'])}")
    if s.get("faults"):
        lines.append(f"  faults       {_faults_line(s['faults'])}")
    if results.get("floors"):
        from compbench.records.floors import format_floors

        lines += format_floors(results["floors"])
    lines += [f"  run folder   {run_dir}", f"  results      {run_dir / 'results.json'}"]
    # every place the scalars went (results.json `logged`; a run of an older compbench: TensorBoard's)
    tensorboard = f"{run_dir / 'tb'}  (tensorboard --logdir {run_dir.parent})"
    logged = results.get("logged") or {"tensorboard": tensorboard}
    lines += [f"  {name:<12} {where}" for name, where in logged.items()]
    return "\n".join(lines)


def _faults_line(f: Mapping[str, Any]) -> str:
    """`summary.faults` in words: recoveries by kind, seconds lost, steps at each world size."""
    kinds = ", ".join(f"{f[k]} {k}{'' if f[k] == 1 else 's'}" for k in ("failure", "join", "restart"))
    steps = ", ".join(f"{n} on {w} worker{'' if int(w) == 1 else 's'}"
                      for w, n in f["steps_by_workers"].items())
    return f"{kinds}: {f['lost_s']:.1f} s lost; steps {steps or '-'}"


def _target_line(t: Mapping[str, Any]) -> str:
    goal = f"{t['metric']} {'>=' if t['metric'] == 'eval/acc1' else '<='} {t['value']:g}"
    if not t["reached"]:
        return f"{goal} not reached"
    units = "tokens" if "tokens" in t else "samples"
    return (f"{goal} reached at step {t['step']}: {t['train_s']:.1f} s of training, {t[units]:,} {units}, "
            f"{_bytes(t['bytes_sent'])} sent per worker")


def _median_words(steps: int | None) -> str:
    """What a summary's throughput is the median of: the steps after WARMUP_STEPS warm-up ones, or,
    in a run too short for that, its last steps (the trainer leaves out all but one)."""
    if steps is None or steps > WARMUP_STEPS:
        return f"(median after {WARMUP_STEPS} warm-up steps, all workers)"
    skip = min(WARMUP_STEPS, max(0, steps - 1))
    kept = steps - skip
    what = f"step {steps} alone" if kept == 1 else f"median of its {kept} steps"
    left = "" if not skip else ", its first step left out" if skip == 1 else f", its first {skip} left out"
    return f"({what}, all workers: a {steps}-step run has no step after {WARMUP_STEPS} warm-up ones{left})"


def _result_lines(s: Mapping[str, Any], num: Callable[[float | None, str], str]) -> list[str]:
    """The result and throughput lines: accuracy and samples/s, or (a language model, known by its
    summary's final_eval_loss) validation loss, perplexity and tokens/s."""
    median = _median_words(s.get("steps"))
    if "final_eval_loss" not in s and s.get("not_evaluated"):
        return [f"  accuracy     not evaluated: {s['not_evaluated']}",
                f"  throughput   {num(s['throughput'], ',.0f')} samples/s {median}"]
    if "final_eval_loss" not in s:
        return [f"  accuracy     final {num(s['final_acc1'], '.2f')} %   best {num(s['best_acc1'], '.2f')} "
                f"%   test loss {num(s.get('final_test_loss'), '.4f')}",
                f"  throughput   {num(s['throughput'], ',.0f')} samples/s {median}"]
    ood = s.get("final_ood_loss")
    return [f"  val loss     final {num(s['final_eval_loss'], '.4f')} nats/token "
            f"(ppl {num(s['final_ppl'], '.2f')})   best {num(s['best_eval_loss'], '.4f')}",
            *([f"  ood loss     final {num(ood, '.4f')} nats/token "
               f"(ppl {num(s['final_ood_ppl'], '.2f')})   dataset.ood text"]
              if ood is not None and math.isfinite(ood) else []),  # no out-of-domain text: no line
            f"  throughput   {num(s['tokens_per_s'], ',.0f')} tokens/s {median}"]


def headline(s: Mapping[str, Any]) -> tuple[str, float | None, str, float | None]:
    """(metric name, value, throughput unit, value) of a run's summary for one-line tables (sweeps):
    acc1 and samples/s, or a language model's validation loss and tokens/s."""
    if "final_eval_loss" in s:
        return "loss", s.get("final_eval_loss"), "tokens/s", s.get("tokens_per_s")
    return "acc1", s.get("final_acc1"), "samples/s", s.get("throughput")


def strict_json(value: Any) -> Any:
    """`value` with every NaN / infinite float replaced by None: json.dump would write bare NaN
    and Infinity, which are not JSON (jq, JavaScript and strict parsers refuse the file)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write then rename: a reader never sees a half-written file. Strict JSON (non-finite: null)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(strict_json(data), f, indent=2, default=str, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
