"""argparse for every compbench subcommand, with compbench's error convention: bad arguments are a
ValueError (the CLI prints one `error:` line and exits 2), not argparse's usage + error two-liner."""

from __future__ import annotations

import argparse
import re
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ValueError naming the fix (`PROG --help`); subparsers made
    with add_subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{message} (see `{self.prog} --help`)")


# A number as written in decimal: Python's float() and int() also take "1_0" (read as 10), "nan",
# "inf" and surrounding spaces, none of which a user means on a command line.
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_WHOLE = re.compile(r"[+-]?\d+")


def decimal(text: str) -> float:
    """argparse `type=` (and list items): a decimal number, else ArgumentTypeError naming it."""
    if not _DECIMAL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    return float(text)


def whole(text: str) -> int:
    """argparse `type=`: a whole number written in digits, else ArgumentTypeError naming it."""
    if not _WHOLE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(text)


def override_key(override: str) -> str:
    """The key a Hydra override sets, without its prefix (`+nice=1`, `~nice`, `nice=10`: nice)."""
    return override.partition("=")[0].lstrip("+~")
