"""The one trainer loop. Read `train_epoch`: the compression seam is `scheduler.synchronize`."""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf

from compbench.base.settings import RunSettings
from compbench.catalog import registry
from compbench.data.loader import ShardedLoader
from compbench.optim.clip import clip_grad_norm
from compbench.optim.schedule import build_schedule
from compbench.records import fault_events, goodput, provenance
from compbench.records.memory import MemoryLedger
from compbench.records.results import (
    PHASES,
    RATE_TAGS,
    REPLICA_SUMMARY,
    ROUND_MEAN,
    SPLIT,
    SUMMARY,
    WARMUP_STEPS,
    format_summary,
    split_ms,
    write_json_atomic,
)
from compbench.records.stats import StepStats, clock_for
from compbench.seam.build import build_datasets, build_model
from compbench.sync import IndependentLearners, PerWorkerSteps, StepShare
from compbench.sync.build import build_synchronizer
from compbench.sync.sharding import DIRECTIONS, Sharding
from compbench.train import faults, loggers, machine
from compbench.train.checkpoint import (
    CheckpointPlace,
    TrainingState,
    find_checkpoint,
    load_checkpoint,
    run_config,
    save_checkpoint,
)
from compbench.train.metrics import Recorder, run_hparams
from compbench.train.nonfinite import nonfinite_gradients
from compbench.train.progress import Progress
from compbench.train.replicas import diagnose
from compbench.train.skew import waits_for_last_rank_ms
from compbench.train.task import task_of


