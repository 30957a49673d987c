"""The cost in money of reaching the target: `compbench race --prices device_hour=USD,egress_gb=USD`.

Two prices (US dollars): `device_hour`, what one worker's device costs an hour (a cloud GPU's or
CPU instance's on-demand rate), and `egress_gb`, what a GB (1e9 bytes) sent out of a worker's node
costs (cloud egress between regions or to the internet). A price not given is 0 (not charged: the
report says which are). Then, for a run that reached the target,

    cost to target = W x T / 3600 x device_hour  +  W x B / 1e9 x egress_gb

with W the run's workers (results.json environment.world_size), T its time to target in seconds
(compbench.race.to_target: tokens to target x the step time, on the step clock) and B the bytes one
worker had sent when it crossed the target (its curve's `bytes_sent`, rank 0's count since the start,
interpolated between the evaluations around the crossing as the tokens are): every worker's bytes
that leave its node. On one machine's emulated links (the race's: each worker behind its own shaped
link) every byte a worker sends crosses its link, so every byte counts; a worker's bytes are taken
to be rank 0's (every race mode sends alike on every rank; a parameter server's would not). A
prediction's cost is the model's time at the same bytes (bytes to target do not depend on the link).
The what-if's cost, at N workers: N x its predicted time x device_hour + N x B x egress_gb, the
bytes per worker as the run's (the model's assumption: the payload per worker does not change with
N); with several workers to a machine (`--per-node`) it still counts every byte, an upper bound
(bytes between workers of one machine cost no egress).

Why the prices are the race's and not a run's settings: a price is not a property of the training
(it changes without the run changing, and a run trains the same at any price), and a finished race
is kept, so `compbench race --prices ...` writes its report again at other prices without training.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

from compbench.base.args import decimal

GB = 1e9  # bytes: a cloud provider's egress GB, as compose's memory refusal counts GB
MAX_PRICE_USD = 1e6
EXAMPLE = "--prices device_hour=2.5,egress_gb=0.09"


@dataclass(frozen=True)
class Prices:
    """USD per worker's device-hour and per GB a worker sends out of its node (0: not charged)."""

    device_hour: float = 0.0
    egress_gb: float = 0.0

    def __str__(self) -> str:
        """As --prices takes them: `device_hour=2.5,egress_gb=0.09`."""
        return ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self))

    def device_usd(self, workers: int, seconds: float) -> float:
        """W workers' devices for `seconds`: W x seconds / 3600 x device_hour."""
        return workers * seconds / 3600 * self.device_hour

    def egress_usd(self, workers: int, bytes_per_worker: float) -> float:
        """W workers' bytes out of their nodes: W x bytes / 1e9 x egress_gb."""
        return workers * bytes_per_worker / GB * self.egress_gb

    def split_usd(self, workers: int, seconds: float, bytes_per_worker: float | None
                  ) -> tuple[float, float] | None:
        """Cost to target in its two parts, (devices, egress); None where egress is charged and the
        run recorded no bytes (its cost is not known, not 0)."""
        if bytes_per_worker is None and self.egress_gb:
            return None
        return self.device_usd(workers, seconds), self.egress_usd(workers, bytes_per_worker or 0.0)

    def cost_usd(self, workers: int, seconds: float, bytes_per_worker: float | None) -> float | None:
        """Cost to target: the devices' time plus the egress (None: see split_usd)."""
        split = self.split_usd(workers, seconds, bytes_per_worker)
        return None if split is None else sum(split)

    def text(self) -> str:
        """The prices in words for the report, saying which are not charged."""
        parts = [f"{self.device_hour:g} USD per worker's device-hour" if self.device_hour
                 else "devices not charged (device_hour=0)",
                 f"{self.egress_gb:g} USD per GB a worker sends out of its node" if self.egress_gb
                 else "egress not charged (egress_gb=0)"]
        return "; ".join(parts)


NAMES = {"device_hour": "USD per worker's device-hour", "egress_gb": "USD per GB sent out of a node"}


def parse_prices(text: str) -> Prices:
    """--prices NAME=USD,...: each name once, each price a decimal number from 0 to MAX_PRICE_USD;
    otherwise a ValueError naming the item and the fix (the CLI's one `error:` line, exit 2)."""
    items = [x.strip() for x in text.split(",")]
    given: dict[str, float] = {}
    choose = ", ".join(f"{k} ({v})" for k, v in NAMES.items())
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"--prices {text}: {item or '(an empty item)'} is not NAME=USD; give "
                             f"comma-separated prices, e.g. {EXAMPLE}")
        if name not in NAMES:
            raise ValueError(f"--prices {text}: unknown price {name}; choose from {choose}, e.g. {EXAMPLE}")
        if name in given:
            raise ValueError(f"--prices {text} names {name} twice; give each once")
        try:
            usd = decimal(value.strip())
        except argparse.ArgumentTypeError:  # not a decimal number
            usd = math.nan
        if not 0 <= usd <= MAX_PRICE_USD:  # nan fails both
            raise ValueError(f"--prices {text}: {name}={value.strip()} must be a number of US dollars from 0 "
                             f"to {MAX_PRICE_USD:g} ({NAMES[name]}), e.g. {EXAMPLE}")
        given[name] = usd
    return Prices(**given)
