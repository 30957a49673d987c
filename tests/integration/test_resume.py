"""Exact resume for every scheduler and communicator: 2 epochs == 1 epoch + resume, torch.equal on the
parameters, the optimizer, the LR schedule, the scheduler and every rank's memory, compressor,
communicator and RNG state. And the refusals that come before any folder is written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TINY, compbench, train

STEPS_PER_EPOCH = 8  # TINY: 256 samples / (2 ranks x batch 16)
COMMON = [*TINY, "engine.np=2", "batch_size=16", "epochs=2", "eval=false", "optim.lr_schedule=cosine"]
SPARSE = ["compressor=topk", "ratio=0.05"]

CASES = {
    # the ps server's error-feedback memory, layer-wise order
    "layerwise-ps": [*SPARSE, "memory=residual", "comm=ps"],
    # fixed fused groups; DGC's momentum memory and DGC's SGD (the weight-decay momentum buffers)
    "mergecomp-allgather-dgc": ["compressor=dgc", "ratio=0.05", "memory=dgc", "comm=allgather",
                                "scheduler=mergecomp", "scheduler.groups=2"],
    # groups=auto: trials of 2 steps from step 1 to step 8, so the checkpoint after epoch 1 (8 steps)
    # falls inside the last trial. The choice depends on timings; fp16 is element-wise, so every
    # grouping gives the same arithmetic, while a repeated dense first step (fp32) would not.
    "mergecomp-auto": ["compressor=fp16", "memory=none", "comm=allgather", "scheduler=mergecomp",
                       "scheduler.groups=auto", "scheduler.trial_steps=2", "scheduler.search_steps=8"],
    # SeCoPa's plan over the ring (engine=torch): partitions, ring error feedback
    "secopa-ring": [*SPARSE, "memory=residual", "comm=ring", "engine=torch", "scheduler=secopa"],
}


def _ckpt(run: Path) -> dict[str, Any]:
    return torch.load(run / "checkpoint.pt", weights_only=True)


def _assert_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, set(a) ^ set(b))
        for k in a:
            _assert_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, type(a)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def _plan(tmp_path: Path) -> Path:
    """Every other tensor compressed, in up to 2 partitions (a plan file: planned at startup, SeCoPa
    would time the compressor and could plan differently in two runs)."""
    from compbench.compose.config import compose
    from compbench.seam.build import build_model

    model = build_model(compose(list(TINY)))
    plan = tmp_path / "plan.csv"
    plan.write_text("".join(f"{name},{p.numel()},{'y' if i % 2 == 0 else 'n'},{min(2, p.numel())}\n"
                            for i, (name, p) in enumerate(model.named_parameters())))
    return plan


# Suite time: the slow tier takes the cases that repeat the resume path secopa-ring covers in the
# default tier (~15-20 s each): MergeComp's groups, the ps server's memory (DGC's memory resumes in
# test_faults.py).
SLOW_CASES = ("mergecomp-allgather-dgc", "layerwise-ps", "mergecomp-auto")


@pytest.mark.dist
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in CASES])
def test_two_epochs_equal_one_epoch_and_resume(tmp_path, case):
    setup = [*COMMON, *CASES[case]]
    if case.startswith("secopa"):
        setup.append(f"scheduler.plan={_plan(tmp_path)}")
    full, _ = train(tmp_path, *setup, name="full")
    half, _ = train(tmp_path, *setup, f"max_steps={STEPS_PER_EPOCH}", name="half")
    resumed, proc = train(tmp_path, *setup, f"resume={half}", name="resumed")
    assert "resumed from" in proc.stdout
    a, b, h = _ckpt(full), _ckpt(resumed), _ckpt(half)
    assert h["position"] == {"epoch": 1, "batch": 0} and a["step"] == b["step"] == 2 * STEPS_PER_EPOCH
    for key in ("position", "model", "optimizer", "lr_schedule", "per_rank"):
        _assert_equal(a[key], b[key], key)
    for rank in range(2):  # every rank's RNG is in it, and the state is not trivially empty
        assert a["per_rank"][rank]["torch_rng"].numel() > 0
    if case == "mergecomp-auto":
        # the search's timings differ between runs; what it did must not: one dense step, one search
        # of 4 trials x 2 steps (steps 1-8, over the epoch boundary), ended once
        assert h["scheduler"]["search"] is not None and h["scheduler"]["trial"]  # saved mid-trial
        for s in (a["scheduler"], b["scheduler"]):
            assert s["search"] is None and s["search_used"] == 8 and s["search_end_step"] == 9
            assert s["dense_step"] is False and s["order_recorded"] is True and s["steps"] == 16
        _assert_equal(a["scheduler"]["order"], b["scheduler"]["order"], "scheduler.order")
        assert proc.stdout.count("groups=auto chose") == 1  # the search ended in the resumed run
    else:
        _assert_equal(a["scheduler"], b["scheduler"], "scheduler")
    if case == "layerwise-ps":
        assert any(r["comm"]["server_memory"] for r in b["per_rank"])
    if case == "mergecomp-allgather-dgc":
        assert any("decay_buffer" in s for s in b["optimizer"]["state"].values())
    if case == "secopa-ring":
        assert b["scheduler"]["lines"] and any(ln["k"] == 2 for ln in b["scheduler"]["lines"])

    if case != "layerwise-ps":
        return
    # the same checkpoint with other math is refused in the parent, before any folder is written (once
    # through the CLI here: tests/unit/test_checkpoint.py covers the list of settings)
    for change, setting in (("seed=1", "seed=0"), ("optim.weight_decay=1e-3", "optim.weight_decay=0.0005")):
        out = tmp_path / "refused"
        proc = compbench("train", *setup, change, f"resume={half}", f"output_dir={out}")
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0] == (f"error: resume={half} was written with {setting}; resume with {setting} "
                            f"(or start a new run)")
        assert not out.exists()


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("kind", ["code", "truncated"])
def test_unsafe_or_truncated_checkpoint_is_refused_before_anything_is_written(tmp_path, kind):
    marker, path, out = tmp_path / "pwned", tmp_path / "checkpoint.pt", tmp_path / "run"
    torch.save({"format": 2, "config": {}, "position": {"epoch": 1, "batch": 0}, "world_size": 2,
                "model": {"w": _RunsCode(marker) if kind == "code" else torch.zeros(1000)}}, path)
    if kind == "truncated":
        path.write_bytes(path.read_bytes()[:500])
    proc = compbench("train", *TINY, "engine.np=2", f"resume={path}", f"output_dir={out}")
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert ("holds objects other than tensors and plain data" if kind == "code"
            else "is truncated or corrupt") in lines[0]
    assert not marker.exists() and not out.exists()
