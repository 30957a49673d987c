"""Synchronization modes run as their references do by default (`SyncTraits.recipe`, announced at the
start, a user's setting wins): NoLoCo and SPARTA with AdamW inner steps and NoLoCo's H = 100; 1-bit
Adam and 1-bit LAMB without naming optim=adamw, 1-bit Adam with its 300-step warm-up; SPARTA's p
picking something every step."""

from __future__ import annotations

import math

import pytest
import torch

from compbench.compose import config
from compbench.optim.optimizers import AdamW
from compbench.train.loop import Trainer
from tests.helpers import TINY
from tests.threaded_engine import ThreadWorld

SMALL = [*TINY, "batch_size=32", "max_steps=4", "eval=false", "checkpoint=false"]


@pytest.mark.parametrize("sync, settings", [
    ("noloco", {"optim": "adamw", "optim.clip_grad_norm": 1.0}),
    ("sparta", {"optim": "adamw", "optim.clip_grad_norm": 1.0}),
    ("sparta_diloco", {"optim": "adamw", "optim.clip_grad_norm": 1.0}),
    ("onebit_adam", {"optim": "adamw", "optim.weight_decay": 0.0}),
    ("onebit_lamb", {"optim": "adamw", "optim.weight_decay": 0.0}),
])
def test_the_modes_recipe_picks_the_references_optimizer_and_a_users_choice_wins(sync, settings):
    cfg = config.check(config.compose([*TINY, f"sync={sync}", "sync.inner_steps=2"] if "loco" in sync
                                      else [*TINY, f"sync={sync}"]))
    assert cfg.choices.optim == "adamw"
    assert {k: cfg.recipe[k] for k in settings if k in cfg.recipe} == settings
    assert config.recipe_sources(cfg).startswith(f"sync={sync}")  # the start line names whose recipe
    if sync in ("noloco", "sparta", "sparta_diloco"):  # they take any optimizer: the user's wins
        mine = config.check(config.compose([*TINY, f"sync={sync}", "optim=sgd"]))
        assert mine.choices.optim == "sgd" and "optim" not in mine.recipe


@pytest.mark.parametrize("sync, mine, warmup_steps, warmup_epochs", [
    ("onebit_adam", [], 300, 1),
    ("onebit_adam", ["optim.warmup_steps=0"], 0, 1),  # the reference's schedule
    ("onebit_adam", ["optim.warmup_epochs=0.1"], 0, 0.1),  # the same setting in epochs replaces the recipe's
    ("onebit_lamb", [], 0, 1),  # LAMB's trust ratio bounds its steps
])
def test_onebit_adams_warmup_is_300_steps_unless_the_user_sets_one(sync, mine, warmup_steps, warmup_epochs):
    cfg = config.check(config.compose([*TINY, f"sync={sync}", *mine]))
    assert (cfg.optim.warmup_steps, cfg.optim.warmup_epochs) == (warmup_steps, warmup_epochs)


@pytest.mark.parametrize("sync, key, value", [("noloco", "clip_grad_norm", 1.0),
                                              ("onebit_adam", "weight_decay", 0.0)])
def test_naming_the_recipes_own_optimizer_keeps_the_recipes_settings_of_it(sync, key, value):
    cfg = config.check(config.compose([*TINY, f"sync={sync}", "optim=adamw"]))
    assert cfg.optim[key] == value and f"optim.{key}" in cfg.recipe


def test_nolocos_rounds_are_its_configs_100_steps():
    assert config.compose([*TINY, "sync=noloco"]).sync.inner_steps == 100


@pytest.mark.parametrize("sync, extra, optimizer", [
    ("noloco", ["sync.inner_steps=2"], AdamW),
    ("sparta", ["sync.p=0.05"], AdamW),
    ("onebit_lamb", ["sync.freeze_step=2", "optim.lr=2e-2"], None),
])
def test_the_defaults_train(sync, extra, optimizer, tmp_path):
    """A run of each with its defaults only (no optim= named): the reference's optimizer, a finite loss
    that falls."""
    cfg = config.check(config.compose([*SMALL, "max_steps=8", f"sync={sync}", *extra]))

    def rank(engine):
        trainer = Trainer(cfg, engine, tmp_path)
        trainer.fit()
        return type(trainer.optimizer), trainer.recorder.history["train/loss"] if trainer.recorder else None

    kind, losses = ThreadWorld(2).run(rank)[0]
    assert optimizer is None or kind is optimizer
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


@pytest.mark.parametrize("sync", ["sparta", "sparta_diloco"])
def test_a_p_that_picks_almost_nothing_is_refused(sync):
    with pytest.raises(ValueError) as e:
        config.check(config.compose([*TINY, f"sync={sync}", "sync.p=1e-12"]))
    entries = sum(p.numel() for p in torch.nn.Sequential(torch.nn.Linear(192, 32), torch.nn.Linear(32, 10))
                  .parameters())
    assert str(e.value) == (f"sync.p=1e-12 averages {1e-12 * entries:.2g} of the model's {entries} entries "
                            f"a step, so most steps exchange nothing; pass sync.p>={10 / entries:.2g} (10 "
                            "entries a step; ExoGym's p is 0.005)")
