"""When output comes faster than the rules can read it: keep what matters, count the rest.

Two places shed. The loop reads a batch taken more than ``LAG_S`` after it was
read only in part: the lines a cheap search finds (a non-finite value, a
traceback, an error) and the newest ``KEEP_NEWEST``. And the inbox, when output
waiting in it passes ``HELD_LIMIT`` bytes (the loop is stalled), cuts its oldest
batches down to the lines that search finds. Everything else is counted as
skipped. So a NaN inside a flood still reaches the rules within about ``LAG_S``,
and memory does not grow with a backlog.

The search is the cost of a line that is skipped, so it must be far cheaper than
parsing it (about 2 µs a line): the batch is joined and lowered once, and each
needle is a pattern that starts with a literal, which ``re`` finds at the speed
of a byte search; only a hit costs Python work.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)

#: A batch older than this when its turn comes is read in part.
LAG_S = 0.3
#: The newest lines of such a batch are always read.
KEEP_NEWEST = 64
#: At most this many of a batch's suspect lines are read (the newest): a log where every
#: line says "error:" must not defeat the shedding.
MAX_SUSPECTS = 256
#: Output (bytes of text, plus ``LINE_OVERHEAD`` a line) the inbox holds before it sheds.
HELD_LIMIT = 32 << 20
#: What a line costs in memory besides its text (a ``str`` header and the list's pointer).
LINE_OVERHEAD = 64
#: What a skipped line may say that must still be read, searched in lowered text: a
#: non-finite number (not "info", "inference", "financial"), a traceback, an error.
NEEDLES = (
    re.compile(r"nan(?<![a-z]nan)(?![a-z])"),
    re.compile(r"inf(?<![a-z]inf)(?:inity)?(?![a-z])"),
    re.compile(r"traceback"),
    re.compile(r"error"),
    re.compile(r"exception"),
    re.compile(r"killed"),
)


def suspects(lines: list[str], limit: int = MAX_SUSPECTS) -> list[str]:
    """The lines (in order, the newest ``limit``) that may hold a non-finite value or an error."""
    text = "\n".join(lines).lower()  # lower() never adds or removes a '\n'
    hits: set[int] = set()
    for needle in NEEDLES:
        line, at = 0, 0
        for match in needle.finditer(text):
            start = match.start()
            line += text.count("\n", at, start)
            at = start
            hits.add(line)
    return [lines[index] for index in sorted(hits)[-limit:]]


class Shedder:
    """Decides which lines a loop that is behind still reads; counts those it skips.

    ``keep`` runs on the loop's thread; ``weight`` and ``shrink`` are the inbox's bound
    (``sentinel.sources.inbox.Bound``) and run on the sources' threads, under its lock.
    """

    limit = HELD_LIMIT

    def __init__(self) -> None:
        self._skipped_late = 0
        self._skipped_held = 0  # changed under the inbox's lock only
        self._behind = False

    @property
    def skipped(self) -> int:
        """Lines skipped so far (for status and metrics)."""
        return self._skipped_late + self._skipped_held

    def keep(self, lines: list[str], lag_s: float) -> list[str]:
        """The lines to read of a batch read ``lag_s`` seconds ago (all of them when on time)."""
        if lag_s <= LAG_S or len(lines) <= KEEP_NEWEST:
            if self._behind and lag_s <= LAG_S:
                self._behind = False
                log.info("caught up with the output (%d line(s) skipped so far)", self.skipped)
            return lines
        older, newest = lines[:-KEEP_NEWEST], lines[-KEEP_NEWEST:]
        kept = suspects(older)
        self._skipped_late += len(older) - len(kept)
        if not self._behind:
            self._behind = True
            log.warning(
                "output comes faster than it can be read (%.1f s behind): reading only lines"
                " that may hold a non-finite value or an error, and the newest",
                lag_s,
            )
        return kept + newest

    # -- the inbox's bound: events are ("lines", (source, lines, read_at)) ----------

    @staticmethod
    def weight(event: tuple[str, Any]) -> int:
        """What an output event holds in memory, about (0: any other event, never shed)."""
        kind, payload = event
        if kind != "lines":
            return 0
        lines: list[str] = payload[1]
        return sum(map(len, lines)) + LINE_OVERHEAD * len(lines)

    def shrink(self, event: tuple[str, Any]) -> tuple[str, Any]:
        """An output event cut down to its suspect lines, the rest counted as skipped."""
        source, lines, read_at = event[1]
        kept = suspects(lines)
        self._skipped_held += len(lines) - len(kept)
        return ("lines", (source, kept, read_at))
