"""Run as every rank of a 2-rank job: a few training steps for every compressor x communicator on
one engine, through the real pipeline; rank 0 saves the final parameters to OUT (a .pt file)."""

import sys

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from compbench.compose import compat
from compbench.catalog import registry
from compbench.compressors import build_compressor
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer


def combos() -> list[tuple[str, str, str]]:
    """Every compressor x communicator of the compression pipeline that compbench's config check
    (compbench.compose.compat) accepts on both engines, each with its recipe's memory (the baselines bypass
    the pipeline). The records are read directly: composing 128 configs with Hydra takes a minute."""
    out = []
    layerwise = registry.component_class("scheduler", "layerwise").traits
    for name in registry.options("compressor"):
        caps = build_compressor(name).caps
        for comm in registry.options("comm"):
            traits = registry.component_class("comm", comm).traits
            if traits.baseline:
                continue
            memory = compat.recipe(caps, traits, "sgd").get("memory", "none")
            try:
                for engine in ("horovod", "torch"):
                    choices = {"compressor": name, "memory": memory, "comm": comm, "scheduler": "layerwise",
                               "engine": engine, "optim": "sgd"}
                    compat.check(choices, caps, registry.component_class("memory", memory).traits, traits,
                                 layerwise, {"momentum": 0.0})
            except ValueError:
                continue
            out.append((name, comm, memory))
    return out


def train(engine, compressor: str, comm: str, memory: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cfg = OmegaConf.create({
        "compressor": {**registry.option_config("compressor", compressor), "dense_steps": 0},
        "memory": registry.option_config("memory", memory),
        "comm": registry.option_config("comm", comm),
        "scheduler": registry.option_config("scheduler", "layerwise"),
    })
    if "start_iter" in cfg.compressor:
        cfg.compressor.start_iter = 2
    stats = StepStats()
    sync = build_synchronizer(cfg, engine, stats)  # the trainer's own assembly (sync=step)
    sync.setup(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + engine.rank)
    for step in range(4):
        x, y = torch.randn(8, 20, generator=g), torch.randint(4, (8,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        sync.begin_step(step, 0.0)
        sync.synchronize()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def main(engine_name: str, out: str) -> None:
    engine = registry.build(registry.option_config("engine", engine_name), drop=("np",))
    results = {f"{c}/{k}": train(engine, c, k, m) for c, k, m in combos()}
    if engine.rank == 0:
        torch.save(results, out)
    engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
