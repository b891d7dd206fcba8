"""The README and the manual's pages (docs/), for the tests that follow what they say."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_HEADING = re.compile(r"(#+) (.*)")


def section(heading: str) -> str:
    """The text under ``heading`` (at any level) in the README or a page of the manual, up to
    the next heading of its level or above (a ``#`` line inside a code block is none); the
    first page that holds it."""
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
        found: list[str] = []
        level = 0
        fenced = False
        for line in lines:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            match = None if fenced else _HEADING.fullmatch(line.rstrip("\n"))
            if level and match and len(match.group(1)) <= level:
                break
            if not level and match and match.group(2) == heading:
                level = len(match.group(1))
            if level:
                found.append(line)
        if found:
            return "".join(found)
    raise AssertionError(f"no heading {heading!r} in the README or docs/")
