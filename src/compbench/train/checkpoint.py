"""Checkpoints: everything needed to continue a run exactly, written atomically by rank 0.

Model, optimizer, LR schedule and scheduler are rank 0's; the synchronizer's state (error-feedback
memories, compressor state such as momentum, residuals, warm starts, communicator state such as the
ps server's memory, and where ranks diverge inside a round their own
parameters and optimizer state) and RNG states are per rank, so they are gathered to rank 0
through the engine (only rank 0 writes files).
Every stateful part saves and loads through its own `state_dict` / `load_state_dict`.
The file is written to a temporary name and renamed: a crash mid-write leaves the previous checkpoint
intact. `position` is where training continues: (epoch, index of the next batch in that epoch).

A sharded run (`sharding=fsdp|hsdp`) keeps its model and optimizer tensors out of the file: every
worker writes its shards into a folder beside it through torch.distributed.checkpoint
(compbench.train.sharded_checkpoint), which checkpoint.pt names; a checkpoint of `sharding=fsdp` can
be resumed by another number of workers (`reshard_refusal` says when not).

A checkpoint holds tensors and plain data only (dicts, lists, str, numbers, bool, None) and is read
with `torch.load(weights_only=True)`: a crafted file cannot run code. `check_resume` (called by the
config check, in the parent, before any folder is written) refuses a checkpoint that is unreadable, or
that another run wrote: see `math_settings` for what must match.
"""

from __future__ import annotations

import io
import os
import pickle
import secrets
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

if TYPE_CHECKING:
    from compbench.engines.base import Engine
    from compbench.schedulers import Scheduler
    from compbench.sync import Synchronizer
    from compbench.sync.sharded import ShardedSync
    from compbench.train.progress import Progress

FILE = "checkpoint.pt"
FORMAT = 3  # 2: holds the run's config; plain data only. 3: the synchronizer's state per rank

# The groups whose choice and parameters change a run's arithmetic (`net` only models or shapes the
# network: a SeCoPa plan made from it is saved with the scheduler's state).
_MATH_GROUPS = ("model", "dataset", "compressor", "memory", "comm", "scheduler", "sync", "sharding", "engine",
                "optim")
# Group parameters that may change on resume: the weights come from the checkpoint, not from
# `pretrained`; the same data may move (`root`); the world size is compared as the number of workers
# that wrote the file (also right under an external launcher); a timeout, and whether the engine runs
# elastic and its fewest workers, are not arithmetic.
_FREE = {"model.pretrained", "dataset.root", "engine.np", "engine.timeout_s", "engine.elastic",
         "engine.min_np"}
_MATH_TOP = ("seed", "batch_size")


def math_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run (its config as plain data) that a resumed run must share, as
    `{override key: value}`, group choices first.

    Compared: the choice of model, dataset, compressor, memory, comm, scheduler, sync, sharding,
    engine and optim; every parameter of those groups (the model's width, the compressor's ratio,
    the memory's beta, the optimizer's lr, momentum, weight decay and schedule, the scheduler's
    groups or plan, the sharding's formats, ...) except model.pretrained, dataset.root, engine.np,
    engine.timeout_s, engine.elastic and engine.min_np; seed; batch_size; and, separately, the
    number of workers (`reshard_refusal`). A config written before the `sharding` group existed
    reads as sharding=none.
    Free to differ: epochs (to extend a run: a cosine or step schedule then follows the new length),
    max_steps, eval, eval_batch_size, checkpoint, checkpoint_every_steps, resume, output_dir,
    outputs_root, progress, num_workers, threads, flush_denormal, on_nonfinite (e.g. skip past a
    NaN), net.*, sweep settings, and the `ratio` shorthand (compared as compressor.ratio).
    """
    if "sharding" not in config:  # written before sharded runs existed: unsharded
        config = {**config, "sharding": {"layout": "none"},
                  "choices": {**(config.get("choices") or {}), "sharding": "none"}}
    choices = config.get("choices") or {}
    out: dict[str, Any] = {g: choices.get(g) for g in _MATH_GROUPS}
    for group in _MATH_GROUPS:
        for key, value in _flatten(config.get(group) or {}, group):
            if key not in _FREE and not key.endswith("._target_"):
                out[key] = value
    out.update({k: config.get(k) for k in _MATH_TOP})
    return out


def _flatten(d: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}.{k}")
        else:
            out.append((f"{prefix}.{k}", v))
    return out


def _show(v: Any) -> str:
    """A value as it is written on the command line."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_show(x) for x in v) + "]"
    return str(v)


