"""Per-step timings and byte counts, and the TensorBoard / results.json recorder (rank 0).

`TAGS` is the one table of what a run records: every scalar tag with its unit and a one-line
description (written into the tag's TensorBoard metadata, shown by the Scalars dashboard's info
icon); `SUMMARY` says how each figure of results.json's summary is taken.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from compbench.stats import StepStats  # noqa: F401  (re-exported: tests and scripts import it here)

# comm_exposed: communication (and decoding) the step waited for after back-propagation ended,
# i.e. the part not hidden behind compute.
PHASES = ("compute", "compress", "comm", "comm_exposed", "decompress", "optimizer", "step")
# The disjoint parts of a step (comm_exposed is a part of comm + decompress): with `other`, the
# time none of them accounts for (finiteness check, scheduler copies, lr schedule), they add up
# to the step.
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
    "time/decompress_ms": ("ms", "decoding received payloads into the averaged dense gradient"),
    "time/optimizer_ms": ("ms", "optimizer step and learning-rate schedule"),
    "time/other_ms": ("ms", "step - (compute + compress + comm + decompress + optimizer): checks, copies"),
    "time/step_ms": ("ms", "wall time of the whole training step on rank 0"),
    "comm/bytes_sent": ("bytes", "bytes one worker put on the wire this step (payloads, headers, padding)"),
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
_DESCRIBED = {**TAGS, **{k: v for k, v in LM_TAGS.items() if k not in TAGS}}

_MEDIAN = f"median of {{tag}} after {WARMUP_STEPS} warm-up steps ({{unit}})"
# Per-step rates: units (samples or tokens) over the step's time.
RATE_TAGS = ("train/throughput", "train/tokens_per_s")
# With a periodic synchronization (sync=diloco) the per-step figures are means over whole rounds.
ROUND_MEAN = (f"mean of each per-step figure over the whole rounds after {WARMUP_STEPS} warm-up steps "
              "(throughput: the rounds' samples or tokens over their time)")
SUMMARY: dict[str, str] = {
    "steps": "optimizer steps taken (skipped non-finite steps included)",
    "train_time_s": "wall time of the training loop on rank 0, evaluation included (s)",
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
    "throughput": _MEDIAN.format(tag="train/throughput", unit="samples/s"),
    **{f"{p}_ms": _MEDIAN.format(tag=f"time/{p}_ms", unit="ms") for p in PHASES},
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
}


class Recorder:
    """Rank 0's TensorBoard writer plus the running history that becomes results.json.

    One event file per run, in `run_dir/tb`: the scalars and the HParams session records (start
    now, end at `finish`) together, so TensorBoard shows one run per job and the HParams
    dashboard's "Show metrics" draws that run's own curves. No experiment summary is written:
    TensorBoard then finds which hyperparameters differ between runs and shows those first.

    Every scalar is written at its training time (`train_s`, set by the trainer: the steps' wall
    times, evaluation and checkpoints left out) after the run's start: TensorBoard's "Relative" x
    axis is then the time a method trained, the axis of time to quality."""

    def __init__(self, run_dir: Path, hparams: Mapping[str, Any]) -> None:
        from tensorboardX import SummaryWriter

        self.run_dir = run_dir
        self.writer = SummaryWriter(str(run_dir / "tb"))
        self.history: dict[str, list[float]] = defaultdict(list)
        self._described: set[str] = set()
        self.start = time.time()
        self.train_s = 0.0
        self._add(session_start(hparams))

    def scalar(self, tag: str, value: float, step: int, keep: bool = True) -> None:
        walltime = self.start + self.train_s
        if tag in self._described:
            self.writer.add_scalar(tag, value, step, walltime=walltime)
        else:  # TensorBoard keeps a tag's metadata from its first value: describe it once
            self._add(described_scalar(tag, value), step, walltime)
            self._described.add(tag)
        if keep:
            self.history[tag].append(float(value))

    def finish(self) -> None:
        """The HParams session end record (status: success), then close the event file."""
        self._add(session_end())
        self.writer.close()

    def _add(self, summary_bytes: bytes, step: int | None = None, walltime: float | None = None) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        # tensorboard builds the records, tensorboardX writes them: the two packages share the
        # wire format, not the Python classes.
        self.writer.file_writer.add_summary(Summary.FromString(summary_bytes), step, walltime)

    def median(self, tag: str, skip: int = 0) -> float | None:
        values = self.history.get(tag, [])
        values = values[skip:] if len(values) > skip else values
        return statistics.median(values) if values else None

    def round_mean(self, tag: str, skip: int, period: int, per_second: bool = False) -> float | None:
        """Mean per step over the whole rounds of `period` steps after the first `skip` steps
        (rounded up to a round): a periodic mode's step that sends nothing counts as one.
        `per_second`: `tag` is a rate per step (units / step time): the rounds' units over their time."""
        values = self.history.get(tag, [])
        start = -(-skip // period) * period
        whole = (len(values) - start) // period * period
        if whole <= 0:  # fewer steps than a round after warm-up: every step there is
            start, whole = 0, len(values) // period * period or len(values)
        values = values[start:start + whole]
        if not values:
            return None
        if not per_second:
            return statistics.fmean(values)
        seconds = self.history["time/step_ms"][start:start + whole]
        return sum(v * ms for v, ms in zip(values, seconds, strict=True)) / sum(seconds)

    def close(self) -> None:
        self.writer.close()


def described_scalar(tag: str, value: float) -> bytes:
    """A serialized Summary: `value` as a plain scalar (what every reader lists as a scalar)
    with the scalars plugin's metadata carrying the tag's unit and description. The plugin name
    matters: TensorBoard's default (Rust) loader drops a description without it."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.scalar import metadata

    unit, about = _DESCRIBED[tag]
    meta = metadata.create_summary_metadata(display_name=f"{tag} ({unit})",
                                            description=f"{about}. Unit: {unit}.")
    meta.data_class = summary_pb2.DATA_CLASS_SCALAR
    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, simple_value=float(value), metadata=meta)
    return summary.SerializeToString()


def session_start(hparams: Mapping[str, Any]) -> bytes:
    """The HParams plugin's session start record. Integers go as text: the HParams table prints
    every number with five significant digits (world_size 2 would read 2.0000); floats stay
    numbers (ratio gets a numeric axis and filter), None is left out."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for k, v in hparams.items():
        if isinstance(v, bool):
            info.hparams[k].bool_value = v
        elif isinstance(v, int):
            info.hparams[k].string_value = str(v)
        elif isinstance(v, float):
            info.hparams[k].number_value = v
        elif v is not None:
            info.hparams[k].string_value = str(v)
    return _hparams_record("session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=info))


def session_end() -> bytes:
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return _hparams_record("session_end_info", plugin_data_pb2.HParamsPluginData(session_end_info=info))


def _hparams_record(kind: str, data: Any) -> bytes:
    """A serialized Summary with one hparams plugin value, as tensorboard's summary_v2 builds it
    (tensorboard.plugins.hparams.summary would import TensorFlow)."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata

    tag = {"session_start_info": metadata.SESSION_START_INFO_TAG,
           "session_end_info": metadata.SESSION_END_INFO_TAG}[kind]
    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)
    return summary.SerializeToString()


def run_hparams(cfg: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """What a run's HParams row shows: compressor and ratio first, then the other choices and the
    usual sweep knobs. `net` is only a model for plans (left out) unless it shapes this job."""
    choices, comp = cfg["choices"], cfg["compressor"]
    hp: dict[str, Any] = {"compressor": choices["compressor"], "ratio": comp.get("ratio", 1.0)}
    hp.update({g: choices[g] for g in ("memory", "comm", "scheduler", "model", "dataset", "engine", "optim")})
    hp.update(world_size=world_size, lr=cfg["optim"].get("lr"), batch_size=cfg["batch_size"],
              epochs=cfg["epochs"], seed=cfg["seed"])
    if cfg["net"].get("emulate_gbps") is not None:
        hp["net.emulate_gbps"] = cfg["net"]["emulate_gbps"]
    if "experiment" in choices:
        hp["experiment"] = choices["experiment"]
    if choices.get("sync", "step") != "step":  # a per-step run's row stays as it was
        hp["sync"] = choices["sync"]
    return hp


def split_ms(summary: Mapping[str, Any]) -> dict[str, float] | None:
    """The step-time split of a summary, `other` included (step minus the phases): adds up to
    step_ms. None when the step time is unknown."""
    step = summary.get("step_ms")
    if step is None:
        return None
    parts = {p: float(summary.get(f"{p}_ms") or 0.0) for p in SPLIT}
    parts["other"] = float(step) - sum(parts.values())
    return parts


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
    lines = [f"compbench: done. compressor={hp['compressor']} {ratio}comm={hp['comm']} "
             f"memory={hp['memory']}{sync} on {hp['world_size']} worker(s), {s['steps']} steps "
             f"in {num(s['train_time_s'], '.1f')} s",
             *_result_lines(s, num),
             f"  bytes/step   {_bytes(s['bytes_sent_per_step'])} sent of {_bytes(s['bytes_dense_per_step'])} "
             f"dense per worker: effective ratio {num(s['ratio_effective'], '.1f')}x"]
    split = split_ms(s)
    if split is not None:
        parts = " + ".join(f"{p} {v:.1f}" for p, v in split.items())
        lines.append(f"  step time    {s['step_ms']:.1f} ms = {parts}")
    if s.get("utilization") is not None:
        lines.append(f"  utilization  {100 * s['utilization']:.1f}% of the step computing")
    if s.get("target"):
        lines.append(f"  target       {_target_line(s['target'])}")
    if results.get("floors"):
        from compbench.floors import format_floors

        lines += format_floors(results["floors"])
    lines += [f"  run folder   {run_dir}",
              f"  results      {run_dir / 'results.json'}",
              f"  tensorboard  {run_dir / 'tb'}  (tensorboard --logdir {run_dir.parent})"]
    return "\n".join(lines)


def _target_line(t: Mapping[str, Any]) -> str:
    goal = f"{t['metric']} {'>=' if t['metric'] == 'eval/acc1' else '<='} {t['value']:g}"
    if not t["reached"]:
        return f"{goal} not reached"
    units = "tokens" if "tokens" in t else "samples"
    return (f"{goal} reached at step {t['step']}: {t['train_s']:.1f} s of training, {t[units]:,} {units}, "
            f"{_bytes(t['bytes_sent'])} sent per worker")


def _result_lines(s: Mapping[str, Any], num: Callable[[float | None, str], str]) -> list[str]:
    """The result and throughput lines: accuracy and samples/s, or (a language model, known by its
    summary's final_eval_loss) validation loss, perplexity and tokens/s."""
    median = f"(median after {WARMUP_STEPS} warm-up steps, all workers)"
    if "final_eval_loss" not in s and s.get("not_evaluated"):
        return [f"  accuracy     not evaluated: {s['not_evaluated']}",
                f"  throughput   {num(s['throughput'], ',.0f')} samples/s {median}"]
    if "final_eval_loss" not in s:
        return [f"  accuracy     final {num(s['final_acc1'], '.2f')} %   best {num(s['best_acc1'], '.2f')} "
                f"%   test loss {num(s.get('final_test_loss'), '.4f')}",
                f"  throughput   {num(s['throughput'], ',.0f')} samples/s {median}"]
    return [f"  val loss     final {num(s['final_eval_loss'], '.4f')} nats/token "
            f"(ppl {num(s['final_ppl'], '.2f')})   best {num(s['best_eval_loss'], '.4f')}",
            f"  ood loss     final {num(s['final_ood_loss'], '.4f')} nats/token "
            f"(ppl {num(s['final_ood_ppl'], '.2f')})   dataset.ood text",
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
