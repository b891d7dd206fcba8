"""Lines a job wrote to a terminal, as text to parse: escape sequences out, redraws once.

A progress bar on a terminal (tqdm, rich, Lightning's) colours its text and redraws
itself in place: ``\\r`` (which the splitter already takes as a line's end), cursor
moves and erases (CSI sequences), titles and links (OSC). The parsers want the text a
person sees. A bar that redraws with nothing new (rich refreshes ten times a second
whether or not a step went by) would repeat the same line; a line equal to the one just
before it in the same stream says nothing new and is dropped, so a terminal's redraws
never make more lines than the job's progress does.
"""

from __future__ import annotations

import re

#: CSI (``ESC [`` ... final byte), OSC (``ESC ]`` ... BEL or ``ESC \\``), the 8-bit CSI,
#: charset selections (``ESC ( B``) and the other two-byte escapes (``ESC 7``, ``ESC M``).
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[()*+][0-~]"
    r"|\x1b[ -/]*[0-~]"
)


def strip_escapes(text: str) -> str:
    """``text`` without terminal escape sequences."""
    return _ESCAPES.sub("", text) if "\x1b" in text or "\x9b" in text else text


class TerminalLines:
    """Cleans the lines of one stream a job writes to a terminal."""

    def __init__(self) -> None:
        self._last = ""

    def clean(self, lines: list[str]) -> list[str]:
        """``lines`` without escapes, blank lines or repeats of the line just before."""
        joined = "\n".join(lines)
        if "\x1b" in joined or "\x9b" in joined:
            lines = _ESCAPES.sub("", joined).split("\n")
        kept = []
        last = self._last
        for line in lines:
            if line != last and line.strip():
                kept.append(line)
                last = line
        self._last = last
        return kept