def run_config(cfg: DictConfig) -> dict[str, Any]:
    """The run's config as plain data (what a checkpoint stores)."""
    return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # a DictConfig gives a dict


# -- reading ----------------------------------------------------------------------------------------


def read_checkpoint(path: Path, who: str, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load a checkpoint (tensors and plain data only) onto `map_location`, whatever device wrote it
    (a GPU run resumes on the CPU and back); ValueError naming `who` (e.g. `resume=DIR`) for a file
    that is unsafe, truncated, or not a compbench checkpoint."""
    state = load_safely(path, who, map_location)
    if not isinstance(state, dict) or not ("model" in state or "sharded" in state) or "position" not in state:
        raise ValueError(f"{who}: {path} is not a compbench checkpoint; pass a run directory or its {FILE}")
    if state.get("format") != FORMAT or not isinstance(state.get("config"), dict):
        raise ValueError(f"{who}: {path} was written by an older compbench (checkpoint format "
                         f"{state.get('format', 1)}, this one reads {FORMAT}); start a new run")
    return state


def load_safely(path: Path, who: str, map_location: torch.device | str = "cpu",
                fix: str = "pass another checkpoint or start a new run") -> Any:
    """`torch.load(weights_only=True)` of a file compbench wrote (a checkpoint, an elastic commit):
    ValueError naming `who` and `fix` for one that holds objects other than tensors and plain data
    (loading it could run code), or that is truncated or corrupt; FileNotFoundError as it is."""
    try:
        with warnings.catch_warnings():  # e.g. torch's note on a foreign pickle protocol
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" in str(e).lower():  # the weights-only unpickler met a class or function to import
            raise ValueError(f"{who}: {path} holds objects other than tensors and plain data (loading it "
                             f"could run code); refusing it: {fix}") from None
        raise ValueError(f"{who}: {path} is not a checkpoint of tensors and plain data (corrupt, or a "
                         f"pickle that could run code); {fix}") from None
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as e:
        raise ValueError(f"{who}: {path} is truncated or corrupt ({_first_line(e)}); {fix}") from None
    return state


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def find_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """`resume=auto`: this run's checkpoint if there is one; otherwise a run dir or a file."""
    if resume == "auto":
        path = run_dir / FILE
        return path if path.is_file() else None
    path = Path(resume)
    path = path / FILE if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"resume={resume}: no {FILE} there; "
                         f"pass a run directory, a checkpoint file or resume=auto")
    return path


def world_size(cfg: DictConfig) -> int:
    """The number of workers this run will have: engine.np, or the external launcher's job size."""
    from compbench.launch.processes import external_engine

    joined = external_engine()
    if joined == "horovod" and os.environ.get("HOROVOD_SIZE"):
        return int(os.environ["HOROVOD_SIZE"])
    if joined == "torch":
        return int(os.environ["WORLD_SIZE"])
    return int(cfg.engine.get("np", 1))


def check_resume(cfg: DictConfig, model: nn.Module | None = None, steps_per_epoch: int | None = None) -> None:
    """Refuse, before anything is written, a `resume=` checkpoint this run cannot continue exactly:
    missing, unreadable or unsafe, written by a run whose arithmetic differs (`math_settings`), or not
    of a checkpoint's shape (`check_schema`: `model` is this run's, built on the meta device).
    `resume=auto` is checked when this run's folder already holds a checkpoint."""
    if not cfg.resume:
        return
    if cfg.resume == "auto":
        if not cfg.output_dir:
            raise ValueError("resume=auto continues the run in output_dir; pass output_dir=DIR too")
        path = find_checkpoint("auto", Path(cfg.output_dir))
        if path is None:
            return  # nothing to continue yet: the run starts from scratch
        who = f"resume=auto ({path})"
    else:
        path = find_checkpoint(cfg.resume, Path("."))
        who = f"resume={cfg.resume}"
    assert path is not None
    state = read_checkpoint(path, who)
    world = world_size(cfg)
    check_same_run(state, run_config(cfg), world, who)
    check_schema(state, model, steps_per_epoch, who, world, path.parent)


