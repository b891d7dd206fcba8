"""The line formats tried on a human-written line before the generic ``keyvalue`` reader.

``Formats.parse`` tries, in order: the frameworks' own lines (``registry.FRAMEWORK_LINES``:
a ``ParseFn`` module each); then the formats whose step or names an earlier line gave
(``registry.LINE_FORMATS``: a ``LineFormat`` module each, one instance per ``Formats``, so
per parser). A line with terminal colours (torchtitan's ``step:  1  loss:  8.1940 ...``,
RSL-RL's bold ``Learning iteration 2/1500``) is read without its escape sequences, and
by the generic ``key: value`` reader when none of them takes it. It returns None for a
line in none.
"""

from __future__ import annotations

import re

from sentinel.model.records import Sample
from sentinel.parsing.keyvalue import parse_keyvalue
from sentinel.parsing.registry import FRAMEWORK_LINES, LINE_FORMATS

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FRAMEWORK_PARSERS = tuple(FRAMEWORK_LINES.values())


class Formats:
    """Reads the lines of the formats in this module's docstring, keeping what they need."""

    __slots__ = ("_parsers",)

    def __init__(self) -> None:
        stateful = tuple(new().parse for new in LINE_FORMATS.values())
        self._parsers = _FRAMEWORK_PARSERS + stateful

    def parse(self, text: str) -> list[Sample] | None:
        """Samples of one stripped line in one of these formats; None for another line."""
        plain = "\x1b" in text
        if plain:
            text = _ESCAPE.sub("", text).strip()
            if not text:
                return []
        for parse in self._parsers:
            found = parse(text)
            if found is not None:
                return found
        return parse_keyvalue(text) if plain else None