class Trainer:
    def __init__(self, cfg: DictConfig, engine, run_dir: Path, recorder: Recorder | None = None) -> None:
        """`recorder`: rank 0's, carried over when an elastic run builds its trainer again."""
        self.cfg, self.engine, self.run_dir = cfg, engine, run_dir
        self.settings = s = RunSettings.of(cfg)  # the top-level keys, typed
        self.rank0 = engine.rank == 0
        self.load_before = provenance.load_average()  # other work on this machine, before training
        # The rank's device (compbench.engines.device, set by its engine): model, batches, optimizer state,
        # memories and the pipeline's buffers live there.
        self.device = engine.device
        torch.manual_seed(s.seed)  # identical initial weights on every rank (CUDA's generators too)
        self.model = build_model(cfg).to(self.device)
        with torch.no_grad():  # and, for safety under any launcher, rank 0's weights everywhere
            for name, t in [*self.model.named_parameters(), *self.model.named_buffers()]:
                engine.broadcast_(t.data, 0, f"init.{name}")
        self.task = task_of(cfg.dataset._target_)  # classification or language modelling
        train_ds, *eval_sets = build_datasets(cfg)
        self.data_info = self.task.data_info(train_ds)
        self.train_loader = ShardedLoader(train_ds, s.batch_size, engine.rank, engine.size, s.seed, True,
                                          s.num_workers, self.device)
        self.eval_loaders = [ShardedLoader(ds, s.eval_batch_size, engine.rank, engine.size, train=False,
                                           device=self.device) for ds in eval_sets]
        if len(self.train_loader) == 0:
            raise ValueError(f"batch_size={s.batch_size} x {engine.size} workers exceeds the "
                             f"{len(train_ds)} training samples; lower batch_size")

        self.stats = StepStats(clock_for(self.device, s.timing))  # CUDA events on a GPU
        # precision=bf16: forward (and so backward) under autocast; parameters, gradients and the
        # pipeline stay fp32.
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=s.precision == "bf16")
        # The synchronization mode, assembled in one place (compbench.sync.build): per step through
        # compbench's pipeline, a baseline's own (sync=ddp, horovod_optimizer), in rounds (diloco).
        self.sync = build_synchronizer(cfg, engine, self.stats, guard_nonfinite=s.on_nonfinite == "skip")
        self.pipeline, self.scheduler = self.sync.pipeline, self.sync.scheduler
        # sync_traits.learners_independent (sync=quorum_diloco), read here only: the workers meet in no
        # collective while they train; rank 0 alone evaluates, on every rank's evaluation shard in rank
        # order (the whole set, summed as the allreduce of 2 would), and the mode carries the stop.
        independent = self.sync.sync_traits.learners_independent
        self.learners = cast(IndependentLearners, self.sync) if independent else None
        self.whole_eval = [[ShardedLoader(ds, s.eval_batch_size, r, engine.size, train=False,
                                          device=self.device) for ds in eval_sets]
                           for r in range(engine.size)] if independent and self.rank0 else []
        if self.pipeline is not None:
            self.compressor, self.memory = self.pipeline.compressor, self.pipeline.memory
        # The gradients the compressor's compiled passes checked for NaN/Inf this step (codec/finite.py)
        self.ledger = self.pipeline.compressor.finite if self.pipeline is not None else None
        self.model = self.sync.setup(self.model)
        self.optimizer = self.sync.make_optimizer(self.model, registry.plain(cfg.optim))
        # a sharded run (sharding=fsdp|hsdp): FSDP's collectives per direction, the shards' view
        self.sharded, self.local = None, _whole
        if Sharding(**registry.plain(cfg.sharding)).on:  # FSDP's modules: imported by sharded runs only
            from compbench.sync.sharded import ShardedSync, local

            assert isinstance(self.sync, ShardedSync)
            self.sharded, self.local = self.sync, local  # a tensor's part on this worker: its shard
        # sync_traits.per_worker_key (sync=diloco's inner_steps_per_worker), read here only: who trains
        # each step; every worker, every step, for the other modes (and a sharded run, which refuses it)
        everyone = StepShare(True, engine.size)
        self.step_share: Callable[[], StepShare] = (
            cast(PerWorkerSteps, self.sync).step_share if self.sync.sync_traits.per_worker_key
            and self.sharded is None else lambda: everyone)
        self.footprint = MemoryLedger(self.device, self.model, self.optimizer, self.local)  # memory, split
        self.goodput = goodput.GoodputLedger()  # this worker's compute and step seconds (summary.goodput)
        # optim.clip_grad_norm: what the optimizer's step reads is clipped (the averaged gradient per
        # step; each inner step's own gradient in diloco), compbench.optim.clip.
        self.clip = cfg.optim.get("clip_grad_norm")
        self.epochs = s.epochs
        self.lr_schedule = build_schedule(self.optimizer, len(self.train_loader), self.epochs,
                                          **registry.plain(cfg.optim))
        self.recorder: Recorder | None = None
        if self.rank0:
            hparams = run_hparams(cfg, engine.size)
            self.recorder = recorder or Recorder(run_dir, hparams, loggers.build(
                cfg.loggers, run_dir, hparams, time.time(), registry.plain(cfg.mlflow), s.outputs_root,
                run_config(cfg)))
        self.elastic = bool(cfg.engine.get("elastic"))  # engine.elastic: Horovod Elastic or TorchElastic
        self.faults = registry.build(cfg.fault)  # injected failures and stragglers (compbench.train.faults)
        # engine.elastic (compbench.train.elastic): where training continues after a recovery, the
        # commit called at each round's end, and the recoveries recorded so far (rank 0's).
        self.start_at: tuple[int, int] | None = None
        self.resumed_s = 0.0  # wall seconds of the run before this trainer took over (elastic)
        self.on_commit: Callable[[int, int], None] | None = None
        self.recoveries: list[dict[str, Any]] = []
        self.step = 0
        total = len(self.train_loader) * self.epochs
        self.progress = Progress(s, self.task.units, min(total, s.max_steps or total), self.period(),
                                 alone=self.learners is not None)
        self.final: dict[str, float] = {}  # the metrics of the last evaluation
        self.dense_since = 0  # dense bytes of the steps since the last one that sent anything
        self.arrivals: list[float] = []  # per finished step, when it first waited on an exchange (every rank)
        self.others = machine.Others(None, None)  # other work on the machine while this trainer trained

    def fit(self) -> dict[str, Any] | None:
        s = self.settings
        self.t_start = time.perf_counter() - self.resumed_s
        # what other work did on the machine while this trainer trained (collectives; not across an
        # elastic run's changes of world)
        watch = None if self.elastic else machine.Watch(self.engine)
        max_steps = s.max_steps or math.inf
        epoch, batch = self.resume_position()
        while epoch < self.epochs and self.step < max_steps and not self.told_to_stop():
            self.train_loader.epoch = epoch
            batch = self.train_epoch(epoch, batch, max_steps)
            if batch < len(self.train_loader):  # stopped inside the epoch (max_steps, or the target)
                self.evaluate_once(epoch + batch / len(self.train_loader))  # the last step is evaluated
                self.stop_learners()
                self.checkpoint(epoch, batch)
                break
            # True: the target reached (or the budget spent) at the epoch's last step: the run ends there
            stop = self.evaluate_once(epoch + 1.0)
            epoch, batch = epoch + 1, 0
            if stop or epoch >= self.epochs or self.step >= max_steps:
                self.stop_learners()
            self.checkpoint(epoch, batch)
            if stop:
                break
        self.sync.drain()  # an exchange still in flight (diloco's overlap) ends before the engine does
        self.record_waits_for_last_rank()
        self.memory_per_rank = self.footprint.gather(self.engine)  # a collective: every worker's figures
        self.goodput_per_rank = self.goodput.gather(self.engine)  # a collective too
        self.others = machine.Others(None, None) if watch is None else watch.finish(self.engine)
        return self.finish(self.final, time.perf_counter() - self.t_start)

    def stop_learners(self) -> None:
        """Independent learners: rank 0's training ended, so the others stop at their next delivery (before
        the checkpoint's collective, which they join); nothing for other modes."""
        if self.learners is not None and self.rank0:
            self.learners.stop_learners()

    def told_to_stop(self) -> bool:
        """Independent learners only: the mode carried rank 0's stop to this worker."""
        return self.learners is not None and self.learners.stop_requested()

    def record_waits_for_last_rank(self) -> None:
        """`time/comm_skew_ms` per step (compbench.train.skew): on the host clock, where the ranks share
        it, and not across an elastic run's changes of world (its steps' ranks differ), nor where the
        learners are independent (no step waits for another rank). A collective."""
        if self.elastic or self.learners is not None or self.stats.cpu_time is None or not self.arrivals:
            return
        r = self.recorder
        exposed = r.history.get("time/comm_exposed_ms", []) if r is not None else None
        waits = waits_for_last_rank_ms(self.engine, self.arrivals, exposed)
        if r is None or waits is None:
            return
        step_ms = r.history["time/step_ms"][-len(waits):]
        exposed_ms = r.history["time/comm_exposed_ms"][-len(waits):]
        decode_ms = r.history["time/decompress_ms"][-len(waits):]
        r.train_s = self.progress.train_s - sum(step_ms) / 1e3  # each at its step's training time
        first = self.step - len(waits)
        steps = zip(waits, step_ms, exposed_ms, decode_ms, strict=True)
        for i, (wait, ms, shown, decode) in enumerate(steps):
            r.train_s += ms / 1e3
            r.scalar("time/comm_skew_ms", wait, first + i)
            # step by step: rank 0 waits for the last rank on about half the steps (when it is first),
            # so the median of the exposed time holds that wait while the median wait is 0
            r.scalar("time/comm_exposed_less_skew_ms", max(0.0, shown - decode - wait), first + i)

    def evaluate_once(self, epoch: float) -> bool:
        """Evaluate now unless this step was already evaluated (or eval=false); True when the run
        reached its target and stops there."""
        curve = self.progress.curve
        if not self.settings.eval or (curve and curve[-1]["step"] == self.step):
            return False
        if self.learners is not None and not self.rank0:
            return False  # independent learners: rank 0 alone evaluates, and stops the others
        started = time.perf_counter()
        self.final = self.evaluate(epoch)
        self.progress.eval_s += time.perf_counter() - started
        stop = self.progress.point(self.step, epoch, self.final, self.engine)
        self.model.train()
        return stop

    def resume_position(self) -> tuple[int, int]:
        if self.start_at is not None:  # an elastic run's recovery restored its last commit
            return self.start_at
        path = find_checkpoint(self.settings.resume, self.run_dir) if self.settings.resume else None
        if path is None:
            return 0, 0
        state = self.training_state()
        epoch, batch, saved = load_checkpoint(state, self.engine, path, f"resume={self.settings.resume}")
        self.step = state.step
        self.final = self.progress.last_metrics
        if self.rank0:
            print(f"resumed from {path} at epoch {epoch + 1}, batch {batch} (step {self.step})", flush=True)
            if saved not in (None, torch.get_num_threads()):
                print(f"note: {torch.get_num_threads()} compute threads per worker, the checkpoint's run had "
                      f"{saved}: float sums split by thread differ, so the run continues within rounding of "
                      f"it, not bit for bit; pass threads={saved} for that", flush=True)
        return epoch, batch

    def training_state(self) -> TrainingState:
        return TrainingState(self.model, self.optimizer, self.lr_schedule, self.sync, self.scheduler,
                             self.progress, self.step, self.sharded)

    def checkpoint(self, epoch: int, batch: int) -> None:
        """Collective (every rank calls it at the same point); rank 0 writes (unless checkpoint=false)."""
        if self.settings.checkpoint:
            place = CheckpointPlace(self.engine, self.run_dir, run_config(self.cfg))
            save_checkpoint(self.training_state(), place, epoch, batch)

    def train_epoch(self, epoch: int, first_batch: int, max_steps: float) -> int:
        """Train from batch `first_batch`; returns the index of the next batch (len(loader) if done)."""
        from tqdm import tqdm

        model, stats, engine, s = self.model, self.stats, self.engine, self.settings
        model.train()
        steps = len(self.train_loader)
        # a bar only where a terminal shows it (a log file would hold every redraw)
        bar = tqdm(total=steps, initial=first_batch, desc=f"epoch {epoch + 1}/{self.epochs}",
                   disable=not self.rank0 or not s.progress or not sys.stderr.isatty(), dynamic_ncols=True,
                   leave=False)
        i = first_batch
        for i, (x, y) in enumerate(self.train_loader.batches(first_batch), start=first_batch):
            if self.step >= max_steps:
                bar.close()
                return i
            if self.faults.kills:
                self.faults.before_step(self.step, engine.rank, self.run_dir, s.seed)
            stats.reset()
            stats.begin_step()
            t0 = time.perf_counter()
            self.sync.begin_step(self.step, epoch + i / steps)
            share = self.step_share()  # per-worker rounds: this worker may idle (its batch skipped)
            if share.mine:
                self.footprint.begin_step()
                with stats.time("compute"):
                    with self.autocast:
                        loss = self.task.loss(model(x), y)
                    self.footprint.end_forward()
                    self.optimizer.zero_grad()
                    self.sync.before_backward()  # overlapping schedulers arm their hooks
                    loss.backward()
                    self.faults.straggle(engine.rank, time.perf_counter() - t0)
                if s.on_nonfinite != "ignore" and not self.gradients_finite():  # booked as other's "check"
                    self.step += 1  # on_nonfinite=skip: every rank drops this step together
                    continue
                self.sync.synchronize()  # per step: memory -> compress -> communicate -> decompress
                with stats.time("optimizer"):
                    if self.clip is not None:
                        clip_grad_norm(self.model.parameters(), float(self.clip))
                    self.optimizer.step()
                    self.lr_schedule.step()
            else:  # no compute booked: idle time; the schedule follows the loop's steps on every worker
                self.lr_schedule.step()
            self.sync.after_step()  # a periodic mode ends its round here
            if share.mine:
                self.footprint.end_step()
            with stats.time("loss_read"):
                # the step's last wait on a GPU: inside its time
                loss_value = loss.item() if share.mine else None
            stats.end_step()
            self.goodput.add_step(stats.ms)
            self.arrivals.append(math.nan if stats.arrived is None else stats.arrived)
            units = self.task.count(y) * share.workers  # the workers that trained it
            unloaded = stats.unloaded_ms(torch.get_num_threads())  # None on a GPU
            self.progress.add_step(self.step, stats.ms["step"], units, stats.bytes_sent, engine, unloaded)
            self.record_step(loss_value, units, unloaded)
            bar.update(1)
            if loss_value is not None:
                bar.set_postfix(loss=f"{loss_value:.3f}")
            self.step += 1
            if self.told_to_stop():  # independent learners: rank 0 stopped, said at this round's end
                bar.close()
                return i + 1
            if self.progress.due(self.step) and i + 1 < steps and self.evaluate_once(epoch + (i + 1) / steps):
                bar.close()
                return i + 1  # the target was reached, or the time budget spent: the run stops here
            if s.checkpoint_every_steps and self.step % s.checkpoint_every_steps == 0 and i + 1 < steps:
                self.checkpoint(epoch, i + 1)
            if self.on_commit is not None and self.step % self.period() == 0:
                self.on_commit(epoch, i + 1)  # a round's end: the replicas agree, the state is kept
                self.faults.after_commit(self.step, engine.rank, self.run_dir)
        bar.close()
        return steps

    def gradients_finite(self) -> bool:
        """Check every gradient for NaN/Inf before anything is compressed.

        on_nonfinite=raise needs no collective: the rank that sees one raises, its worker writes
        the one `error:` line and exits, and the job-level failure protocol stops the rest (the
        launcher's watch, or torchrun's / horovodrun's; a peer blocked in the step's exchange ends
        as a consequence, PeerLost). on_nonfinite=skip needs every rank to agree before any of
        them compresses (a skipped step must leave every error-feedback memory untouched): one
        tiny allreduce. Overlapping schedulers may already have sent some groups: skipping then
        still drains them, so the next step starts clean.

        on_nonfinite=raise does not read again what the compressor's compiled first pass already
        checked inside the backward hooks (the ledger, codec/finite.py): one host read of its flags
        and the other gradients' sums (`train.nonfinite`). on_nonfinite=skip reads every gradient
        here: there the pipeline hands the compressor a zeroed copy of a non-finite group (so that no
        memory takes the NaN in), which its pass finds finite, and every rank must agree on what
        this rank's own gradients hold before any memory is touched."""
        with self.stats.time("check"):
            # a sharded run checks this worker's shards (each element is some worker's)
            named = [(n, self.local(p.grad)) for n, p in self.model.named_parameters() if p.grad is not None]
            # closed here, for every mode: what is compressed after this point is not this check's
            checked, flags = self.ledger.close() if self.ledger is not None else ({}, [])
            if self.settings.on_nonfinite != "raise":
                checked, flags = {}, []
            bad = nonfinite_gradients(named, checked, flags, self.device)
        if self.settings.on_nonfinite == "raise":
            if bad:
                raise FloatingPointError(f"non-finite gradient at step {self.step} (rank {self.engine.rank}: "
                                         f"{', '.join(bad[:3])}); lower the learning rate or pass "
                                         f"on_nonfinite=skip")
            return True
        # Booked as exposed communication: this allreduce queues behind the collectives an overlapping
        # scheduler already started, so its wait is their transfer time, not "other".
        with self.stats.time("comm", exposed=True):
            # filled on the device: torch.tensor(..., device=) would be a blocking copy to a GPU
            flag = torch.full((1,), float(bool(bad)), device=self.device)
            ranks_with_bad = self.engine.allreduce(flag, "nonfinite", average=False)
        if ranks_with_bad.item() == 0:  # read by the host: every rank skips or steps together
            return True
        self.sync.drain()  # e.g. groups an overlapping scheduler already submitted
        self.optimizer.zero_grad()
        if self.rank0:
            print(f"warning: skipped step {self.step}: "
                  f"non-finite gradient ({', '.join(bad[:3]) or 'another rank'})", flush=True)
        return False

    def record_step(self, loss: float | None, global_count: int, unloaded_ms: float | None) -> None:
        """`loss`: None at a step rank 0 did not train (per-worker rounds): no train/loss there."""
        if self.recorder is None:
            return
        r, s, st = self.recorder, self.stats, self.step
        r.train_s = self.progress.train_s
        if loss is not None:
            r.scalar("train/loss", loss, st)
        r.scalar(self.task.throughput_tag, global_count / (s.ms["step"] / 1e3), st)  # samples or tokens/s
        r.scalar("train/lr", self.optimizer.param_groups[0]["lr"], st)
        for phase in PHASES:
            r.scalar(f"time/{phase}_ms", s.ms[phase], st)
        r.scalar("time/other_ms", s.ms["step"] - sum(s.ms[p] for p in SPLIT), st)
        if unloaded_ms is not None:  # the CPU's steps: what a machine nobody else loads would take
            r.scalar("time/step_unloaded_ms", unloaded_ms, st)
            r.scalar("time/comm_cpu_ms", s.comm_cpu_ms or 0.0, st)
        r.scalar("comm/bytes_sent", s.bytes_sent, st)
        r.scalar("comm/bytes_sent_total", self.progress.bytes_sent, st)  # the curve's x axis of bytes
        r.scalar("comm/bytes_dense", s.bytes_dense, st)
        self.dense_since += s.bytes_dense
        if s.bytes_sent:  # a round's ratio where a periodic mode talks once a round (not 4n / 1 byte)
            r.scalar("comm/ratio_effective", self.dense_since / s.bytes_sent, st)
            self.dense_since = 0
        r.scalar("comm/bytes_allreduce", s.bytes_allreduce, st)
        r.scalar("comm/calls_compressed", s.calls_compressed, st)
        r.scalar("comm/calls_dense", s.calls_dense, st)
        r.scalar("compress/sampled_reads", s.sampled_reads, st)
        if self.sharded is not None:  # FSDP's collectives: weights gathered, gradients scattered
            ledger = self.sharded.directions
            for direction in DIRECTIONS:
                r.scalar(f"comm/bytes_{direction}", ledger.bytes[direction], st)
                r.scalar(f"time/{direction}_ms", ledger.ms(direction), st)
            r.scalar("comm/bytes_replica", s.bytes_sent - sum(ledger.bytes.values()), st)
            r.scalar("comm/bytes_cross_node", ledger.cross_node, st)
        if self.elastic:
            r.scalar("elastic/workers", self.engine.size, st)

    @torch.no_grad()
    def evaluate(self, epoch: float) -> dict[str, float]:
        # BatchNorm running statistics differ per rank: use rank 0's, as DDP does.
        for name, b in self.model.named_buffers() if self.learners is None else ():
            self.engine.broadcast_(b.data, 0, f"bn.{name}")
        self.model.eval()
        metrics = self.eval_metrics()
        # independent learners: no replica diagnosis (a collective); rank 0 holds θ at a round's end
        diverge = self.sync.sync_traits.replicas_diverge and self.learners is None
        if self.sharded is not None and diverge and self.sharded.replicas > 1:
            # the replica groups' shards differ: averaged over each shard's replicas
            assert self.sharded.view is not None
            metrics.update(diagnose(self.sharded.view, self.sharded.replica_engine, self.eval_metrics,
                                    self.sharded.shard_engine))
        elif diverge and self.engine.size > 1:
            # the workers' parameters differ: their average's metrics and their distance too
            metrics.update(diagnose(self.model, self.engine, self.eval_metrics))
        if self.recorder:
            progress = self.progress
            for tag, value in metrics.items():
                self.recorder.scalar(tag, value, self.step)
                # the same against an x axis a researcher compares across runs, from 0: training
                # milliseconds, and bytes one worker sent
                self.recorder.scalar(f"by_train_ms/{tag}", value, round(progress.train_s * 1e3), keep=False)
                self.recorder.scalar(f"by_bytes_sent/{tag}", value, progress.bytes_sent, keep=False)
            print(f"{self.position(epoch)}: {self.task.describe(metrics)}  {progress.train_s:.1f} s training",
                  flush=True)
        return metrics

    def position(self, epoch: float) -> str:
        """Where the run is: its step out of max_steps where those end it, else its epoch."""
        steps = self.settings.max_steps
        if steps is not None and steps < len(self.train_loader) * self.epochs:
            return f"step {self.step}/{steps} (epoch {epoch:.2f})"
        return f"epoch {epoch:.2f}/{self.epochs} (step {self.step})"

    def eval_metrics(self) -> dict[str, float]:
        if self.whole_eval:  # independent learners' rank 0: every shard, summed in rank order, no collective
            with self.autocast:
                sums = self.task.eval_sums(self.model, self.whole_eval[0], self.device)
                for loaders in self.whole_eval[1:]:
                    sums += self.task.eval_sums(self.model, loaders, self.device)
            return self.task.metrics(sums)
        with self.autocast:  # correct and samples, or nats and tokens, summed on the device
            sums = self.task.eval_sums(self.model, self.eval_loaders, self.device)
        return self.task.metrics(self.engine.allreduce(sums, "eval", average=False))

    def period(self) -> int:
        """Steps per round of the synchronization mode (1: it talks every step)."""
        traits = self.sync.sync_traits
        if not traits.period_key:
            return 1
        return math.lcm(*(int(self.cfg.sync[k]) for k in (traits.period_key, *traits.period_keys)))

    def finish(self, final: dict[str, float], seconds: float) -> dict[str, Any] | None:
        if self.recorder is None:
            return None
        r = self.recorder
        skip = min(WARMUP_STEPS, max(0, len(r.history["time/step_ms"]) - 1))  # first steps include warm-up
        period = self.period()

        def per_step(tag: str) -> float | None:  # a round's quiet steps count: means over whole rounds
            if period == 1:
                return r.median(tag, skip)
            # a rate (samples or tokens per second) over whole rounds: units over their seconds
            return r.round_mean(tag, skip, period, per_second=tag in RATE_TAGS)

        sent, dense = per_step("comm/bytes_sent"), per_step("comm/bytes_dense")
        compute, step = per_step("time/compute_ms"), per_step("time/step_ms")
        spread = r.quartiles("time/step_ms", skip, period)
        cpu_estimated = bool(r.history.get("time/step_unloaded_ms"))  # the host clock's runs
        unloaded = r.quartiles("time/step_unloaded_ms", skip, period)
        summary = {
            "status": "completed",
            "steps": self.step,
            "train_time_s": round(seconds, 3),
            **self.task.summary(final, r.history, per_step),
            **{f"{p}_ms": per_step(f"time/{p}_ms") for p in PHASES},
            "other_ms": None,
            "bytes_sent_per_step": sent,
            "bytes_dense_per_step": dense,
            "ratio_effective": (dense / sent) if sent and dense is not None else None,
            "bytes_allreduce_per_step": per_step("comm/bytes_allreduce"),
            "compressed_calls_per_step": per_step("comm/calls_compressed"),
            "dense_calls_per_step": per_step("comm/calls_dense"),
            "sampled_reads_per_step": per_step("compress/sampled_reads"),
            "peak_bytes_per_step": max(r.history["comm/bytes_sent"], default=None),
            "step_ms_q1": spread[0] if spread else None,
            "step_ms_q3": spread[1] if spread else None,
            "comm_skew_ms": per_step("time/comm_skew_ms") if r.history.get("time/comm_skew_ms") else None,
            "comm_exposed_less_skew_ms": (per_step("time/comm_exposed_less_skew_ms")
                                          if r.history.get("time/comm_exposed_less_skew_ms") else None),
            "comm_cpu_ms": per_step("time/comm_cpu_ms") if cpu_estimated else None,
            "step_unloaded_ms": per_step("time/step_unloaded_ms") if cpu_estimated else None,
            "step_unloaded_ms_q1": unloaded[0] if unloaded else None,
            "step_unloaded_ms_q3": unloaded[1] if unloaded else None,
            "utilization": compute / step if compute is not None and step else None,
            "target": self.progress.summary(),
            "stopped_by": self.progress.stopped,
            "train_s": round(self.progress.train_s, 3),
            "eval_s": round(self.progress.eval_s, 3),
            "memory_mb": self.memory_per_rank,
            # a mode that discards work reports its compute seconds in its summary (compbench.records.goodput)
            "goodput": (goodput.record_elastic(r.history, int(self.cfg.engine.np), seconds) if self.elastic
                        else goodput.record(self.goodput_per_rank, seconds,
                                            float(self.sync.summary().get("discarded_compute_s", 0.0)))),
        }
        if self.sharded is not None:
            summary["sharded"] = {**self.sharded.record(),
                                  **{f"bytes_{d}_per_step": per_step(f"comm/bytes_{d}") for d in DIRECTIONS},
                                  **{f"{d}_ms": per_step(f"time/{d}_ms") for d in DIRECTIONS},
                                  "bytes_replica_per_step": per_step("comm/bytes_replica"),
                                  "bytes_cross_node_per_step": per_step("comm/bytes_cross_node")}
        if self.elastic or self.faults.injects:
            summary["faults"] = faults.summary(self.recoveries, r.history.get("elastic/workers", []),
                                               self.step, self.engine.size)
        if not self.settings.eval:
            summary["not_evaluated"] = "eval=false"
        for tag, key in REPLICA_SUMMARY.items():  # modes whose replicas differ (compbench.train.replicas)
            if tag in final:
                summary[key] = final[tag]
        split = split_ms(summary)
        summary["other_ms"] = split["other"] if split else None
        env = environment(self.engine, self.settings.precision, self.load_before, self.others)
        summary["loaded"] = env["loaded"]  # other work competed for the cores: the timings are the machine's
        results = {"config": OmegaConf.to_container(self.cfg, resolve=True),
                   "environment": env,
                   "hparams": run_hparams(self.cfg, self.engine.size), "summary": summary,
                   "summary_method": {k: SUMMARY[k] for k in summary if k in SUMMARY}
                   | ({"per_step": ROUND_MEAN} if period > 1 else {}),
                   "scheduler": self.sync.summary(), "exchange": asdict(self.sync.exchange_plan()),
                   "curve": self.progress.curve,
                   "logged": loggers.places(self.cfg.loggers, self.run_dir, registry.plain(self.cfg.mlflow),
                                            self.settings.outputs_root)}
        if self.data_info is not None:
            results["data"] = self.data_info  # language models: tokenizer, vocabulary size, split
        # a sharded run's passes are over shards and FSDP's buffers, which the floors' model of a
        # pipeline over whole gradients does not describe: none rather than wrong ones
        results["floors"] = self.floors(summary) if self.sharded is None else None
        if self.elastic or self.faults.injects:
            results["faults"] = {"injected": fault_events.read_events(self.run_dir),
                                 "recoveries": self.recoveries}
        write_json_atomic(self.run_dir / "results.json", results)
        r.finish(results)
        print(format_summary(results, self.run_dir), flush=True)
        return results

    def floors(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Each phase against its floor on this machine (compbench.records.floors); rank 0 measures the read
        pass now, after training, over a tensor the size of the parameters."""
        from compbench.comm.cost_model import pattern
        from compbench.records.floors import measure_read_gbps, measure_sampled_read_ns, phase_floors

        params = list(self.model.parameters())
        nbytes = sum(p.numel() * p.element_size() for p in params)
        device = params[0].device if params else "cpu"
        read_gbps = measure_read_gbps(nbytes, device)
        sampled = int(summary.get("sampled_reads_per_step") or 0)
        sampled_ns = measure_sampled_read_ns(nbytes, sampled, device) if sampled else 0.0
        memory_passes = registry.declared("memory", self.cfg.choices.memory).state_passes
        sparse = self.pipeline.sparse_names if self.pipeline is not None else frozenset()
        handed = sum(p.numel() * 4 for n, p in self.model.named_parameters() if n in sparse)
        return phase_floors(summary, world_size=self.engine.size, read_gbps=read_gbps,
                            link_gbps=_slowest_link(self.cfg.net), memory_passes=memory_passes,
                            optim=registry.plain(self.cfg.optim), pattern=pattern(self.cfg.choices.comm),
                            handed_over=handed, sampled_read_ns=sampled_ns)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """An unsharded run's tensor is all this worker's."""
    return t


def _slowest_link(net: DictConfig) -> float | None:
    """The shaped link a collective's time is bound by: the job's, or the slowest of the workers' own."""
    if net.get("emulate_rank_gbps") is not None:
        return min(float(g) for g in net.emulate_rank_gbps)
    return net.get("emulate_gbps")


def environment(engine, precision: str = "fp32", load_before: float | None = None,
                others: machine.Others | None = None) -> dict[str, Any]:
    """results.json's `environment`: versions, the device, the engine, and the machine around the run
    (compbench.records.provenance: commit, CPU, cores, load before and after, loaded or not)."""
    import importlib.metadata as md

    def version(pkg: str) -> str | None:
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    return {
        "python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
        "device": str(engine.device), "precision": precision, "backend": engine.backend,
        "device_name": torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda" else "cpu",
        "threads_per_rank": torch.get_num_threads(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),  # rank 0's CPU priority (the nice setting)
        "engine": engine.name, "world_size": engine.size,
        "versions": {p: version(p) for p in ("torch", "torchvision", "timm", "horovod", "hydra-core", "numpy",
                                             "compbench")},
        **provenance.machine(provenance.load_average() if load_before is None else load_before,
                             provenance.load_average(), engine.local_size * torch.get_num_threads(),
                             *((others.runnable, others.cores) if others is not None else ())),
    }
