"""optim.clip_grad_norm: torch's clip_grad_norm_ on what the optimizer's step reads (the averaged
gradient per step, each inner step's own in diloco), checked in the parent, a recipe of sync=diloco."""

from __future__ import annotations

import pytest
import torch

from compbench.compose import config
from compbench.optim.clip import clip_grad_norm
from tests.helpers import TINY, params, train


def _grads(seed: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    ps = [torch.nn.Parameter(torch.zeros(shape)) for shape in [(5, 3), (7,), (2, 2, 2)]]
    for p in ps:
        p.grad = torch.randn(p.shape) * 3
    return ps


@pytest.mark.parametrize("max_norm", [0.5, 1.0, 1e6])
def test_clipping_is_torchs_clip_grad_norm(max_norm):
    ours, theirs = _grads(0), _grads(0)
    norm = float(clip_grad_norm(ours, max_norm))
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm == float(expected)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.grad, b.grad)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in ours]))
    assert clipped <= max_norm * (1 + 1e-6) or max_norm > norm


def test_a_sparse_gradient_is_clipped_as_the_dense_one_it_stands_for():
    dense, sparse = _grads(1), _grads(1)
    sparse[0].grad = sparse[0].grad.to_sparse().coalesce()
    assert float(clip_grad_norm(sparse, 1.0)) == pytest.approx(float(clip_grad_norm(dense, 1.0)), rel=1e-6)
    for a, b in zip(sparse, dense, strict=True):
        torch.testing.assert_close(a.grad.to_dense(), b.grad, rtol=1e-6, atol=0)


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_a_bad_clip_value_is_refused_naming_the_key(value):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, f"optim.clip_grad_norm={value}"]))
    assert str(e.value) == (f"optim.clip_grad_norm={value} must be a finite number > 0; the largest gradient "
                            "norm, e.g. optim.clip_grad_norm=1.0 (null: no clipping)")


def test_modes_that_exchange_the_momentum_refuse_clipping():
    refused = "so optim.clip_grad_norm=1 would not be used; drop optim.clip_grad_norm"
    with pytest.raises(ValueError, match=refused):
        config.check(config.compose([*TINY, "sync=demo", "optim.clip_grad_norm=1"]))


def test_diloco_clips_its_inner_steps_by_recipe_unless_the_user_sets_it():
    cfg = config.compose([*TINY, "sync=diloco"])
    assert cfg.optim.clip_grad_norm == 1.0 and cfg.recipe == {"optim.clip_grad_norm": 1.0}
    assert config.recipe_sources(cfg) == "sync=diloco"
    for setting, value in (("null", None), ("2.5", 2.5)):
        cfg = config.compose([*TINY, "sync=diloco", f"optim.clip_grad_norm={setting}"])
        assert cfg.optim.clip_grad_norm == value and "optim.clip_grad_norm" not in cfg.recipe
    assert config.compose([*TINY]).optim.clip_grad_norm is None  # off by default elsewhere


@pytest.mark.slow  # a real 2-rank job (~12 s); the fast tier checks the clipping on fixed gradients
@pytest.mark.dist
def test_two_workers_clip_the_averaged_gradient(tmp_path):
    """2 ranks x batch 8 with clipping == 1 rank x batch 16 with clipping (the average is clipped,
    not each rank's own), and clipping changes the run."""
    common = [*TINY, "compressor=none", "eval=false", "max_steps=4", "epochs=1"]
    clip = "optim.clip_grad_norm=0.05"
    two, _ = train(tmp_path, *common, clip, "engine.np=2", "batch_size=8", name="two")
    one, _ = train(tmp_path, *common, clip, "engine.np=1", "batch_size=16", name="one")
    free, _ = train(tmp_path, *common, "engine.np=2", "batch_size=8", name="free")
    p2, p1, pf = params(two), params(one), params(free)
    for k in p1:
        torch.testing.assert_close(p2[k], p1[k], atol=1e-5, rtol=0)
    assert max((p2[k] - pf[k]).abs().max().item() for k in p2) > 1e-3
