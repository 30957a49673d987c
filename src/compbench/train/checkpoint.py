"""Checkpoints: everything needed to continue a run exactly, written atomically by rank 0.

Model, optimizer and LR schedule are the same on every rank; error-feedback memories, compressor
state (momentum, residuals, warm starts), communicator state and RNG states are per rank, so they are
gathered to rank 0 through the engine (only rank 0 writes files). The file is written to a temporary
name and renamed: a crash mid-write leaves the previous checkpoint intact.
`position` is where training continues: (epoch, index of the next batch in that epoch).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

FILE = "checkpoint.pt"


def _rank_state(trainer: Any) -> dict[str, Any]:
    comm = trainer.pipeline.comm
    return {
        "memory": trainer.memory.state_dict(),
        "compressor": trainer.compressor.state_dict(),
        "comm": comm.state_dict() if hasattr(comm, "state_dict") else {},
        "torch_rng": torch.get_rng_state(),
    }


def _gather_to_all(engine: Any, obj: Any) -> list[Any]:
    buf = io.BytesIO()
    torch.save(obj, buf)
    blob = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    return [torch.load(io.BytesIO(p[0].numpy().tobytes()), weights_only=False)
            for p in engine.allgather([blob], "ckpt.gather")]


def save_checkpoint(trainer: Any, epoch: int, batch: int) -> None:
    """Collective: every rank calls it at the same point; rank 0 writes."""
    if not trainer.cfg.checkpoint:
        return
    per_rank = _gather_to_all(trainer.engine, _rank_state(trainer))
    if not trainer.rank0:
        return
    state = {
        "position": {"epoch": epoch, "batch": batch},
        "step": trainer.step,
        "world_size": trainer.engine.size,
        "compressor_name": trainer.cfg.choices["compressor"],
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "lr_schedule": trainer.lr_schedule.state_dict(),
        # e.g. SeCoPa's plan: planned again on resume it could decide differently
        "scheduler": trainer.scheduler.state_dict() if hasattr(trainer.scheduler, "state_dict") else {},
        "per_rank": per_rank,
    }
    path = trainer.run_dir / FILE
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def load_checkpoint(trainer: Any, path: Path) -> tuple[int, int]:
    """Restore everything saved; returns the position (epoch, batch) to continue from."""
    state = torch.load(path, weights_only=False)
    if state["world_size"] != trainer.engine.size:
        raise ValueError(f"{path} was written by {state['world_size']} workers; "
                         f"resume with engine.np={state['world_size']}")
    if state["compressor_name"] != trainer.cfg.choices["compressor"]:
        raise ValueError(f"{path} was written with compressor={state['compressor_name']}; "
                         f"resume with the same compressor")
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.lr_schedule.load_state_dict(state["lr_schedule"])
    if state.get("scheduler") and hasattr(trainer.scheduler, "load_state_dict"):
        trainer.scheduler.load_state_dict(state["scheduler"])
    mine = state["per_rank"][trainer.engine.rank]
    trainer.memory.load_state_dict(mine["memory"])
    trainer.compressor.load_state_dict(mine["compressor"])
    if hasattr(trainer.pipeline.comm, "load_state_dict"):
        trainer.pipeline.comm.load_state_dict(mine["comm"])
    torch.set_rng_state(mine["torch_rng"])
    trainer.step = state["step"]
    return state["position"]["epoch"], state["position"]["batch"]
