"""Sharded checkpoints (sharding=fsdp, DCP): a 2-worker run stopped at step 2 and resumed ends bit for
bit where the uninterrupted run does; the same checkpoint resumed by 1 worker holds, after loading,
every parameter and optimizer state tensor the 2 workers saved, and trains on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from compbench.launch.processes import run_processes
from compbench.train.sharded_checkpoint import read_full
from tests.helpers import results, train

pytestmark = pytest.mark.dist
GPT = ["model=gpt", "model.n_layer=2", "model.n_embd=32", "dataset=shakespeare", "optim=adamw",
       "engine=torch", "sharding=fsdp", "checkpoint_every_steps=2", "eval=false", "progress=false"]
CHECKS = str(Path(__file__).with_name("sharded_resume_checks.py"))


def _saved(run: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """checkpoint.pt and its DCP folder's tensors, whole."""
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    return ckpt, read_full(run / ckpt["sharded"]["dcp"])


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A 2-worker run stopped at step 2 (its checkpoint's)."""
    out, _ = train(tmp_path_factory.mktemp("sharded"), *GPT, "engine.np=2", "max_steps=2", name="stopped")
    return out


def test_a_sharded_run_resumed_ends_bit_for_bit_as_the_uninterrupted_one(tmp_path, stopped):
    whole, _ = train(tmp_path, *GPT, "engine.np=2", "max_steps=4", name="whole")
    resumed, proc = train(tmp_path, *GPT, "engine.np=2", "max_steps=4", f"resume={stopped}", name="resumed")
    assert "at epoch 1, batch 2 (step 2)" in proc.stdout
    (a, ta), (b, tb) = _saved(whole), _saved(resumed)
    assert a["step"] == b["step"] == 4 and a["position"] == b["position"]
    assert ta.keys() == tb.keys() and any(k.startswith("optimizer.") for k in ta)
    assert [k for k in ta if not torch.equal(ta[k], tb[k])] == []
    assert a["sharded"]["optimizer"]["state"] == b["sharded"]["optimizer"]["state"]
    assert results(whole)["summary"]["final_loss"] == results(resumed)["summary"]["final_loss"]
    # one folder per run: the stopped run's checkpoint (step 2) is kept whole beside its file
    assert [p.name for p in resumed.glob("checkpoint.*.dcp*")] == [b["sharded"]["dcp"]]
    assert (stopped / torch.load(stopped / "checkpoint.pt", weights_only=True)["sharded"]["dcp"]).is_dir()


def test_a_sharded_checkpoint_resumed_by_another_number_of_workers_holds_the_saved_state(tmp_path, stopped):
    from compbench.compose.config import check, compose

    # composed and checked here, as the CLI does (the resume is accepted at compose time)
    cfg = check(compose([*GPT, "engine.np=1", "max_steps=4", f"resume={stopped}",
                         f"output_dir={tmp_path / 'one'}"]))
    (tmp_path / "one").mkdir()
    config = tmp_path / "config.yaml"
    OmegaConf.save(cfg, config)
    code, message = run_processes([sys.executable, CHECKS, str(config), str(stopped)], "torch", 1, threads=1)
    assert code == 0, message