def check_schema(state: dict[str, Any], model: nn.Module | None, steps_per_epoch: int | None,
                 who: str, workers: int | None = None, folder: Path | None = None) -> None:
    """ValueError (one line) where a checkpoint of this run's settings is not what a checkpoint holds
    (a file edited or cut by hand): a position and step that are whole numbers within the run, each
    worker's state with a generator state, the model's parameters by name and shape, an optimizer's
    state; a sharded run's record of them (`sharded_checkpoint.check_record`) and, given the
    checkpoint's `folder`, its DCP folder there. `workers`: how many continue it (the position is
    theirs: `continue_at`)."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{who}: the checkpoint's {what}; it was not written whole by compbench: pass "
                          "another checkpoint or start a new run")

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    position, step = state.get("position"), state.get("step")
    if not (isinstance(position, dict) and whole(position.get("epoch")) and whole(position.get("batch"))):
        raise bad(f"position {position!r} is not an epoch and a batch, whole numbers >= 0")
    batch = continue_at(state, workers, who)[1] if workers is not None else position["batch"]
    if steps_per_epoch is not None and batch > steps_per_epoch:
        raise bad(f"position (batch {batch}) is past its epoch's {steps_per_epoch} batches")
    if not whole(step):
        raise bad(f"step {step!r} is not a whole number >= 0")
    per_rank, world = state.get("per_rank"), state.get("world_size")
    if not isinstance(per_rank, list) or len(per_rank) != world:
        count = len(per_rank) if isinstance(per_rank, list) else "no"
        raise bad(f"per-worker state has {count} entries for {world} workers")
    rng = torch.get_rng_state()
    for rank, mine in enumerate(per_rank):
        got = mine.get("torch_rng") if isinstance(mine, dict) else None
        if not (isinstance(got, torch.Tensor) and got.dtype == rng.dtype and got.shape == rng.shape):
            raise bad(f"worker {rank}'s generator state is not a generator's")
    if "sharded" in state:
        record = state["sharded"]
        name = record.get("dcp") if isinstance(record, dict) else None
        at = folder / name if folder is not None and isinstance(name, str) else None
        from compbench.train import sharded_checkpoint  # DCP's modules: for a sharded checkpoint only

        wrong = sharded_checkpoint.check_record(record, model, at)
        if wrong is not None:
            raise bad(wrong)
        return
    optimizer = state.get("optimizer")
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list) and optimizer["param_groups"]):
        raise bad("optimizer state has no parameter groups")
    if model is not None:
        saved, want = state["model"], model.state_dict()
        if not isinstance(saved, dict):
            raise bad("model is not a state dict")
        for name, t in want.items():
            got = saved.get(name)
            if not isinstance(got, torch.Tensor):
                raise bad(f"model has no {name}")
            if got.shape != t.shape:
                raise bad(f"model's {name} is of shape {list(got.shape)} where this model's is "
                          f"{list(t.shape)}")
        extra = [k for k in saved if k not in want]
        if extra:
            raise bad(f"model holds {extra[0]}, which this model has not")


def check_same_run(state: dict[str, Any], config: dict[str, Any], world: int, who: str) -> None:
    """ValueError naming the first setting in which the checkpoint's run differs from this one:
    sharded or not, the number of workers (`reshard_refusal`), then `math_settings`."""
    check_layout(state, (config.get("choices") or {}).get("sharding") or "none", who)
    refusal = reshard_refusal(state, world, who)
    if refusal is not None:
        raise ValueError(refusal)
    then, now = math_settings(state["config"]), math_settings(config)
    for key in [*then, *(k for k in now if k not in then)]:
        if key not in then:
            raise ValueError(f"{who} was written without {key}; start a new run")
        if key not in now or now[key] != then[key]:
            setting = f"{key}={_show(then[key])}"
            raise ValueError(f"{who} was written with {setting}; resume with {setting} (or start a new run)")


def check_layout(state: dict[str, Any], sharding: str, who: str) -> None:
    """ValueError where a sharded run's checkpoint (its model and optimizer in a DCP folder) is
    resumed without sharding or the reverse; `sharding`: this run's choice (none, fsdp, hsdp)."""
    written = (state.get("config", {}).get("choices") or {}).get("sharding") or "none"
    if "sharded" in state and sharding == "none":
        raise ValueError(f"{who} was written by a sharded run (sharding={written}); resume with "
                         f"sharding={written}")
    if "sharded" not in state and sharding != "none":
        raise ValueError(f"{who} was written by a run without sharding; resume with sharding=none "
                         f"(drop sharding={sharding})")


