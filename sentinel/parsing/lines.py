"""Split a byte stream (a tailed file, a job's stdout pipe) into text lines.

A line ends at ``\\n``, ``\\r\\n`` or a bare ``\\r`` (tqdm redraws its bar with
``\\r``). Bytes are decoded as UTF-8 with replacement, so a torn or binary write
never raises. Work is done on whole chunks with ``bytes.find``/``split``: the
splitter sits on the job's output path and must not cost a Python loop per byte.
"""

from __future__ import annotations

from typing import Protocol

_NUL = b"\x00"

#: How long a reader of a line stream (the job's pipes, a tailed log) gathers lines before
#: it hands them on to the rules (``[tail] batch_s``). A turn of the rules costs far more
#: on the cold caches of a VM than a line's own work: at a hundred lines a second the
#: main thread spent 0.45% of a core with 250 ms, 0.22% with 1 s (bench/RESULTS.md). A
#: NaN or a traceback never waits for it (a look at the new bytes goes at once), nor does
#: the first line after a quiet spell, and each line keeps when it was written, to a look
#: (``sentinel.model.records.Marks``).
BATCH_S = 1.0
#: How often at most ``run``'s relay sends the job's output on (to sentinel's terminal and
#: its rules' reader), while it flows: the job's output shows as it goes, not a second late.
RELAY_BATCH_S = 0.25
#: A gathering reader looks at its stream this many times a window and stops gathering at
#: the first look that finds nothing new: a line after a quiet spell of a window (not two)
#: then goes at once, for one more wake-up of the reader a window while output flows.
GATHER_SLICES = 2


def relay_window(batch_s: float) -> float:
    """The relay's window for a reader that gathers ``batch_s``: ``RELAY_BATCH_S`` at most."""
    return min(batch_s, RELAY_BATCH_S)


#: The longest window the config accepts: a line inside a busy stream waits up to a window
#: before the rules see it (a stall, a loss spike, a rule's alert with it; a NaN does not).
MAX_BATCH_S = 1.0


class Splitter(Protocol):
    """Turns a file's bytes into text lines (``LineSplitter`` is one; a structured format
    has its own, ``sentinel.parsing.files.MetricsFile.new_splitter``)."""

    @property
    def pending_bytes(self) -> int:
        """Bytes taken but not yet ended as a line: a reader must not count them as done."""
        ...

    def feed(self, data: bytes) -> list[str]: ...

    def flush(self) -> list[str]: ...


class LineSplitter:
    """Turns a byte stream into text lines.

    Memory is bounded: at most ``max_line_bytes`` of an unfinished line are
    kept; the rest of an overlong line is counted and dropped.
    """

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        if max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
        self._max_line_bytes = max_line_bytes
        self._partial = bytearray()
        # Every byte of the unfinished line taken from the stream, including
        # stripped NULs and dropped overflow: what a reader must not count as done.
        self._partial_consumed = 0
        self._overflow_bytes = 0
        self._cr_pending = False

    @property
    def pending_bytes(self) -> int:
        """Bytes held back: the unfinished line, or a ``\\r`` that may start ``\\r\\n``."""
        return self._partial_consumed + (1 if self._cr_pending else 0)

    def feed(self, data: bytes) -> list[str]:
        """Complete lines in ``data`` (with what was held before), terminators removed."""
        lines: list[str] = []
        if self._cr_pending:
            self._cr_pending = False
            if data[:1] == b"\n":
                data = data[1:]
        if not data:
            return lines
        # A chunk ending in '\r' ends a line now (low latency for tqdm); the '\r'
        # itself stays pending so a '\n' opening the next chunk is not a new line.
        ends_with_cr = data[-1:] == b"\r"
        if ends_with_cr:
            data = data[:-1]
        if b"\r" in data:
            # Terminators only; the unfinished tail after the last one keeps its length.
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        first_nl = data.find(b"\n")
        if first_nl < 0:
            self._hold(data)
            if ends_with_cr:
                self._emit(lines)
                self._cr_pending = True
            return lines
        self._hold(data[:first_nl])
        self._emit(lines)
        if ends_with_cr:
            block_end, tail = len(data), b""
        else:
            block_end = data.rfind(b"\n")
            tail = data[block_end + 1 :]
        if block_end > first_nl + 1:
            self._split_block(data[first_nl + 1 : block_end], lines)
        if ends_with_cr:
            self._cr_pending = True
        else:
            self._hold(tail)
        return lines

    def flush(self) -> list[str]:
        """Emit the held unfinished line (the stream ended without a terminator)."""
        lines: list[str] = []
        self._emit(lines)
        self._cr_pending = False
        return lines

    def _hold(self, part: bytes) -> None:
        """Add ``part`` to the unfinished line, keeping at most ``max_line_bytes``."""
        if not part:
            return
        self._partial_consumed += len(part)
        if not self._partial:
            # NULs a '>' writer leaves before its first byte are not text; strip
            # them before they count against the line limit.
            part = part.lstrip(_NUL)
        room = self._max_line_bytes - len(self._partial)
        if len(part) > room:
            self._partial += part[:room]
            self._overflow_bytes += len(part) - room
        else:
            self._partial += part

    def _emit(self, lines: list[str]) -> None:
        """End the unfinished line and append it to ``lines`` unless it is empty."""
        if self._partial:
            text = self._partial.decode("utf-8", errors="replace")
            if self._overflow_bytes:
                text += f" …[truncated {self._overflow_bytes} bytes]"
            lines.append(text)
        self._partial = bytearray()
        self._partial_consumed = 0
        self._overflow_bytes = 0

    def _split_block(self, block: bytes, lines: list[str]) -> None:
        """Append the lines of ``block``: complete lines joined by ``\\n``."""
        if len(block) <= self._max_line_bytes:
            # No line in it can be too long: decode once and split the text.
            # '\n' is never part of a UTF-8 sequence, so decoding the whole block
            # gives the same text as decoding line by line.
            texts = block.decode("utf-8", errors="replace").split("\n")
            if _NUL in block:
                texts = [text.lstrip("\x00") for text in texts]
            lines.extend(filter(None, texts))  # without the empty lines
            return
        for part in block.split(b"\n"):
            self._hold(part)
            self._emit(lines)


