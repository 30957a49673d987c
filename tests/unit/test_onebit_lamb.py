"""sync=onebit_lamb (1-bit LAMB's update rule through the pipeline: rms_sign, memory=residual, comm=ps,
the recipe's one flat buffer) against its oracle, DeepSpeed's OnebitLamb re-written in plain torch
with its own exchange (tests/oracles/onebit_lamb.py): bit for bit on fixed gradients of 2 thread
ranks across the warm-up and the freeze; an exact resume on both sides of the freeze; another
compressor in rms_sign's place; bad settings refused."""

from __future__ import annotations

import functools
import io

import pytest
import torch
from torch import nn

from compbench.catalog import registry
from compbench.compose import config
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from tests.helpers import TINY
from tests.oracles.onebit_lamb import OnebitLamb
from tests.oracles.runs import run_mode, run_oracle
from tests.threaded_engine import ThreadEngine, ThreadWorld
from tests.unit.test_onebit_adam_optim import grad, init_params

STEPS = 9  # step 0 creates the state, 1-3 dense LAMB, 4-8 compressed (freeze_step 4)
SHAPES = [(64, 48), (32,), (16, 3, 3, 3), (48,)]  # 3584 elements: a multiple of 2 * lcm(2, 8), no padding
HP = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, freeze_step=4)
MODE = ["sync=onebit_lamb", "optim=adamw", f"optim.lr={HP['lr']}", f"optim.weight_decay={HP['weight_decay']}",
        f"optim.betas=[{HP['betas'][0]},{HP['betas'][1]}]", "optim.lr_schedule=constant",
        f"sync.freeze_step={HP['freeze_step']}", f"sync.eps={HP['eps']}"]
KEYS = ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh", "lamb_coeff_freeze", "last_factor", "scaling_coeff")


def _states(engine, sync, optimizer):
    states = [optimizer.state[p] for p in optimizer.param_groups[0]["params"]]
    return states, optimizer.frozen, sync.exchange_plan()


@pytest.mark.parametrize("weight_decay", [0.01, 0.0])
def test_matches_deepspeeds_update_bit_for_bit(weight_decay):
    start = init_params(SHAPES)
    hp = {**HP, "weight_decay": weight_decay}
    ref = run_oracle(functools.partial(OnebitLamb, **hp, reverse=True), start, grad, STEPS)
    out = run_mode([*MODE, f"optim.weight_decay={weight_decay}"], start, grad, STEPS, inspect=_states)
    for r in range(2):
        params, _, (states, frozen, plan) = out[r]
        ref_params, _, ref_states = ref[r]
        assert frozen and plan.warmup_steps == HP["freeze_step"] and not plan.overlaps_backward
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True)), r
        for j, (mine, theirs) in enumerate(zip(states, ref_states, strict=True)):
            for key in KEYS:
                a, b = mine[key], theirs[key]
                same = torch.equal(a, b) if key.startswith("exp") else a == b
                assert same, (r, j, key)
        # the compressed stage's factor moved off 1 and the warm-up's trust ratio froze
        assert any(s["last_factor"] != 1.0 for s in states)
        assert all(s["lamb_coeff_freeze"] > 0 for s in states)
    assert not torch.equal(out[0][2][0][0]["exp_avg_sq_fresh"], out[0][2][0][0]["exp_avg_sq"])


