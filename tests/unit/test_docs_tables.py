"""The docs' Markdown tables render: no blank line between a table's separator row and its rows
(Markdown then ends the table at its header and prints the rows as a paragraph of pipes, which the
strict docs build does not catch)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"])


def _is_separator(line: str) -> bool:
    cells = line.strip()
    return cells.startswith("|") and set(cells) <= set("|-: ") and "-" in cells


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_table_is_cut_after_its_header(page):
    lines = page.read_text().splitlines()
    cut = [i + 1 for i in range(1, len(lines) - 1)
           if lines[i] == "" and _is_separator(lines[i - 1]) and lines[i + 1].startswith("|")]
    assert not cut, f"{page.relative_to(ROOT)}: blank line after a table's separator row at line(s) {cut}"