def reshard_refusal(state: dict[str, Any], world: int, who: str) -> str | None:
    """Why `world` workers cannot continue a checkpoint (None: they can). The workers that wrote it
    can; others only a sharding=fsdp run's whose synchronizer keeps no state of its own shards
    besides the generators' (DCP reshards the model and the optimizer, not per-rank state such as
    LoCo's errors: sharding.scatter=loco4), and from where its data order continues
    (`continue_at`). HSDP's replica groups are fixed to its workers."""
    written = state.get("world_size")
    if written == world:
        return None
    fix = f"resume with engine.np={written}"
    if "sharded" not in state:
        return f"{who} was written by {written} workers; {fix} (or start a new run)"
    record = state["sharded"] if isinstance(state["sharded"], dict) else {}
    layout = (record.get("layout") or {}).get("layout")
    if layout != "fsdp":
        return (f"{who} was written by {written} workers of sharding={layout}, whose shard and replica "
                f"groups are fixed to its workers; {fix}")
    own = [{k: v for k, v in mine.items() if k not in ("torch_rng", "cuda_rng")}
           for mine in state.get("per_rank") or [] if isinstance(mine, dict)]
    if any(_holds_tensor(mine) for mine in own):
        return (f"{who} was written by {written} workers whose synchronizer keeps state of their own "
                f"shards (e.g. sharding.scatter=loco4's errors), which another number of workers cannot "
                f"split; {fix}")
    return None


def _holds_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_holds_tensor(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_holds_tensor(v) for v in obj)
    return False


def continue_at(state: dict[str, Any], world: int, who: str) -> tuple[int, int]:
    """The position (epoch, batch) `world` workers continue a checkpoint from: its own, or, where
    another number of workers wrote it (a resharded resume), the batch at which the epoch's data
    order has been used as far (every worker takes its share of one order per epoch: batch b of W
    workers ends where batch b*W/world of `world` workers does); ValueError where no batch does."""
    epoch, batch, written = state["position"]["epoch"], state["position"]["batch"], state["world_size"]
    if written == world or not isinstance(written, int):
        return epoch, batch
    if batch * written % world:
        raise ValueError(f"{who} stopped after batch {batch} of its epoch on {written} workers, where no "
                         f"batch of {world} workers ends; resume with engine.np={written}, or from a "
                         "checkpoint at an epoch's end")
    return epoch, batch * written // world


# -- writing and restoring (in the workers) ------------------------------------------------------


