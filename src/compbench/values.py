"""Checks of single values, shared by compbench.checks and compbench.settings: a ValueError of one
line that names the key, the value as the user wrote it, and the fix."""

from __future__ import annotations

import math
from typing import Any

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
    if isinstance(v, bool):
        return str(v).lower()
    if OmegaConf.is_config(v):
        return str(OmegaConf.to_container(v))
    return str(v)
