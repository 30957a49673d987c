"""Checks of single values, shared by compbench.compose.checks and compbench.base.settings: a ValueError
of one line that names the key, the value as the user wrote it, and the fix."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from omegaconf import OmegaConf


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # `epochs=true` is not 1 epoch


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def require_int(key: str, v: Any, low: int, fix: str = "") -> None:
    if not is_int(v) or v < low:
        raise ValueError(f"{key}={show(v)} must be an integer >= {low}{'; ' + fix if fix else ''}")


def require_number(key: str, v: Any, low: float, strict: bool = False, fix: str = "") -> None:
    ok = is_number(v) and math.isfinite(v) and (v > low if strict else v >= low)
    if not ok:
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise ValueError(f"{key}={show(v)} must be a finite number {bound}{'; ' + fix if fix else ''}")


def show(v: Any) -> str:
    """A value as it is written on the command line (true, null, [1,2])."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if OmegaConf.is_config(v):
        v = OmegaConf.to_container(v)
    if isinstance(v, list | tuple):
        return "[" + ",".join(show(x) for x in v) + "]"
    if v == "":
        return "''"
    return str(v)


@dataclass(frozen=True)
class KeyRange:
    """The values one setting of a config group may take. A component declares `KEY_RANGES: dict[str,
    KeyRange]` beside its constructor (a class attribute, or a module attribute next to a factory:
    the datasets); the parent (compbench.compose.checks) refuses a value outside it before any worker
    starts, with one line built from these fields."""

    low: float | None = None  # inclusive
    high: float | None = None  # inclusive
    choices: tuple = ()  # when given, the only values
    integer: bool = True  # else any finite number
    null: str = ""  # when given, null is allowed and means this
    what: str = ""  # why the range is what it is, appended to the message

    def problem(self, value: object) -> str | None:
        """None when `value` is allowed, else what it must be ("must be 1 or 3 (...)")."""
        if value is None and self.null:
            return None
        num = None  # `value` where it is a finite number
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            num = value
        if self.choices:
            ok = num is not None and num in self.choices
            need = f"must be {' or '.join(map(str, self.choices))}"
        else:
            ok = (num is not None and (isinstance(num, int) or not self.integer)
                  and (self.low is None or num >= self.low) and (self.high is None or num <= self.high))
            need = "must be " + ("an integer" if self.integer else "a number")
            if self.low is not None and self.high is not None:
                need += f" from {self.low:g} to {self.high:g}"
            elif self.low is not None:
                need += f" >= {self.low:g}"
            elif self.high is not None:
                need += f" <= {self.high:g}"
        if ok:
            return None
        need += f" or null ({self.null})" if self.null else ""
        return need + (f" ({self.what})" if self.what else "")


def type_problem(hint: Any, value: Any) -> str | None:
    """None when `value` has the type `hint` (a constructor's annotation: bool, int, float, str, a
    Literal, a list or tuple, unions of them, `| None`), else what it must be. An annotation this
    does not know (a class, Any) accepts anything: the component's own checks decide."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    needs = []
    for option in options:
        need = _one_type_problem(option, value)
        if need is None:
            return None
        needs.append(need)
    return "must be " + " or ".join(needs)


def _one_type_problem(hint: Any, value: Any) -> str | None:
    if hint is type(None):
        return None if value is None else "null"
    if hint is bool:
        return None if isinstance(value, bool) else "true or false"
    if hint is int:
        return None if is_int(value) else "an integer"
    if hint is float:
        return None if is_number(value) and math.isfinite(value) else "a number"
    if hint is str:
        return None if isinstance(value, str) else "text"
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        return None if value in choices and type(value) in {type(c) for c in choices} else \
            "one of " + ", ".join(map(str, choices))
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Sequence) and origin is not str:
        return None if OmegaConf.is_list(value) or isinstance(value, list | tuple) else "a list"
    return None