def _run(overrides: list[str], start, steps: int, split: int | None = None) -> list[list[torch.Tensor]]:
    """Per rank, the parameters after `steps`; with `split`, the run stops after `split` steps, saves
    the optimizer's, the scheduler's and the synchronizer's state through torch.save (as the
    trainer's checkpoint), and a fresh one resumes."""
    cfg = config.check(config.compose([*TINY, *overrides]))

    def build(engine: ThreadEngine, model: nn.Module):
        sync = build_synchronizer(cfg, engine, StepStats())
        sync.setup(model)
        return sync, sync.make_optimizer(model, registry.plain(cfg.optim))

    def steps_of(engine, model, sync, optimizer, first: int, last: int) -> None:
        for step in range(first, last):
            sync.begin_step(step, 0.0)
            sync.before_backward()
            for j, p in enumerate(model):
                p.grad = grad(engine.rank, step, j, p.shape)
            sync.synchronize()
            optimizer.step()
            sync.after_step()

    def rank(engine: ThreadEngine) -> list[torch.Tensor]:
        model = nn.ParameterList([nn.Parameter(t.clone()) for t in start])
        sync, optimizer = build(engine, model)
        if split is None:
            steps_of(engine, model, sync, optimizer, 0, steps)
            return [p.detach().clone() for p in model]
        steps_of(engine, model, sync, optimizer, 0, split)
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "sync": sync.state_dict(), "scheduler": sync.scheduler.state_dict()}, buf)
        buf.seek(0)
        saved = torch.load(buf, weights_only=True)
        model = nn.ParameterList([nn.Parameter(torch.zeros_like(t)) for t in start])
        model.load_state_dict(saved["model"])
        sync, optimizer = build(engine, model)
        optimizer.load_state_dict(saved["optimizer"])
        sync.scheduler.load_state_dict(saved["scheduler"])
        sync.load_state_dict(saved["sync"])
        steps_of(engine, model, sync, optimizer, split, steps)
        return [p.detach().clone() for p in model]

    return ThreadWorld(2).run(rank)


@pytest.mark.parametrize("split", [1, 4, 5, 7],
                         ids=["after-step-0", "at-the-freeze", "first-compressed", "mid"])
def test_resume_is_exact_on_both_sides_of_the_freeze(split):
    start = init_params(SHAPES)
    full = _run(MODE, start, STEPS)
    resumed = _run(MODE, start, STEPS, split=split)
    for r in range(2):
        assert all(torch.equal(a, b) for a, b in zip(full[r], resumed[r], strict=True)), (r, split)


def test_another_compressor_takes_rms_signs_place():
    """compressor=onebit (two means instead of one scale) over the recipe's ps with its errors."""
    cfg = config.check(config.compose([*TINY, *MODE, "compressor=onebit"]))
    assert (cfg.choices.compressor, cfg.choices.comm, cfg.choices.memory) == ("onebit", "ps", "residual")
    start = init_params(SHAPES)
    out = run_mode([*MODE, "compressor=onebit"], start, grad, STEPS, inspect=_states)
    recipe = run_mode(MODE, start, grad, STEPS)
    for r in range(2):
        params, sent, (states, frozen, _) = out[r]
        assert frozen and all(torch.isfinite(p).all() for p in params)
        dense = 4 * sum(p.numel() for p in params)  # the warm-up's gradients, then about 2 bits an element
        assert sent[:HP["freeze_step"]] == [0] + [dense] * (HP["freeze_step"] - 1)
        assert all(0 < b < dense / 10 for b in sent[HP["freeze_step"]:])
        assert not torch.equal(params[0], recipe[r][0][0])
    assert all(torch.equal(a, b) for a, b in zip(out[0][0], out[1][0], strict=True))  # the ranks agree


def test_recipe_is_onebit_adams():
    cfg = config.compose(["sync=onebit_lamb", "optim=adamw"])
    assert dict(cfg.recipe) == {"compressor": "rms_sign", "memory": "residual", "comm": "ps",
                                "scheduler": "mergecomp", "scheduler.groups": 1, "optim.weight_decay": 0.0}


@pytest.mark.parametrize("setting, message", [
    ("sync.freeze_step=1", "sync.freeze_step=1 must be an integer >= 2 (step 0 creates the state; at least "
                           "one LAMB step sets the coefficient that freezes)"),
    ("sync.min_coeff=20", "sync.min_coeff=20 and sync.max_coeff=10.0 must be numbers with 0 < min_coeff <= "
                          "max_coeff (LAMB's trust-ratio bounds); e.g. 0.01 and 10"),
    ("sync.coeff_beta=1", "sync.coeff_beta=1 must be a number in [0, 1); e.g. sync.coeff_beta=0.9"),
    ("sync.factor_min=0", "sync.factor_min=0 and sync.factor_max=4.0 must be numbers with 0 < factor_min <= "
                          "factor_max; e.g. 0.5 and 4"),
    ("sync.factor_threshold=-0.1", "sync.factor_threshold=-0.1 must be a number >= 0; e.g. 0.1"),
])
def test_bad_settings_are_refused(setting, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, "sync=onebit_lamb", "optim=adamw", setting]))
    assert str(e.value) == message
