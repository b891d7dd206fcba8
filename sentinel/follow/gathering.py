"""When a reader of a line stream hands on what it read: at once if it may matter, else per window.

A hand-on wakes the engine's thread, and on a VM that turn costs far more than the
lines in it (about 500 µs fixed, 13 µs a line: bench/RESULTS.md), so the readers of
the job's pipes and of tailed logs hand lines on at most once per ``batch_s`` window.
Holding every line for a window made a NaN wait for it too (p50 120-160 ms at 50
lines/s). So each read gets a cheap look first (:func:`may_be_urgent`): a read that
may hold a non-finite value or a traceback ends the window at once.

The look only helps if the reader reads soon after the write. A reader that slept
a slice of the window between looks saw a NaN up to a slice late; one that woke on
every write would cost a wake-up a line (45-140 µs each on a shared VM: more than
sentinel's whole budget at 100 lines/s). So after each read a reader waits
``LOOK_S`` before it looks again: a write after a quiet spell wakes it at once, and
while output flows it wakes at most 1/``LOOK_S`` times a second, which bounds what a
NaN waits to ``LOOK_S``.

Urgent hand-ons draw on a small budget (``URGENT_BURST``, refilled at
``URGENT_PER_S``): a job that logs some metric as NaN on every line must not turn
every read into a turn of the engine. With the budget spent, such a read waits for
its window like any other.

``run``'s relay (``sentinel.process.relay``) gathers with this module too, loading it
by its path: it must import nothing but the standard library.
"""

from __future__ import annotations

import math
import os
import re
import select
import time
from collections.abc import Callable

#: After a read, how long a reader waits before it reads again while output flows: the
#: most a NaN inside a busy stream waits to be read, and at most 1/LOOK_S wake-ups a second.
LOOK_S = 0.02
#: Urgent hand-ons allowed in a row, and how many a second refill them.
URGENT_BURST = 8.0
URGENT_PER_S = 2.0
#: A read larger than this is not looked at (a flood, handed on at once by the readers, or a
#: backlog); the look costs about 4 ms a mebibyte.
LOOK_BYTES = 32768

#: Non-finite tokens in lowercased text, where a candidate was found: ``nan``, ``inf`` and
#: ``infinity``, signed or not, not followed by a word character (``info``, ``nano``).
_NON_FINITE = re.compile(rb"(?:nan|inf(?:inity)?)(?![a-z0-9_])")
#: Errors in the original case: ``Traceback``, ``SomethingError``, ``error:``.
_ERROR = re.compile(rb"Traceback|[A-Za-z]Error\b|\b[Ee]rror:")
_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_")
#: A non-finite float as a binary file holds it (a TensorBoard event's scalar), little-endian:
#: the float32 quiet NaN ``00 00 c0 7f`` and infinity ``00 00 80 7f``, the float64 ones'
#: last four bytes (``00 00 f8 7f``, ``00 00 f0 7f``), each signed or not (x86 makes the
#: NaN of 0/0 with its sign set). No UTF-8 text holds these bytes.
_BINARY_NON_FINITE = re.compile(rb"\x00\x00[\x80\xc0\xf0\xf8][\x7f\xff]")


def may_be_urgent(data: bytes) -> bool:
    """Whether ``data`` may hold a non-finite value or an error (a false positive costs one
    early hand-on; tokens inside words are not hits), as text or as a binary float."""
    if b"\x00\x00" in data and _BINARY_NON_FINITE.search(data):
        return True
    low = data.lower()
    if b"nan" in low or b"inf" in low:
        for word in (b"nan", b"inf"):
            start = low.find(word)
            while start >= 0:
                if (start == 0 or low[start - 1] not in _WORD) and _NON_FINITE.match(low, start):
                    return True
                start = low.find(word, start + 1)
    return (b"error" in low or b"traceback" in low) and _ERROR.search(data) is not None


