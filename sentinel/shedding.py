"""When output comes faster than the rules can read it: keep what matters, count the rest.

A batch read longer ago than ``LAG_S`` means the loop is behind. Such a batch is
not parsed whole: a cheap search over its text keeps every line that may hold a
non-finite value or an error, and the newest lines (progress, the freshest
values) are kept too; the others are counted as skipped. So a NaN inside a flood
still reaches the rules within the lag, and memory does not grow with a backlog.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: A batch older than this when its turn comes is read in part.
LAG_S = 0.5
#: The newest lines of such a batch are always read.
KEEP_NEWEST = 64
#: What a line that must be read may say: a non-finite number, an exception, an error.
SUSPECT = re.compile(r"(?i)\b(?:nan|[+-]?inf(?:inity)?)\b|traceback|error|exception|killed")


@dataclass
class Shedder:
    """Decides, batch by batch, which lines a loop that is behind still reads."""

    #: Lines skipped so far (for status and metrics).
    skipped: int = 0
    _behind: bool = False

    def keep(self, lines: list[str], lag_s: float) -> list[str]:
        """The lines to read of a batch read ``lag_s`` seconds ago (all of them when on time)."""
        if lag_s <= LAG_S or len(lines) <= KEEP_NEWEST:
            if self._behind and lag_s <= LAG_S:
                self._behind = False
                log.info("caught up with the output (%d line(s) skipped so far)", self.skipped)
            return lines
        older, newest = lines[:-KEEP_NEWEST], lines[-KEEP_NEWEST:]
        # One search over the whole text first: most batches of a flood hold nothing.
        suspect = SUSPECT.search("\n".join(older)) is not None
        kept = [line for line in older if SUSPECT.search(line)] if suspect else []
        self.skipped += len(older) - len(kept)
        if not self._behind:
            self._behind = True
            log.warning(
                "output comes faster than it can be read (%.1f s behind): reading only lines"
                " that may hold a non-finite value or an error, and the newest",
                lag_s,
            )
        return kept + newest
