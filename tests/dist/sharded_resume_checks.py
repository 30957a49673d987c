"""Run as every rank of a sharded job (`python sharded_resume_checks.py CONFIG SAVED_DIR`): build the
trainer of CONFIG (a composed, checked config resuming SAVED_DIR's checkpoint, which another number
of workers may have written), load the checkpoint, compare every parameter and optimizer state tensor,
gathered whole, with the saved ones read whole from its DCP folder, then train on; exits non-zero
on a mismatch."""

import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from compbench.catalog import registry
from compbench.sync.sharded import ShardedSync
from compbench.train.loop import Trainer
from compbench.train.sharded_checkpoint import _as_dtensor, read_full


def main(config: str, saved_dir: str) -> None:
    cfg = OmegaConf.load(config)
    engine = registry.build(cfg.engine, drop=("np",))
    run_dir = Path(cfg.output_dir)
    trainer = Trainer(cfg, engine, run_dir)
    sync = trainer.sync
    assert isinstance(sync, ShardedSync) and sync.view is not None
    epoch, batch = trainer.resume_position()
    ckpt = torch.load(Path(saved_dir) / "checkpoint.pt", weights_only=True)
    written = ckpt["world_size"]
    assert written != engine.size, "a resharded resume"
    assert (epoch, batch) == (ckpt["position"]["epoch"], ckpt["position"]["batch"] * written // engine.size)
    assert trainer.step == ckpt["step"], (trainer.step, ckpt["step"])
    saved = read_full(Path(saved_dir) / ckpt["sharded"]["dcp"])
    scalars = ckpt["sharded"]["optimizer"]["state"]
    compared = 0
    for name, p, view in sync.view.pairs:
        assert torch.equal(p.full_tensor(), saved[f"model.{name}"]), name  # type: ignore[attr-defined]
        state = trainer.optimizer.state[view]
        for key in ("exp_avg", "exp_avg_sq"):
            whole = _as_dtensor(state[key], p).full_tensor()
            assert torch.equal(whole, saved[f"optimizer.{name}.{key}"]), (name, key)
            compared += 1
        assert torch.equal(state["step"].cpu(), scalars[name]["step"].cpu()), name
    assert compared == 2 * len(sync.view.pairs) > 0
    for group, want in zip(trainer.optimizer.param_groups, ckpt["sharded"]["optimizer"]["param_groups"],
                           strict=True):
        assert group["lr"] == want["lr"] and group["betas"] == want["betas"], (group, want)
    trainer.start_at = (epoch, batch)  # loaded: fit continues from here without loading again
    results = trainer.fit()
    assert trainer.step == cfg.max_steps > ckpt["step"], trainer.step
    if engine.rank == 0:
        assert results is not None and torch.isfinite(torch.tensor(results["summary"]["final_loss"])), results
    engine.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
