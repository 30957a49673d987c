"""Datasets (offline only: shipped with a package, synthetic, or from a local root) and sharding.

A dataset module (the one `conf/dataset/NAME.yaml`'s `_target_` lives in) provides, besides its
factory, the two checks the parent runs before anything is written:
- `check_root(root, ...)`: ValueError (one line) when its files are missing or damaged; it may ask
  for more of the dataset's settings by name (num_classes, name);
- `train_size_of(**settings) -> int | None`: the number of training samples, or None where counting
  is not cheap (ImageNet: the worker checks after loading);
and `KEY_RANGES: dict[str, KeyRange]`, the values each numeric setting may take (checked by the parent
before the two hooks above run).
- `TASK`: what its samples are, "classification" (x, label) or "language_model" (token windows x, y
  shifted by one): it picks the loss, evaluation and throughput unit (compbench.train.task).
"""

import math
from dataclasses import dataclass

import compbench._torchvision_compat  # noqa: F401  (before torchvision is imported)


@dataclass(frozen=True)
class KeyRange:
    """The values one dataset setting may take. Each dataset module declares `KEY_RANGES: dict[str,
    KeyRange]` next to its factory; the parent (compbench.checks) refuses a value outside it before
    any worker starts, with one line built from these fields."""

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
        number = num is not None
        if self.choices:
            ok, need = number and value in self.choices, f"must be {' or '.join(map(str, self.choices))}"
        else:
            ok = (isinstance(value, int) if self.integer else True) and number
            ok = (ok and num is not None and (self.low is None or num >= self.low)
                  and (self.high is None or num <= self.high))
            need = "must be " + ("an integer" if self.integer else "a number")
            if self.high is not None:
                need += f" from {self.low:g} to {self.high:g}"
            elif self.low is not None:
                need += f" >= {self.low:g}"
        if ok:
            return None
        need += f" or null ({self.null})" if self.null else ""
        return need + (f" ({self.what})" if self.what else "")


# Shared bounds: above 1024 pixels a side a CPU worker's batch would not fit in memory.
IMAGE_SIZE = KeyRange(1, 1024, what="pixels per side")
SEED = KeyRange(0)
