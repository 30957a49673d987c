"""The training path on a foreign device (tests.foreign_device): every compressor, memory,
communicator, scheduler and synchronization mode of test_device_placement's RUNS trains a few steps
with its model, batches and state on the placement's device, each op checked as a GPU would: no host
tensor mixed in, no host read inside compress / comm / decompress but at the allowlisted sites. And
the check itself: a deliberate mistake fails, the same code written right passes."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from omegaconf import open_dict

from compbench.catalog import registry
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.train.loop import Trainer
from tests.foreign_device import ALLOW, PLACED, SRC, ForeignDevice, ForeignDeviceError, Placed, watched_stats
from tests.threaded_engine import ThreadWorld
from tests.unit.test_device_placement import RUNS, SMALL, _known


def train_placed(run: list[str], tmp_path) -> list[ForeignDevice]:
    """Train `run` (overrides) on 2 threaded ranks whose device is the foreign one; each rank's mode."""
    cfg = config.check(config.compose([*SMALL, *(r.replace("hierarchical", "allgather") for r in run)]))
    if "comm=hierarchical" in run:  # as test_device_placement swaps it in (two emulated machines)
        with open_dict(cfg):
            cfg.comm = registry.option_config("comm", "hierarchical")
            cfg.choices.comm = "hierarchical"

    def rank(engine):
        with ForeignDevice() as mode:
            trainer = Trainer(cfg, engine, tmp_path)
            assert all(isinstance(p, Placed) for p in trainer.model.parameters())
            trainer.fit()
        return mode

    with watched_stats(), contextlib.redirect_stdout(io.StringIO()):
        return ThreadWorld(2, local_size=1, device=PLACED).run(rank, name=cfg.choices["engine"])


@pytest.mark.parametrize("run", [r for r in RUNS if _known(r)], ids=lambda r: " ".join(r))
def test_the_training_path_runs_on_a_foreign_device(run, tmp_path):
    modes = train_placed(run, tmp_path)
    assert all(not m.errors for m in modes), modes[0].errors + modes[1].errors
    assert all(len(m.steps) == 3 for m in modes)


def test_the_allowlist_says_why_for_each_site():
    assert all(":" in site and len(reason) > 20 for site, reason in ALLOW.items())


# -- the check itself ------------------------------------------------------------------------------


# A compressor-like step, compiled as if it were compbench's own code (its sites count as the
# training path's): each mistake a GPU would refuse or wait for, and the same written right.
COMPRESS = """
def compress(x, mistake):
    stats = StepStats()
    with stats.time("compress"):
        if mistake == "host ones":
            return x + torch.ones(x.numel(), device="cpu")
        if mistake == "cpu copy":
            return x.cpu() * 2
        if mistake == "from numpy":
            return x + torch.from_numpy(np.ones(x.numel(), dtype=np.float32))
        if mistake == "host generator":
            return x + torch.rand(x.numel(), generator=torch.Generator().manual_seed(0), device=x.device)
        if mistake == "item":
            return x / float(x.abs().max())
        if mistake == "tolist":
            return x * x.max().tolist()
        gen = torch.Generator(device=x.device).manual_seed(0)  # written right: the data's device
        drawn = torch.rand(x.numel(), generator=gen, device=x.device)
        return x + torch.ones(x.numel(), device=x.device) + drawn + torch.zeros((), device="cpu")  # 0-dim
"""
SITE = "compressors/_deliberate.py"


def _run(mistake: str) -> ForeignDevice:
    space = {"torch": torch, "np": np, "StepStats": StepStats}
    exec(compile(COMPRESS, SRC + SITE, "exec"), space)  # noqa: S102
    with watched_stats(), ForeignDevice() as mode:
        space["compress"](torch.ones(4).to(PLACED), mistake)
    return mode


@pytest.mark.parametrize("mistake, message", [
    ("host ones", r"aten.add.Tensor mixes placed tensors with host tensors of shape \(4,\)"),
    ("cpu copy", r"host read of a placed tensor \(copy to host\) inside compress"),
    ("from numpy", r"aten.add.Tensor mixes placed tensors with host tensors of shape \(4,\)"),
    ("host generator", r"rand draws with a host generator for the placement's device"),
    ("item", r"host read of a placed tensor \(item\) inside compress"),
    ("tolist", r"host read of a placed tensor \(tolist\) inside compress"),
])
def test_a_host_tensor_or_read_on_the_device_path_fails(mistake, message):
    where = r" at src/compbench/compressors/_deliberate.py:\d+ \(phase compress"
    with pytest.raises(ForeignDeviceError, match=message + where):
        _run(mistake)


def test_the_same_code_written_right_passes():
    mode = _run("right")
    assert not mode.errors


def test_host_waits_are_counted_per_step_inside_backward_hooks_or_elsewhere():
    with watched_stats(), ForeignDevice() as mode:
        stats = StepStats()
        w = torch.nn.Parameter(torch.ones(3).to(PLACED))
        w.register_hook(lambda g: g * float(g.sum()))  # a read inside a backward hook
        stats.begin_step()
        (w * 2).sum().backward()
        assert w.grad.tolist() == [12.0] * 3  # and one elsewhere
        stats.end_step()
    (step,) = mode.steps
    assert sum(step.in_hook.values()) == 1 and sum(step.elsewhere.values()) == 1
    assert all("test_device_foreign.py" in site for site in (*step.in_hook, *step.elsewhere))
