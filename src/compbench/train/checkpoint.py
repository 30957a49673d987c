"""Checkpoints (rank 0): model, optimizer, LR schedule, memory and compressor state, written
atomically (write to a temporary file, then rename) so the last good one is never lost."""

from __future__ import annotations

import os
from typing import Any

import torch


def save_checkpoint(trainer: Any, epoch: int) -> None:
    if not trainer.rank0 or not trainer.cfg.checkpoint:
        return
    state = {
        "epoch": epoch,
        "step": trainer.step,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "lr_schedule": trainer.lr_schedule.state_dict(),
        "memory": trainer.memory.state_dict(),
        "compressor": trainer.compressor.state_dict(),
    }
    path = trainer.run_dir / "checkpoint.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
