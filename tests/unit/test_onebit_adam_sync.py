"""sync=onebit_adam through compbench's pipeline (rms_sign, memory=residual: the worker error,
comm=ps: the server error) against its oracle, the former 1-bit Adam optimizer that exchanged inside
its own step (tests/oracles/onebit_adam.py): parameters, Adam's moments and both errors bit for bit
on fixed gradients of 2 thread ranks, across the warm-up and the freeze, with the recipe's bucket
(one all-to-all and one all-gather a step) and per tensor. On tensors whose size is not a multiple of
N * lcm(N, 8) the oracle pads (its padding enters the scale) and compbench does not: close, not equal."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from compbench.compose import config
from compbench.sync.onebit_adam import OnebitAdamStep
from tests.oracles.onebit_adam import OnebitAdam
from tests.oracles.runs import run_mode, run_oracle
from tests.unit.test_onebit_adam_optim import HP, grad, init_params

STEPS = 7  # step 0 creates the state, 1-2 dense Adam, 3-6 compressed (freeze_step 3)
SHAPES = [(64, 48), (32,), (16, 3, 3, 3), (48,)]  # every size a multiple of 2 * lcm(2, 8) = 16
MODE = ["sync=onebit_adam", "optim=adamw", f"optim.lr={HP['lr']}",
        f"optim.weight_decay={HP['weight_decay']}", f"optim.betas=[{HP['betas'][0]},{HP['betas'][1]}]",
        "optim.lr_schedule=constant", f"sync.freeze_step={HP['freeze_step']}", f"sync.eps={HP['eps']}"]


def _state(engine, sync, optimizer):
    params = list(optimizer.param_groups[0]["params"])
    server = sync.pipeline.comm.server_memory.residuals
    return ([optimizer.state[p] for p in params], dict(sync.pipeline.memory.residuals),
            {name.split("#")[0]: t for name, t in server.items()}, optimizer.frozen)


@pytest.mark.parametrize("scheduler", [["scheduler=bucket"], ["scheduler=layerwise"]],
                         ids=["bucket", "layerwise"])
def test_matches_the_oracle_bit_for_bit(scheduler):
    start = init_params(SHAPES)
    ref = run_oracle(functools.partial(OnebitAdam, **HP), start, grad, STEPS)
    out = run_mode([*MODE, *scheduler], start, grad, STEPS, inspect=_state)
    for r in range(2):
        params, sent, (states, worker, server, frozen) = out[r]
        ref_params, ref_sent, ref_states = ref[r]
        assert frozen
        assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True)), r
        for j, (mine, theirs) in enumerate(zip(states, ref_states, strict=True)):
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(mine[key], theirs[key]), (r, j, key)
            assert torch.equal(worker[str(j)].reshape(-1), theirs["worker_error"]), (r, j)
            assert torch.equal(server[str(j)], theirs["server_error"]), (r, j)
        # the same exchange; the worker's scale travels with each server's part (4 bytes per peer more)
        assert sent[:3] == ref_sent[:3]
        assert sent[3:] == [b + 4 * len(SHAPES) for b in ref_sent[3:]]


def test_the_recipes_flat_buffer_is_the_oracle_on_one_flat_parameter():
    """DeepSpeed's layout: the whole model's momentum as one flat tensor, in the order the scheduler
    fuses it (reverse registration order), compressed with one scale."""
    start = init_params(SHAPES)

    def flat(tensors):
        return torch.cat([t.reshape(-1) for t in reversed(tensors)])

    def flat_grad(r, step, j, shape):
        return flat([grad(r, step, i, s) for i, s in enumerate(SHAPES)])

    ref = run_oracle(functools.partial(OnebitAdam, **HP), [flat(start)], flat_grad, STEPS)
    out = run_mode(MODE, start, grad, STEPS, inspect=_state)
    for r in range(2):
        assert torch.equal(flat(out[r][0]), ref[r][0][0]), r
        (ref_state,) = ref[r][2]
        assert torch.equal(flat([s["exp_avg"] for s in out[r][2][0]]), ref_state["exp_avg"])
        assert torch.equal(next(iter(out[r][2][1].values())), ref_state["worker_error"])


def test_only_the_padded_tensors_depart_from_the_oracle():
    shapes = [(10,), (33, 7), (64,)]  # 10 and 231 elements: the oracle pads them to 16 and 240
    start = init_params(shapes)
    ref = run_oracle(functools.partial(OnebitAdam, **HP), start, grad, STEPS)
    out = run_mode([*MODE, "scheduler=bucket"], start, grad, STEPS)
    same = [torch.equal(a, b) for a, b in zip(out[0][0], ref[0][0], strict=True)]
    assert same == [False, False, True]


def test_recipe_composes_onebit_adam_from_the_pipeline():
    cfg = config.compose(["sync=onebit_adam", "optim=adamw"])
    assert dict(cfg.recipe) == {"compressor": "rms_sign", "memory": "residual", "comm": "ps",
                                "scheduler": "mergecomp", "scheduler.groups": 1, "optim.weight_decay": 0.0,
                                "optim.warmup_steps": 300}
    assert cfg.optim.weight_decay == 0.0  # DeepSpeed's default, not optim=adamw's 0.05
    mine = config.compose(["sync=onebit_adam", "optim=adamw", "optim.weight_decay=0.01"])  # the user's wins
    assert mine.optim.weight_decay == 0.01 and "optim.weight_decay" not in mine.recipe
    swapped = config.check(config.compose(["sync=onebit_adam", "optim=adamw", "compressor=qsgd",
                                           "memory=none"]))
    assert swapped.choices.compressor == "qsgd" and swapped.choices.comm == "ps"


def _half_silent(rank: int, step: int, j: int, shape) -> torch.Tensor:
    """The oracle tests' gradients, but tensor 0's first half never gets any (an unseen token's rows)."""
    g = grad(rank, step, j, shape)
    if j == 0:
        g[: shape[0] // 2] = 0.0
    return g


def test_the_freeze_reports_and_guards_a_variance_with_zeros(capsys):
    start = init_params(SHAPES)
    out = run_mode([*MODE, "scheduler=bucket"], start, _half_silent, STEPS,
                   inspect=lambda engine, sync, optimizer: _state(engine, sync, optimizer)[0])
    silent = SHAPES[0][0] // 2 * SHAPES[0][1]
    total = sum(math.prod(s) for s in SHAPES)
    line = (f"1-bit Adam froze its variance at step {HP['freeze_step'] - 1}: {silent} of {total} entries are "
            f"zero or below 1e-16; raised to their tensor's mean variance so that their updates stay finite")
    assert capsys.readouterr().out.count(line) == 1  # rank 0 only, once
    for params, _, states in out:
        assert all(torch.isfinite(p).all() for p in params)
        v = states[0]["exp_avg_sq"]
        assert torch.equal(v[: SHAPES[0][0] // 2], torch.full_like(v[: SHAPES[0][0] // 2],
                                                                    v[SHAPES[0][0] // 2:].mean().item()))
        # each compressed step moves a guarded entry by about lr, not lr * m / eps
        moved = (params[0] - start[0])[: SHAPES[0][0] // 2].abs().max().item()
        assert moved < 10 * HP["lr"] * STEPS


def test_a_variance_without_zeros_is_left_as_it_is(capsys):
    run_mode([*MODE, "scheduler=bucket"], init_params(SHAPES), grad, STEPS)
    total = sum(math.prod(s) for s in SHAPES)
    assert f"1-bit Adam froze its variance at step 2: 0 of {total} entries are zero or below 1e-16\n" \
        in capsys.readouterr().out


def test_a_variance_tiny_everywhere_is_refused():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.zeros(4)
    opt = OnebitAdamStep([p], lr=0.1, freeze_step=1)
    opt.step()  # the state
    with pytest.raises(ValueError, match=r"all 4 entries zero or below 1e-16 .*raise sync.freeze_step"):
        opt.step()