def ends_a_line(data: bytes) -> bool:
    """Whether ``data`` holds a line's end (``\\n``, or tqdm's ``\\r``)."""
    return b"\n" in data or b"\r" in data


class Gathering:
    """When what a reader holds is handed on; times are ``time.monotonic()`` seconds.

    What a reader reads is handed on at once when the last hand-on was at least
    ``batch_s`` ago (so the first read after a quiet spell goes at once) or when it may be
    urgent and the budget allows; otherwise it is held until ``due()``.
    """

    def __init__(self, batch_s: float, look_s: float = LOOK_S) -> None:
        self.batch_s = batch_s
        #: How long to wait after a read before reading again (none when not gathering).
        self.look_s = look_s if batch_s > 0 else 0.0
        self._handed_on_at = float("-inf")
        self._tokens = URGENT_BURST
        self._tokens_at = 0.0

    def due(self) -> float:
        """When what is held must be handed on at the latest."""
        return self._handed_on_at + self.batch_s

    def hand_on_now(self, urgent: bool, now: float) -> bool:
        """Whether to hand on now what is held, after a read that ``urgent`` says may matter."""
        if now >= self.due():
            return True
        return urgent and self._take_token(now)

    def handed_on(self, now: float) -> None:
        """The reader handed on what it held."""
        self._handed_on_at = now

    def _take_token(self, now: float) -> bool:
        refill = (now - self._tokens_at) * URGENT_PER_S
        self._tokens = min(URGENT_BURST, self._tokens + refill)
        self._tokens_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def pump(
    fd: int,
    batch_s: float,
    hand_on: Callable[[list[tuple[bytes, float]]], None],
    read_bytes: int,
    *,
    look_s: float = LOOK_S,
    on_read: Callable[[bytes], None] | None = None,
) -> None:
    """Read the pipe ``fd`` to its end, handing on what was read as ``Gathering`` says.

    ``hand_on`` gets the reads held, each with a time its bytes were not written before
    (``time.time()`` at the read before it, less a look: what that read left was written
    after it);
    ``on_read`` each read as it comes (a passthrough that must not wait a window). A read
    takes up to ``LOOK_BYTES`` (a small read costs no fresh mapping of memory, a mebibyte
    one does, on every read); one that fills it is a flood: what else the pipe holds (up
    to ``read_bytes``) is read at once and handed on with it, without a wait.
    """
    gathering = Gathering(batch_s, look_s)
    ready = select.poll()
    ready.register(fd, select.POLLIN)
    held: list[tuple[bytes, float]] = []
    # What went on at a read ended inside a line (an unbuffered print writes the text and
    # its newline apart): the end of that line goes at once too, or it would wait a window.
    partial = False
    since = 0.0  # the first read's bytes: of any age
    while True:
        if held:
            wait_s = gathering.due() - time.monotonic()
            if wait_s <= 0 or not ready.poll(math.ceil(wait_s * 1000)):
                hand_on(held)
                held = []
                gathering.handed_on(time.monotonic())
                partial = False
                continue
        read_at = time.time()
        chunk = os.read(fd, LOOK_BYTES)
        if not chunk:
            break
        flood = len(chunk) == LOOK_BYTES
        if flood and ready.poll(0):
            chunk += os.read(fd, read_bytes)
        if on_read is not None:
            on_read(chunk)
        held.append((chunk, since))
        if not flood:
            # This read left nothing: what comes next was written after it, less a look for
            # what a writer between the job and this pipe (``run``'s relay) read before it
            # sent this and sends next.
            since = read_at - LOOK_S
        now = time.monotonic()
        ends_line = partial and ends_a_line(chunk)
        if flood or ends_line or gathering.hand_on_now(may_be_urgent(chunk), now):
            hand_on(held)
            held = []
            gathering.handed_on(now)
            partial = not chunk.endswith((b"\n", b"\r"))
        if not flood and gathering.look_s:
            time.sleep(gathering.look_s)
    if held:
        hand_on(held)