#: The bound of bytes of unknown age (what a file held when first opened): none.
UNKNOWN = 0.0
#: Lines whose bounds (``Marks``) are closer than this share the earlier one: the readers
#: note a mark only this far from the one before, and the engine feeds each part of a batch
#: with its own bound. Each part costs the rules a block (150-250 us warm): a part a look
#: (ten a second at 100 lines/s) cost more than the second's gathering saved. A quarter
#: second, the bound of a line handed on in a window of that: a save made within it after
#: the last healthy value is set aside (a save lost, never a poisoned one resumed).
PART_S = 0.25


class Bounds:
    """When the lines split from a stream were written at the earliest (``Marks``).

    The stream comes in parts, each with a bound (``part``: its bytes were not written
    before it, as the look or read before the one that found them says). A line gets the
    bound of the part it ended in; the first line a part ends, that of the part the line
    before it ended in, unless the part began with a new line: where it began, or a part
    before it, never a later bound than its own. Each line a splitter emits ends in the
    part that made it emit: true of every splitter (``LineSplitter``'s lines, a CSV's
    rows, TensorBoard's length-prefixed records).
    """

    __slots__ = ("_bytes", "_line")

    def __init__(self) -> None:
        self._bytes = self._line = UNKNOWN

    def part(self, since: float, splitter: Splitter) -> None:
        """The bytes fed to ``splitter`` from now on were written after ``since``."""
        self._bytes = since
        if splitter.pending_bytes == 0:
            self._line = since  # a line begins here

    def feed(
        self, splitter: Splitter, data: bytes, lines: list[str], marks: list[tuple[int, float]]
    ) -> int:
        """``splitter``'s lines of ``data``, appended to ``lines`` with their ``marks``;
        their text's length."""
        new_lines = splitter.feed(data)
        if not new_lines:
            return 0
        note(marks, len(lines), self._line)
        if len(new_lines) > 1:
            note(marks, len(lines) + 1, self._bytes)
        lines.extend(new_lines)
        self._line = self._bytes
        return sum(map(len, new_lines))

    def flush(self, splitter: Splitter, lines: list[str], marks: list[tuple[int, float]]) -> None:
        """``splitter``'s unfinished last line, with its bound."""
        rest = splitter.flush()
        if rest:
            note(marks, len(lines), self._line)
            lines.extend(rest)


def note(marks: list[tuple[int, float]], index: int, since: float) -> None:
    """Lines from ``index`` on were written after ``since``: a mark, unless the one before
    already says so (one at the same index is replaced)."""
    if marks and marks[-1][1] == since:
        return
    if marks and marks[-1][0] == index:
        marks[-1] = (index, since)
    else:
        marks.append((index, since))
