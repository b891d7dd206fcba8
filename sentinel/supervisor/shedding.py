"""When output comes faster than the rules can read it: keep what matters, count the rest.

Two places shed. The loop reads of each batch what it can parse before the
batch is ``LAG_S`` old, judged by what parsing cost lately (a batch of mixed,
long or invalid lines parses ten times slower than one of uniform JSON): the
newest of its lines, at least ``KEEP_NEWEST``, and of the older ones those a
cheap search finds (a non-finite value, a traceback, an error). And the inbox, when output
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
import time

from sentinel.supervisor.events import Event, OutputLines

log = logging.getLogger(__name__)

#: A batch older than this when its turn comes is read in part.
LAG_S = 0.3
#: The newest lines of such a batch are always read.
KEEP_NEWEST = 64
#: At most this many of a batch's suspect lines are read (the newest): a log where every
#: line says "error:" must not defeat the shedding.
MAX_SUSPECTS = 256
#: Output (bytes of text, plus ``LINE_OVERHEAD`` a line) the inbox holds before it sheds:
#: at 200k lines a second, most of a second of it.
HELD_LIMIT = 16 << 20
#: Batches shorter than this say little about what a line costs to parse.
COST_MIN_LINES = 256
#: What a line costs in memory besides its text (a ``str`` header and the list's pointer).
LINE_OVERHEAD = 64
#: Falling behind and catching up are logged at most once in this long: a flood at the edge
#: of what the loop keeps up with flips between the two many times a second.
SAY_EVERY_S = 60.0
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


#: The needles of a non-finite value: output that holds one is read before other output
#: that came with it (``suspects_first``).
NON_FINITE = NEEDLES[:2]


def suspects_first(events: list[Event]) -> list[Event]:
    """``events`` with, in each run of output from different sources (one event a file,
    64 rank files read in one look), the output that may hold a non-finite value first:
    a NaN in the last file of 64 is read before the 63 others, not after them, so many
    files stop the job as soon as one. A source's events keep their order (a run that
    holds one source twice is left as it is), and so does every other event."""
    out: list[Event] = []
    run: list[OutputLines] = []
    for event in [*events, None]:
        if type(event) is OutputLines:
            run.append(event)
            continue
        if len(run) > 1 and len({output.source for output in run}) == len(run):
            run.sort(key=_clean)  # stable: the suspects, then the rest, each in order
        out += run
        run = []
        if event is not None:
            out.append(event)
    return out


def _clean(output: OutputLines) -> bool:
    """Whether nothing in ``output`` looks like a non-finite value (sorts last)."""
    text = "\n".join(output.lines).lower()
    return not any(needle.search(text) for needle in NON_FINITE)


class Shedder:
    """Decides which lines a loop that is behind still reads; counts those it skips.

    ``keep`` runs on the loop's thread; ``weight`` and ``shrink`` are the inbox's bound
    (``sentinel.supervisor.inbox.Bound``) and run on the sources' threads, under its lock.
    """

    limit = HELD_LIMIT

    def __init__(self, *, through_pty: bool = False) -> None:
        """``through_pty``: the job writes to terminals sentinel made (``run``'s default);
        the first time it falls behind, it says once that ``--no-pty`` is faster."""
        self._pty_hint = through_pty
        self._skipped_late = 0
        self._skipped_held = 0  # changed under the inbox's lock only
        self._behind = False
        self._said_at: float | None = None  # time.monotonic() of the last word on it
        #: Seconds a line lately took to parse (0: not known yet).
        self._cost_s = 0.0

    @property
    def skipped(self) -> int:
        """Lines skipped so far (for status and metrics)."""
        return self._skipped_late + self._skipped_held

    def keep(self, lines: list[str], lag_s: float) -> list[str]:
        """The lines to read of a batch read ``lag_s`` seconds ago (all of them when on time)."""
        room_s = LAG_S - lag_s
        if len(lines) <= KEEP_NEWEST or (room_s >= 0 and len(lines) * self._cost_s <= room_s):
            if self._behind and lag_s <= LAG_S:
                self._behind = False
                if self._may_say():
                    log.info("caught up with the output (%d line(s) skipped)", self.skipped)
            return lines
        fits = int(room_s / self._cost_s) if room_s > 0 and self._cost_s > 0 else 0
        newest_count = max(KEEP_NEWEST, fits)
        older, newest = lines[:-newest_count], lines[-newest_count:]
        kept = suspects(older)
        self._skipped_late += len(older) - len(kept)
        if not self._behind:
            self._behind = True
            if self._may_say():
                log.warning(
                    "output comes faster than it can be read (%.1f s behind): reading only"
                    " lines that may hold a non-finite value or an error, and the newest"
                    " (%d line(s) skipped so far)",
                    lag_s,
                    self.skipped,
                )
            if self._pty_hint:
                self._pty_hint = False
                log.warning(
                    "the job's output comes through a terminal (run's default, for its progress"
                    " bars): a job that floods its output runs slower through one; --no-pty"
                    " ([job] pty = false) gives it pipes"
                )
        return kept + newest

    def skim(self, lines: list[str]) -> list[str]:
        """What a loop reads of a job it is stopping: the suspect lines and the newest (its
        CPU goes to the stop, which the parsing would slow down by holding the GIL)."""
        if len(lines) <= KEEP_NEWEST:
            return lines
        older, newest = lines[:-KEEP_NEWEST], lines[-KEEP_NEWEST:]
        kept = suspects(older)
        self._skipped_late += len(older) - len(kept)
        return kept + newest

    def parsed(self, count: int, elapsed_s: float) -> None:
        """``count`` lines took ``elapsed_s`` to parse: what the next batch's share is
        judged by."""
        if count >= COST_MIN_LINES:
            cost_s = elapsed_s / count
            self._cost_s = cost_s if not self._cost_s else 0.7 * self._cost_s + 0.3 * cost_s

    def _may_say(self) -> bool:
        now = time.monotonic()
        if self._said_at is not None and now - self._said_at < SAY_EVERY_S:
            return False
        self._said_at = now
        return True

    # -- the inbox's bound: output events (``OutputLines``) are weighed and shrunk ------

    @staticmethod
    def weight(event: Event) -> int:
        """What an output event holds in memory, about (0: any other event, never shed)."""
        if type(event) is not OutputLines:
            return 0
        lines = event.lines
        return sum(map(len, lines)) + LINE_OVERHEAD * len(lines)

    def shrink(self, event: Event) -> Event:
        """An output event cut down to its suspect lines, the rest counted as skipped."""
        if type(event) is not OutputLines:
            return event
        kept = suspects(event.lines)
        self._skipped_held += len(event.lines) - len(kept)
        return OutputLines(event.source, kept, event.read_at, event.marks)
