"""optim=muon: which parameters Muon steps, its update against the recipe done by hand (torch's Muon
on the matrices, torch's AdamW on the rest), the schedule reaching both halves, an exact state round
trip, the synchronization modes it works in (step, diloco: MuLoCo with a compressor) and the ones
that refuse it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from compbench.catalog import registry
from compbench.compose import config
from compbench.models.gpt import GPT
from compbench.optim.muon import Muon, matrices
from compbench.optim.optimizers import build_optimizer, model_groups, plain_optimizer
from compbench.optim.schedule import build_schedule
from compbench.records.stats import StepStats
from compbench.sync.build import build_synchronizer
from tests.helpers import TINY
from tests.threaded_engine import ThreadWorld
from tests.unit.test_diloco import _batch, _model

MUON = {k: v for k, v in registry.option_config("optim", "muon").items()}


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=11, block_size=8, n_layer=1, n_embd=8, n_head=2, dropout=0.0)


def _loss(model: GPT, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    x = torch.randint(11, (3, 8), generator=g)
    return F.cross_entropy(model(x).flatten(0, 1), torch.roll(x, 1, 1).flatten())


def test_muon_steps_the_hidden_matrices_only():
    model = _gpt()
    names = {n for n, p in model.named_parameters() if p in matrices(model)}
    # Every hidden nn.Linear weight; not the embeddings (the tied head is tok.weight), biases or gains.
    assert names == {"blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.0.mlp.0.weight",
                     "blocks.0.mlp.2.weight"}
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    assert matrices(mlp) == {mlp[0].weight}  # the output layer stays on AdamW


def _settings(**over: object) -> dict:
    keys = ("lr", "momentum", "nesterov", "ns_steps", "weight_decay", "adjust_lr_fn", "adamw_lr",
            "adamw_betas", "adamw_eps", "adamw_weight_decay")
    return {k: MUON[k] for k in keys} | {"fused": False} | over


def test_the_update_is_torchs_muon_on_matrices_and_adamw_on_the_rest():
    ours, ref = _gpt(), _gpt()
    opt = build_optimizer(model_groups(ours, [{"params": list(ours.parameters())}], {"name": "muon"}),
                          "muon", **_settings())
    assert isinstance(opt, Muon)
    picked = matrices(ref)
    s = _settings()
    muon = torch.optim.Muon([p for p in ref.parameters() if p in picked], lr=s["lr"], momentum=s["momentum"],
                            nesterov=s["nesterov"], ns_steps=s["ns_steps"], weight_decay=s["weight_decay"],
                            adjust_lr_fn=s["adjust_lr_fn"])
    adamw = torch.optim.AdamW([p for p in ref.parameters() if p not in picked], lr=s["adamw_lr"],
                              betas=tuple(s["adamw_betas"]), eps=s["adamw_eps"],
                              weight_decay=s["adamw_weight_decay"])
    for step in range(3):
        for model, step_fns in ((ours, [opt]), (ref, [muon, adamw])):
            for o in step_fns:
                o.zero_grad()
            _loss(model, step).backward()
            for o in step_fns:
                o.step()
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(p.grad is not None for p in ours.parameters())


def test_the_schedule_scales_both_learning_rates_and_the_state_round_trips():
    model = _gpt()
    opt = plain_optimizer(model, {"name": "muon", **_settings()})  # the baselines' path (sync=ddp)
    assert {g["lr"] for g in opt.param_groups} == {MUON["lr"], MUON["adamw_lr"]}
    schedule = build_schedule(opt, steps_per_epoch=4, epochs=1, lr_schedule="constant", warmup_epochs=1)
    assert sorted(g["lr"] for g in opt.param_groups) == [MUON["adamw_lr"] / 4, MUON["lr"] / 4]
    for step in range(2):
        opt.zero_grad()
        _loss(model, step).backward()
        opt.step()
        schedule.step()
    saved = copy.deepcopy(opt.state_dict())
    twin = copy.deepcopy(model)
    other = plain_optimizer(twin, {"name": "muon", **_settings()})
    other.load_state_dict(saved)
    assert other.muon is not None and other.muon.state is other.state  # both halves read the loaded state
    for o, m in ((opt, model), (other, twin)):
        o.zero_grad()
        _loss(m, 5).backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)
    assert str(opt.state_dict()) == str(other.state_dict())


def test_bare_groups_send_every_matrix_to_muon():
    model = _gpt()
    opt = Muon(model.parameters(), **_settings())
    assert opt.muon is not None
    assert {id(p) for g in opt.muon.param_groups for p in g["params"]} == \
        {id(p) for p in model.parameters() if p.ndim == 2}


def test_muloco_is_diloco_with_muon_inner_steps_and_a_compressed_outer_gradient():
    """experiment=muloco composes and checks; its synchronizer steps Muon inside the rounds and sends
    1-bit outer gradients through error feedback (fewer bytes than fp32)."""
    cfg = config.check(config.compose([*TINY, "experiment=muloco", "sync.inner_steps=2"]))
    assert (cfg.choices["optim"], cfg.choices["sync"], cfg.choices["compressor"], cfg.choices["memory"]) == \
        ("muon", "diloco", "efsignsgd", "residual")
    nodes = {g: registry.plain(cfg[g]) for g in ("compressor", "memory", "comm", "scheduler", "sync")}
    optim = {k: v for k, v in registry.plain(cfg.optim).items()}

    def body(engine):
        stats = StepStats()
        sync = build_synchronizer(nodes, engine, stats)
        model = sync.setup(_model())
        opt = sync.make_optimizer(model, dict(optim))
        sent = 0
        for step in range(4):
            sync.begin_step(step, 0.0)
            x, y = _batch(engine.rank, step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sync.after_step()
            sent += stats.bytes_sent
        return opt, sent, sync.state_dict(), sum(p.numel() for p in model.parameters())

    for opt, sent, state, numel in ThreadWorld(2).run(body):
        assert isinstance(opt, Muon) and opt.muon is not None
        assert 0 < sent < 2 * 4 * numel / 2  # two rounds, each < half of fp32 (a scale per tiny tensor)
        assert state["memory"]["residuals"]  # the error-feedback accumulator


@pytest.mark.parametrize("overrides, message", [
    (["sync=demo"], "sync=demo builds its own optimizer from optim=sgd's settings, not optim=muon's; add "
                    "optim=sgd"),
    (["compressor=dgc", "memory=dgc", "comm=allgather"],
     "memory=dgc applies SGD momentum itself, which optim=muon would not leave to it; use optim=sgd (or "
     "memory=residual)"),
    (["optim.ns_steps=0"], "optim.ns_steps=0 must be an integer >= 1 (Newton-Schulz iterations); e.g. "
                           "optim.ns_steps=5"),
    (["optim.adjust_lr_fn=keller"], "optim.adjust_lr_fn=keller is unknown; use null, original or "
                                    "match_rms_adamw"),
    (["optim.adamw_lr=0"], "optim.adamw_lr=0 must be a number > 0 (AdamW's, for the parameters Muon does "
                           "not step); e.g. optim.adamw_lr=1e-3"),
])
def test_settings_that_do_not_fit_are_refused(overrides, message):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, "optim=muon", *overrides]))
    assert str(e.value) == message


def _compose_muon(sync: str):
    """config.check of optim=muon under `sync=` on an engine the mode runs on: the checked config, or
    None where the mode refuses optim=muon (its `sync_traits.optimizers` leave it out)."""
    traits = registry.locate(registry.option_config("sync", sync)["_target_"]).sync_traits
    try:
        return config.check(config.compose([*TINY, "optim=muon", f"sync={sync}",
                                            f"engine={traits.engines[0]}"]))
    except ValueError:
        assert traits.optimizers is not None and "muon" not in traits.optimizers, sync
        return None


@pytest.mark.parametrize("sync", registry.options("sync"))
def test_every_mode_that_takes_muon_keeps_the_embeddings_and_the_head_on_adamw(sync):
    """Whichever mode builds the optimizer (its own `make_optimizer`), Muon steps the hidden matrices
    only: the GPT's tied embedding and its position table stay on AdamW."""
    cfg = _compose_muon(sync)
    if cfg is None:
        return
    nodes = {g: registry.plain(cfg[g]) for g in ("compressor", "memory", "comm", "scheduler", "sync")}
    optim = registry.plain(cfg.optim)

    def body(engine):
        sync_mode = build_synchronizer(nodes, engine, StepStats())
        model = _gpt()
        # a baseline's setup wraps the model in the engine's own (sync=quorum_diloco's needs torch's world)
        if sync_mode.sync_traits.elastic or sync_mode.sync_traits.pipeline:
            model = sync_mode.setup(model)
        opt = sync_mode.make_optimizer(model, dict(optim))
        assert isinstance(opt, Muon) and opt.muon is not None
        return model, {id(p) for g in opt.muon.param_groups for p in g["params"]}

    for model, on_muon in ThreadWorld(2).run(body):
        assert on_muon == {id(p) for p in matrices(model)}, sync
        assert id(model.tok.weight) not in on_muon and id(model.pos.weight) not in on_muon
