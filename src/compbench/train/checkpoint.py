"""Checkpoints: everything needed to continue a run exactly, written atomically by rank 0.

Model, optimizer, LR schedule and scheduler are rank 0's; the synchronizer's state (error-feedback
memories, compressor state such as momentum, residuals, warm starts, communicator state such as the
ps server's memory, and where ranks diverge inside a round their own
parameters and optimizer state) and RNG states are per rank, so they are gathered to rank 0
through the engine (only rank 0 writes files).
Every stateful part saves and loads through its own `state_dict` / `load_state_dict`.
The file is written to a temporary name and renamed: a crash mid-write leaves the previous checkpoint
intact. `position` is where training continues: (epoch, index of the next batch in that epoch).

A checkpoint holds tensors and plain data only (dicts, lists, str, numbers, bool, None) and is read
with `torch.load(weights_only=True)`: a crafted file cannot run code. `check_resume` (called by the
config check, in the parent, before any folder is written) refuses a checkpoint that is unreadable, or
that another run wrote: see `math_settings` for what must match.
"""

from __future__ import annotations

import io
import os
import pickle
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
    from compbench.train.progress import Progress

FILE = "checkpoint.pt"
FORMAT = 3  # 2: holds the run's config; plain data only. 3: the synchronizer's state per rank

# The groups whose choice and parameters change a run's arithmetic (`net` only models or shapes the
# network: a SeCoPa plan made from it is saved with the scheduler's state).
_MATH_GROUPS = ("model", "dataset", "compressor", "memory", "comm", "scheduler", "sync", "engine", "optim")
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

    Compared: the choice of model, dataset, compressor, memory, comm, scheduler, engine and optim;
    every parameter of those groups (the model's width, the compressor's ratio, the memory's beta,
    the optimizer's lr, momentum, weight decay and schedule, the scheduler's groups or plan, ...)
    except model.pretrained, dataset.root, engine.np, engine.timeout_s, engine.elastic and
    engine.min_np; seed; batch_size; and,
    separately, the number of workers.
    Free to differ: epochs (to extend a run: a cosine or step schedule then follows the new length),
    max_steps, eval, eval_batch_size, checkpoint, checkpoint_every_steps, resume, output_dir,
    outputs_root, progress, num_workers, threads, flush_denormal, on_nonfinite (e.g. skip past a
    NaN), net.*, sweep settings, and the `ratio` shorthand (compared as compressor.ratio).
    """
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
    if not isinstance(state, dict) or "model" not in state or "position" not in state:
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
    check_same_run(state, run_config(cfg), world_size(cfg), who)
    check_schema(state, model, steps_per_epoch, who)


def check_schema(state: dict[str, Any], model: nn.Module | None, steps_per_epoch: int | None,
                 who: str) -> None:
    """ValueError (one line) where a checkpoint of this run's settings is not what a checkpoint holds
    (a file edited or cut by hand): a position and step that are whole numbers within the run, each
    worker's state with a generator state, the model's parameters by name and shape, an optimizer's
    state."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{who}: the checkpoint's {what}; it was not written whole by compbench: pass "
                          "another checkpoint or start a new run")

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    position, step = state.get("position"), state.get("step")
    if not (isinstance(position, dict) and whole(position.get("epoch")) and whole(position.get("batch"))):
        raise bad(f"position {position!r} is not an epoch and a batch, whole numbers >= 0")
    if steps_per_epoch is not None and position["batch"] > steps_per_epoch:
        raise bad(f"position (batch {position['batch']}) is past its epoch's {steps_per_epoch} batches")
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
    """ValueError naming the first setting in which the checkpoint's run differs from this one."""
    if state.get("world_size") != world:
        raise ValueError(f"{who} was written by {state.get('world_size')} workers; resume with "
                         f"engine.np={state.get('world_size')} (or start a new run)")
    then, now = math_settings(state["config"]), math_settings(config)
    for key in [*then, *(k for k in now if k not in then)]:
        if key not in then:
            raise ValueError(f"{who} was written without {key}; start a new run")
        if key not in now or now[key] != then[key]:
            setting = f"{key}={_show(then[key])}"
            raise ValueError(f"{who} was written with {setting}; resume with {setting} (or start a new run)")


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
    return {
        "position": {"epoch": epoch, "batch": batch},
        "step": state.step,
        "world_size": world_size,
        # compute threads per worker: a matrix product's float sums split by thread, so a run resumed
        # with other threads continues within rounding, not bit for bit (`Trainer.resume_position`)
        "threads": torch.get_num_threads(),
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "lr_schedule": state.lr_schedule.state_dict(),
        "scheduler": state.scheduler.state_dict() if state.scheduler is not None else {},
        "progress": state.progress.state_dict(),
    }


def save_checkpoint(state: TrainingState, place: CheckpointPlace, epoch: int, batch: int) -> None:
    """Collective: every rank calls it at the same point; rank 0 writes."""
    per_rank = _gather_to_all(place.engine, rank_state(state, place.engine.device))
    if place.engine.rank != 0:
        return
    saved = {"format": FORMAT, "config": place.config, **shared_state(state, epoch, batch, place.engine.size),
             "per_rank": per_rank}
    path = place.run_dir / FILE
    tmp = path.with_suffix(".pt.tmp")
    torch.save(saved, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(state: TrainingState, engine: Engine, path: Path,
                    who: str) -> tuple[int, int, int | None]:
    """Restore everything saved into `state` (its objects in place, its `step`); returns the position
    (epoch, batch) to continue from and the compute threads per worker of the run that wrote it
    (None: not recorded). The parent's config check (`check_resume`) has already refused a
    checkpoint of another run; the world size is checked again here, where it is known for sure."""
    saved = read_checkpoint(path, who, map_location=engine.device)
    if saved["world_size"] != engine.size:
        raise ValueError(f"{path} was written by {saved['world_size']} workers; "
                         f"resume with engine.np={saved['world_size']}")
    epoch, batch = restore_state(state, saved, saved["per_rank"][engine.rank], engine.device)
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
    state.lr_schedule.load_state_dict(shared["lr_schedule"])
    if state.scheduler is not None:
        state.scheduler.load_state_dict(shared["scheduler"])
    state.sync.load_state_dict(mine)  # after the model and optimizer: a rank's own replace rank 0's
    restore_rng(mine, device)
    state.step = shared["step"]
    if "progress" in shared:  # written by a compbench that records curves
        state.progress.load_state_dict(shared["progress"])
    return shared["position"]["epoch"], shared["position"]["batch"]
