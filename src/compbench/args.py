"""argparse for every compbench subcommand, with compbench's error convention: bad arguments are a
ValueError (the CLI prints one `error:` line and exits 2), not argparse's usage + error two-liner."""

from __future__ import annotations

import argparse
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise ValueError naming the fix (`PROG --help`); subparsers made
    with add_subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(f"{message} (see `{self.prog} --help`)")
