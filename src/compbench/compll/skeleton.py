"""The fixed code around the generated expressions: template files in `templates/`, filled here.

A template is the target's text with `${name}` placeholders (`string.Template`: C++, CUDA and
Python never write `$`). A value is a string, put in place, or a list of lines, which takes a line
of its own (`    ${name}`): each non-empty line is indented like the placeholder and an empty list
removes the line, so optional parts (a state, a header) need no conditionals in the template.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from string import Template

FOLDER = Path(__file__).resolve().parent / "templates"
_BLOCK = re.compile(r"(\s*)\$\{(\w+)\}")


@cache
def read(name: str) -> str:
    """The text of templates/NAME.tmpl."""
    return (FOLDER / f"{name}.tmpl").read_text()


def lines(name: str) -> list[str]:
    """templates/NAME as lines (a fragment put in place as a block)."""
    return read(name).splitlines()


def render(template: str, **values: str | int | list[str]) -> str:
    """templates/TEMPLATE.tmpl with its placeholders filled; a missing value is a KeyError."""
    scalars = {k: str(v) for k, v in values.items() if not isinstance(v, list)}
    out: list[str] = []
    for line in read(template).split("\n"):
        block = _BLOCK.fullmatch(line)
        value = values.get(block[2]) if block else None
        if block and isinstance(value, list):
            out += [block[1] + b if b else b for b in value]
        else:
            out.append(Template(line).substitute(scalars))
    return "\n".join(out)


def fill(template: str, **values: str | int | list[str]) -> list[str]:
    """`render` as lines (a filled fragment put in place as a block)."""
    return render(template, **values).splitlines()
