"""Every setting of every component group is typed where the component declares it (its
constructor's annotations, its KEY_RANGES): a value of the wrong type is refused by the parent with
one line naming the key, for every option compbench ships, before any worker starts."""

from __future__ import annotations

import re
import warnings
from functools import cache

import pytest

from compbench.catalog import registry
from compbench.compose import config
from compbench.compose.checks import declared_keys

GROUPS = ("compressor", "memory", "comm", "scheduler", "sync", "model")
# What an option needs beside it to compose cleanly (the first that works is its base), the likeliest
# first for each group.
BASES = ([], ["comm=allgather"], ["comm=ps"], ["engine=torch"], ["compressor=topk", "comm=allgather"],
         ["model=gpt", "dataset=shakespeare"], ["model=gpt", "dataset=shakespeare", "optim=adamw"],
         ["model=gpt", "dataset=shakespeare", "optim=sgd"])
FIRST = {"compressor": ["comm=allgather"], "memory": ["compressor=topk", "comm=allgather"],
         "sync": ["model=gpt", "dataset=shakespeare", "optim=adamw"]}
# A value of the wrong kind for each declared type, and what the refusal says it must be.
WRONG = {bool: (1, "true or false"), int: (0.5, "an integer"), float: ("abc", "a number")}


def _checks(overrides: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # recipes and notes announce themselves
        config.check(config.compose(overrides))


@cache
def base_of(group: str, option: str) -> tuple[str, ...] | None:
    for extra in ([FIRST[group]] if group in FIRST else []) + list(BASES):
        try:
            _checks([f"{group}={option}", *extra])
        except ValueError:
            continue
        return (f"{group}={option}", *extra)
    return None


def _typed_keys() -> list[tuple[str, str, str, type]]:
    cases = []
    for group in GROUPS:
        for option in registry.options(group):
            node = registry.option_config(group, option)
            hints, ranges = declared_keys(node.get("_target_"))
            for key, default in node.items():
                if key in hints and key not in ranges and hints[key] in WRONG and "${" not in str(default):
                    cases.append((group, option, key, hints[key]))
    return cases


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_with_a_base(group):
    assert [o for o in registry.options(group) if base_of(group, o) is None] == []


def _name(value: object) -> str:
    return getattr(value, "__name__", str(value))


@pytest.mark.parametrize("group, option, key, kind", _typed_keys(), ids=_name)
def test_a_value_of_the_wrong_type_is_refused_by_the_parent(group, option, key, kind):
    base = base_of(group, option)
    assert base is not None
    value, need = WRONG[kind]
    with pytest.raises(ValueError, match="^" + re.escape(f"{group}.{key}={value} must be") + ".*" + need):
        _checks([*base, f"{group}.{key}={value}"])


@pytest.mark.parametrize("overrides, message", [
    (["compressor=randk", "compressor.dense_steps=-1"], "compressor.dense_steps=-1 must be an integer >= 0"),
    (["compressor=randk", "compressor.seed=-1"], "compressor.seed=-1 must be an integer >= 0"),
    (["model=cnn", "model.width=0"], "model.width=0 must be an integer >= 1"),
    (["compressor=topk", "comm=allgather", "memory=residual", "memory.beta=-1"],
     "memory.beta=-1 must be a number >= 0"),
    (["engine=torch", "sync=ddp", "sync.bucket_cap_mb=-1"], "sync.bucket_cap_mb=-1 must be a number >= 0"),
    (["scheduler=mergecomp", "scheduler.confirm=null"], "scheduler.confirm=null must be an integer"),
    (["optim.momentum=1"], "optim.momentum=1 must be below 1"),
])
def test_declared_ranges_are_refused_by_the_parent(overrides, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        _checks(overrides)