@dataclass
class TrainingState:
    """What a checkpoint saves and restores: the parts of a run that change as it trains. The
    trainer hands this record over; the checkpoint reads nothing else of it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    lr_schedule: LRScheduler
    sync: Synchronizer  # per rank: memories, compressor and communicator state, a round's position
    scheduler: Scheduler | None  # e.g. SeCoPa's plan, MergeComp's grouping: decided again they could differ
    progress: Progress  # the curve so far, training time, target
    step: int
    # a sharded run's synchronizer (its model and optimizer go to a DCP folder); None unsharded
    sharded: ShardedSync | None = None


@dataclass(frozen=True)
class CheckpointPlace:
    """Where and for which run a checkpoint is written: the engine gathers every rank's state to
    rank 0, which writes `run_dir/checkpoint.pt` holding `config` (the run's config as plain data)."""

    engine: Engine
    run_dir: Path
    config: dict[str, Any]


def rank_state(state: TrainingState, device: torch.device) -> dict[str, Any]:
    """The synchronizer's per-rank state (memories, compressor and communicator state, scheduler
    decisions, and, where ranks diverge inside a round (diloco), their parameters and optimizer)
    and the random generators' states: the CPU's, and the rank's GPU's on `device` cuda."""
    rng = {"torch_rng": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda_rng"] = torch.cuda.get_rng_state(device)
    return {**state.sync.state_dict(), **rng}


def on_device(obj: Any, device: torch.device | str) -> Any:
    """A state (dicts, lists and tuples of tensors and plain data) with every tensor on `device`: a
    checkpoint or commit written on another device, or sent between ranks through host memory (a
    peer's GPU is not this rank's). Tensors already there are the same objects."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: on_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(on_device(v, device) for v in obj)
    return obj


def restore_rng(mine: dict[str, Any], device: torch.device) -> None:
    """The generators' states of `rank_state`: the CPU's always; the GPU's where this rank runs on one
    and the run that saved it did (a GPU run resumed on the CPU draws its device's numbers from the
    CPU's generator from then on, and a CPU run resumed on a GPU seeds nothing new: its GPU's
    generator keeps the run's seed)."""
    torch.set_rng_state(mine["torch_rng"].cpu())
    if device.type == "cuda" and "cuda_rng" in mine:
        torch.cuda.set_rng_state(mine["cuda_rng"].cpu(), device)


def _gather_to_all(engine: Engine, obj: Any) -> list[Any]:
    """Every rank's `obj` (tensors and plain data), on every rank, in host memory: serialized,
    all-gathered as bytes (on the rank's device: the engine's collective for it), and read back with
    weights_only (a peer's bytes are data, never code) onto the CPU (a peer's GPU is not this rank's)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(engine.device)
    return [torch.load(io.BytesIO(p[0].cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
            for p in engine.allgather([blob], "ckpt.gather")]


def shared_state(state: TrainingState, epoch: int, batch: int, world_size: int) -> dict[str, Any]:
    """What every rank holds alike (rank 0's is written): the position to continue from (epoch,
    index of the next batch), the step, the world that trained, model, optimizer, LR schedule,
    scheduler and progress. References to the live objects' state: copy it to keep it."""
    return {**_shared_rest(state, epoch, batch, world_size), "model": state.model.state_dict(),
            "optimizer": state.optimizer.state_dict()}


def _shared_rest(state: TrainingState, epoch: int, batch: int, world_size: int) -> dict[str, Any]:
    """`shared_state` but the model and the optimizer."""
    return {
        "position": {"epoch": epoch, "batch": batch},
        "step": state.step,
        "world_size": world_size,
        # compute threads per worker: a matrix product's float sums split by thread, so a run resumed
        # with other threads continues within rounding, not bit for bit (`Trainer.resume_position`)
        "threads": torch.get_num_threads(),
        "lr_schedule": state.lr_schedule.state_dict(),
        "scheduler": state.scheduler.state_dict() if state.scheduler is not None else {},
        "progress": state.progress.state_dict(),
    }


def save_checkpoint(state: TrainingState, place: CheckpointPlace, epoch: int, batch: int) -> None:
    """Collective: every rank calls it at the same point; rank 0 writes (a sharded run: every rank
    writes its shards, `_save_sharded`)."""
    if state.sharded is not None:
        _save_sharded(state, state.sharded, place, epoch, batch)
        return
    per_rank = _gather_to_all(place.engine, rank_state(state, place.engine.device))
    if place.engine.rank != 0:
        return
    saved = {"format": FORMAT, "config": place.config, **shared_state(state, epoch, batch, place.engine.size),
             "per_rank": per_rank}
    _write_file(saved, place.run_dir / FILE)


def _write_file(saved: dict[str, Any], path: Path) -> None:
    """`saved` at `path` whole or not at all: a temporary file, fsynced, renamed over it."""
    tmp = path.with_suffix(".pt.tmp")
    torch.save(saved, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_sharded(state: TrainingState, sync: ShardedSync, place: CheckpointPlace, epoch: int,
                  batch: int) -> None:
    """A sharded run's checkpoint: every rank writes its shards of the model and the optimizer into
    a new folder `checkpoint.<tag>.dcp.tmp` (DCP; `tag`: the step and rank 0's random word, sent
    with the per-rank state), which returns on every rank once all the files and DCP's metadata are
    written (its last collective is the barrier); then rank 0 alone renames the folder to
    `checkpoint.<tag>.dcp` (a folder without `.tmp` is whole), writes checkpoint.pt naming it
    (`_write_file`: the rename over the old file is the one commit), and removes the other
    folders. Never is a folder that checkpoint.pt names written or renamed: a crash before the
    commit leaves the previous checkpoint.pt and its folder, one after it the new ones (a folder
    left over is removed at the next checkpoint)."""
    from compbench.train import sharded_checkpoint  # DCP's modules: for a sharded run only

    engine = place.engine
    tag = f"step{state.step}-{secrets.token_hex(4)}"
    gathered = _gather_to_all(engine, (rank_state(state, engine.device), tag))
    name = f"checkpoint.{gathered[0][1]}{sharded_checkpoint.SUFFIX}"
    folder = place.run_dir / name
    tmp = folder.with_name(name + sharded_checkpoint.TMP)
    record = sharded_checkpoint.save(state.model, state.optimizer, sync, tmp)
    if engine.rank != 0:
        return
    os.replace(tmp, folder)
    _fsync_dir(place.run_dir)  # the folder's new name on disk before a file names it
    saved = {"format": FORMAT, "config": place.config, **_shared_rest(state, epoch, batch, engine.size),
             "sharded": {**record, "dcp": name}, "per_rank": [mine for mine, _ in gathered]}
    _write_file(saved, place.run_dir / FILE)
    _fsync_dir(place.run_dir)
    sharded_checkpoint.remove_others(place.run_dir, name)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(state: TrainingState, engine: Engine, path: Path,
                    who: str) -> tuple[int, int, int | None]:
    """Restore everything saved into `state` (its objects in place, its `step`); returns the position
    (epoch, batch) to continue from and the compute threads per worker of the run that wrote it
    (None: not recorded). The parent's config check (`check_resume`) has already refused a
    checkpoint of another run; the world size is checked again here, where it is known for sure,
    and whether the run is sharded as the one that wrote it.

    A sharded run loads its model and optimizer from the checkpoint's DCP folder
    (`sharded_checkpoint.load`: on another number of workers, resharded, each rank then taking the
    generators' state of rank `rank % written` and its synchronizer starting afresh, which
    `reshard_refusal` allows only where the writers' held nothing else)."""
    saved = read_checkpoint(path, who, map_location=engine.device)
    sync = state.sharded
    check_layout(saved, sync.sharding.layout if sync is not None else "none", who)
    refusal = reshard_refusal(saved, engine.size, who)
    if refusal is not None:
        raise ValueError(refusal)
    epoch, batch = continue_at(saved, engine.size, who)
    written = saved["world_size"]
    mine = saved["per_rank"][engine.rank % written]
    if sync is None:
        restore_state(state, saved, mine, engine.device)
    else:
        from compbench.train import sharded_checkpoint

        record = saved["sharded"]
        folder = path.parent / record["dcp"]
        wrong = sharded_checkpoint.check_record(record, None, folder)
        if wrong is not None:
            raise ValueError(f"{who}: the checkpoint's {wrong}; pass another checkpoint or start a new run")
        sharded_checkpoint.load(state.model, state.optimizer, sync, record, folder)
        _restore_rest(state, on_device(saved, engine.device), on_device(mine, engine.device), engine.device,
                      own=written == engine.size)
    return epoch, batch, saved.get("threads")


def restore_state(state: TrainingState, shared: dict[str, Any], mine: dict[str, Any],
                  device: torch.device) -> tuple[int, int]:
    """Load `shared` (`shared_state`'s) and this rank's `mine` (`rank_state`'s) into `state`'s objects
    and its `step`; returns the position (epoch, batch) to continue from. The tensors are loaded
    where the objects' own are (`load_state_dict` copies into them, or the caller mapped them to
    `device`)."""
    shared, mine = on_device(shared, device), on_device(mine, device)  # a state another device wrote
    state.model.load_state_dict(shared["model"])
    state.optimizer.load_state_dict(shared["optimizer"])
    _restore_rest(state, shared, mine, device)
    return shared["position"]["epoch"], shared["position"]["batch"]


def _restore_rest(state: TrainingState, shared: dict[str, Any], mine: dict[str, Any], device: torch.device,
                  own: bool = True) -> None:
    """`restore_state` after the model and the optimizer (on `device` already); `own` False: the
    synchronizer keeps its fresh state (a resharded resume)."""
    state.lr_schedule.load_state_dict(shared["lr_schedule"])
    if state.scheduler is not None:
        state.scheduler.load_state_dict(shared["scheduler"])
    if own:
        state.sync.load_state_dict(mine)  # after the model and optimizer: a rank's own replace rank 0's
    restore_rng(mine, device)
    state.step = shared["step"]
    if "progress" in shared:  # written by a compbench that records curves
        state.progress.load_state_dict(shared["progress"])
