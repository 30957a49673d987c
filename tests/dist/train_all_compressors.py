"""Run as every rank of a 2-rank job: a few training steps for every compressor x communicator on
one engine, through the real pipeline; rank 0 saves the final parameters to OUT (a .pt file)."""

import sys

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from compbench import config, registry
from compbench.train.build import build_compressor_and_selection, build_memory
from compbench.train.metrics import StepStats
from compbench.train.pipeline import GradientPipeline


def combos() -> list[tuple[str, str, str]]:
    """Every compressor x communicator of the compression pipeline that compbench accepts on both
    engines (the baselines bypass the pipeline), each with its recipe's memory."""
    out = []
    for name in registry.options("compressor"):
        for comm in registry.options("comm"):
            if registry.component_class("comm", comm).traits.baseline:
                continue
            try:
                cfgs = [config.check(config.compose([f"compressor={name}", f"comm={comm}", f"engine={e}"]))
                        for e in ("horovod", "torch")]
            except ValueError:
                continue
            out.append((name, comm, cfgs[0].choices["memory"]))
    return out


def train(engine, compressor: str, comm: str, memory: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cfg = OmegaConf.create({
        "compressor": {**registry.option_config("compressor", compressor), "dense_steps": 0},
        "memory": registry.option_config("memory", memory),
    })
    if "start_iter" in cfg.compressor:
        cfg.compressor.start_iter = 2
    comp, selection = build_compressor_and_selection(cfg)
    stats = StepStats()
    communicator = registry.build(registry.option_config("comm", comm), engine=engine, compressor=comp,
                                  stats=stats)
    pipe = GradientPipeline(engine, comp, build_memory(cfg, engine.size), communicator, selection, stats)
    sched = registry.build(registry.option_config("scheduler", "layerwise"))
    sched.setup(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + engine.rank)
    for step in range(4):
        x, y = torch.randn(8, 20, generator=g), torch.randint(4, (8,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        pipe.begin_step(step, 0.0)
        sched.synchronize(pipe)
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
