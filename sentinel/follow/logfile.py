"""Follow one log file the way ``tail -F`` does, with offsets that survive a restart.

A :class:`FileFollower` follows one path, not one inode: it finishes a file
that was renamed away, reads its replacement from the start, and notices
truncation (copytruncate, ``>``) and symlink retargeting. Running followers for
paths and globs on a thread is :class:`sentinel.follow.tailer.LogTailer`'s job.

A follower knows nothing of formats: it splits a plain log into text lines, and a
structured metrics file with the splitter it is given (``new_splitter``), chosen once
for its path by whoever builds it (``sentinel.supervisor.metric_files.splitting``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sentinel.follow.buffering import BlockWrites
from sentinel.parsing.lines import PART_S, UNKNOWN, Bounds, LineSplitter, Splitter
from sentinel.store.state import FileOffset

logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
#: How many bytes fingerprint a file's head and the bytes before an offset.
FINGERPRINT_BYTES = 4096
#: A read stops after about this much text, so a huge backlog is handed on in batches.
BATCH_TEXT_BYTES = 4 * 1024 * 1024

#: Makes a new splitter for a file's bytes from its start, given the longest line kept:
#: ``LineSplitter`` for a plain log, a structured format's own for a metrics file.
NewSplitter = Callable[[int], Splitter]


def plain_lines(path: Path) -> NewSplitter:
    """How a plain log at ``path`` is split: into text lines (``LineSplitter``)."""
    return LineSplitter


class OffsetStore(Protocol):
    """Where followers keep how far they read (``StateStore`` is one)."""

    def load_offset(self, dev: int, inode: int) -> FileOffset | None: ...

    def save_offset(self, record: FileOffset) -> None: ...


def _fingerprint(data: bytes) -> str:
    """``"<len>:<hex>"``: the length makes a short head comparable with a longer file."""
    return f"{len(data)}:{hashlib.blake2b(data, digest_size=16).hexdigest()}"


def _matches(fd: int, fingerprint: str, end: int | None) -> bool:
    """Whether the bytes before ``end`` (the head when None) have this fingerprint."""
    length_text, _, _ = fingerprint.partition(":")
    try:
        length = int(length_text)
    except ValueError:
        return False
    start = 0 if end is None else end - length
    if start < 0:
        return False
    return _fingerprint(os.pread(fd, length, start)) == fingerprint


def _kind(mode: int) -> str:
    """What a path that is not a regular file is, in a word or two."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "something else"


def _bytes_before(fd: int, offset: int) -> bytes:
    """The last ``FINGERPRINT_BYTES`` (or fewer) bytes before ``offset``: never past it. Read
    from 0 for a shorter offset, the tail ran past it, and the next look for a truncation
    read at a negative offset: EINVAL on every read, a restarted sentinel blind to a log
    of under 4 KiB."""
    length = min(FINGERPRINT_BYTES, offset)
    return os.pread(fd, length, offset - length)


class FileFollower:
    """Follows one path (not one inode) through rotation, truncation and retargeting.

    ``read`` returns new complete lines; ``commit`` then persists how far they
    went, so a caller commits only once the lines are really handed on.
    """

    def __init__(
        self,
        path: Path,
        *,
        offsets: OffsetStore | None = None,
        max_line_bytes: int = 1 << 20,
        skip: tuple[int, int, int] | None = None,
        new_splitter: NewSplitter = LineSplitter,
    ) -> None:
        """``skip``: ``(device, inode, offset)``: that file's bytes before ``offset`` were
        written before the run began; unless a saved offset says more, reading starts there
        (at a line's start), and any other file at ``path`` is read from 0.
        ``new_splitter``: what splits each file at ``path`` from its start (a plain log's
        ``LineSplitter`` unless the path's format has its own)."""
        self.path = path
        self._offsets = offsets
        self._skip = skip
        self._max_line_bytes = max_line_bytes
        self._new_splitter = new_splitter
        self._splitter: Splitter = new_splitter(max_line_bytes)
        self._fd: int | None = None
        self._dev = 0
        self._inode = 0
        self._position = 0
        #: How far ``peek`` has looked (the bytes after ``_position`` are not read yet).
        self._peeked = 0
        # The bytes just before _position: a file whose bytes there changed was
        # truncated and regrew before we looked.
        self._tail = b""
        self._head_hash = ""
        self._resume_checked = False
        self._backlog = False
        self._unsaved: list[FileOffset] = []
        # The open file's offset moved since its record was made: made at commit, not at
        # every read (a record hashes the bytes before the offset).
        self._offset_moved = False
        self._last_error = ""
        #: Whether the writer's output comes in whole blocks (block-buffered: said once).
        self._blocks = BlockWrites()
        #: When the open file's end was last seen (epoch seconds): by the latest ``read``
        #: or ``peek`` that reached it. Bytes after it were written later. ``UNKNOWN``
        #: until one has: what a file holds when first opened may be of any age.
        self._seen_at = UNKNOWN
        #: ``(offset, since)``: the bytes from ``offset`` on were written after ``since``
        #: (noted by a look or a read that found them; split into lines by ``read``).
        self._byte_marks: list[tuple[int, float]] = []
        self._marked_at = UNKNOWN
        self._bounds = Bounds()
        #: When the lines the last ``read`` (or ``finish``) returned were written at the
        #: earliest (``sentinel.model.records.Marks``, as a list).
        self.marks: list[tuple[int, float]] = []

    @property
    def has_backlog(self) -> bool:
        """True when the last ``read`` stopped early on a large backlog; read again."""
        return self._backlog

    @property
    def offset(self) -> int:
        """End of the last complete line read from the current file."""
        return self._position - self._splitter.pending_bytes

    def read(self) -> list[str]:
        """Complete lines new since the last call; a missing file gives none, not an error."""
        lines: list[str] = []
        self.marks = []
        self._backlog = False
        try:
            self._read_into(lines)
        except OSError as exc:
            # Once per distinct error: a file we may not read must not flood the log.
            if str(exc) != self._last_error:
                logger.warning("cannot read %s: %s", self.path, exc)
            self._last_error = str(exc)
        else:
            self._last_error = ""
        return lines

    def peek(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the open file after what ``read`` and earlier looks took,
        without reading them as lines (a cheap look at what is coming; a rotation or a
        truncation since shows only to ``read``)."""
        if self._fd is None:
            return b""
        start = max(self._position, self._peeked)
        now = time.time()
        try:
            data = os.pread(self._fd, limit, start)
        except OSError:
            return b""
        self._peeked = start + len(data)
        if data:
            self._mark(start)
        if len(data) < limit:
            self._seen_at = now  # its end: what comes after is written after this look
        return data

    def _mark(self, offset: int) -> None:
        """The bytes from ``offset`` on were not there when the file's end was last seen;
        within ``PART_S`` of the last mark, they share its (earlier) bound."""
        since, marks = self._seen_at, self._byte_marks
        if marks and marks[-1][0] == offset:
            marks[-1] = (offset, since)  # the end was seen there again since: a later bound
        elif since - self._marked_at >= PART_S or since == UNKNOWN:
            marks.append((offset, since))
        else:
            return
        self._marked_at = since

    def commit(self) -> None:
        """Persist the offsets of everything ``read`` returned so far."""
        if self._offsets is None:
            self._unsaved.clear()
            return
        if self._offset_moved:
            self._remember_offset()
        while self._unsaved:
            try:
                self._offsets.save_offset(self._unsaved[0])
            except Exception:
                logger.exception("cannot save the offset of %s", self.path)
                return
            del self._unsaved[0]

    def finish(self) -> list[str]:
        """The rest of the current file, its unfinished last line included; then close it."""
        lines = self.read() if self._fd is not None else []
        if self._fd is not None and not self._backlog:
            self._bounds.flush(self._splitter, lines, self.marks)
            self._remember_offset()
            self.close()
        return lines

    def close(self) -> None:
        """Close the followed file's descriptor (its offset is kept for ``commit``)."""
        if self._fd is not None:
            if self._offset_moved:
                self._remember_offset()
            os.close(self._fd)
            self._fd = None

    def _read_into(self, lines: list[str]) -> None:
        try:
            path_stat: os.stat_result | None = os.stat(self.path)
        except OSError:
            path_stat = None
        if self._fd is not None:
            same = path_stat is not None and (path_stat.st_dev, path_stat.st_ino) == (
                self._dev,
                self._inode,
            )
            if same:
                self._check_truncated()
                self._drain(lines)
                return
            # Renamed, deleted or retargeted: what the old file still holds comes first.
            self._drain(lines)
            if path_stat is None or self._backlog:
                # Keep the old file open: a writer may still append to it until
                # the new file appears (rename, then reopen).
                return
            self._bounds.flush(self._splitter, lines, self.marks)
            self._remember_offset()
            logger.info("%s was replaced; reading the new file from the start", self.path)
            self.close()
        if path_stat is None:
            return
        if not stat.S_ISREG(path_stat.st_mode):
            # A FIFO blocks the open until a writer comes (sentinel hung, deaf to SIGTERM);
            # a device never ends (/dev/zero); a directory holds no lines.
            raise OSError(f"it is {_kind(path_stat.st_mode)}, not a regular file")
        self._open()
        self._drain(lines)

    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        opened = os.fstat(fd)
        self._fd, self._dev, self._inode = fd, opened.st_dev, opened.st_ino
        self._splitter = self._new_splitter(self._max_line_bytes)
        self._position, self._tail, self._head_hash = 0, b"", ""
        self._peeked = 0
        self._unmark()
        # Only the first file of this follower may be the one an earlier run was
        # reading; any later one appeared while we watched and starts at 0.
        if not self._resume_checked:
            self._resume_checked = True
            self._resume(fd, opened.st_size)

    def _resume(self, fd: int, size: int) -> None:
        if not self._resume_saved(fd, size):
            self._skip_old(fd, size)

    def _resume_saved(self, fd: int, size: int) -> bool:
        """Start at the offset saved for this file, if any; whether it did."""
        if self._offsets is None:
            return False
        try:
            saved = self._offsets.load_offset(self._dev, self._inode)
        except Exception:
            logger.exception("cannot load the offset of %s", self.path)
            return False
        if saved is None or saved.offset > size:
            return False
        if _matches(fd, saved.head_hash, None) and _matches(fd, saved.tail_hash, saved.offset):
            self._position = saved.offset
            self._tail = _bytes_before(fd, saved.offset)
            logger.debug("resuming %s at byte %d", self.path, saved.offset)
            return True
        logger.info("%s is not the file read before (inode reused); reading from 0", self.path)
        return False

    def _skip_old(self, fd: int, size: int) -> None:
        """Start after the bytes ``skip`` names, when this is that file and they end a line."""
        if self._skip is None or self._skip[:2] != (self._dev, self._inode):
            return
        offset = self._skip[2]
        if 0 < offset <= size and os.pread(fd, 1, offset - 1) == b"\n":
            self._position = offset
            self._tail = _bytes_before(fd, offset)
            logger.info("%s: reading from byte %d, what was written before the run skipped",
                        self.path, offset)  # fmt: skip

    def _check_truncated(self) -> None:
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._position:
            reason = "shrank"
        elif size > self._position and self._tail:
            before = os.pread(self._fd, len(self._tail), self._position - len(self._tail))
            if before == self._tail:
                return
            reason = "was rewritten"
        else:
            return
        logger.info("%s %s (truncated); reading from the start", self.path, reason)
        self._splitter = self._new_splitter(self._max_line_bytes)
        self._position, self._tail, self._head_hash = 0, b"", ""
        self._peeked = 0
        self._unmark()

    def _unmark(self) -> None:
        """A file read from its start again: its bytes are of unknown age."""
        self._seen_at = UNKNOWN
        self._bounds = Bounds()
        self._byte_marks.clear()

    def _drain(self, lines: list[str]) -> None:
        """Read the open file to its end (or a batch's worth of text)."""
        assert self._fd is not None
        start_offset = self.offset
        started_at = self._position
        text_bytes = 0
        now = time.time()
        self._mark(max(self._position, self._peeked))  # the bytes no look saw
        while True:
            # pread: the position is ours, whatever the descriptor's says.
            chunk = os.pread(self._fd, CHUNK_BYTES, self._position)
            if not chunk:
                self._seen_at = now
                break
            start = self._position
            self._position += len(chunk)
            self._tail = (
                chunk[-FINGERPRINT_BYTES:]
                if len(chunk) >= FINGERPRINT_BYTES
                else (self._tail + chunk)[-FINGERPRINT_BYTES:]
            )
            text_bytes += self._split(chunk, start, lines)
            if text_bytes >= BATCH_TEXT_BYTES:
                self._backlog = True
                break
        if self.offset != start_offset:
            self._offset_moved = True
        grew = self._position - started_at
        if grew and not self._backlog:
            said = self._blocks.grew(grew, mid_line=self._splitter.pending_bytes > 0)
            if said:
                logger.warning("%s %s", self.path, said)

    def _split(self, chunk: bytes, start: int, lines: list[str]) -> int:
        """Split ``chunk`` (of the file from ``start``) into ``lines``, noting their bounds
        (``marks``), in parts cut where the bytes' bounds change (``_byte_marks``); the
        text's length."""
        marks, bounds, splitter = self._byte_marks, self._bounds, self._splitter
        end = start + len(chunk)
        text = cut = 0
        while marks and marks[0][0] < end:
            offset, since = marks.pop(0)
            at = max(0, offset - start)
            if at > cut:
                text += bounds.feed(splitter, chunk[cut:at], lines, self.marks)
                cut = at
            bounds.part(since, splitter)
        return text + bounds.feed(splitter, chunk[cut:] if cut else chunk, lines, self.marks)

    def _remember_offset(self) -> None:
        """Queue a record of the current offset for ``commit``."""
        self._offset_moved = False
        if self._offsets is None or self._fd is None:
            return
        offset = self.offset
        if not self._head_hash.startswith(f"{FINGERPRINT_BYTES}:"):
            self._head_hash = _fingerprint(
                os.pread(self._fd, min(self._position, FINGERPRINT_BYTES), 0)
            )
        tail_length = min(offset, FINGERPRINT_BYTES)
        record = FileOffset(
            path=str(self.path),
            dev=self._dev,
            inode=self._inode,
            offset=offset,
            head_hash=self._head_hash,
            tail_hash=_fingerprint(os.pread(self._fd, tail_length, offset - tail_length)),
        )
        if self._unsaved and (self._unsaved[-1].dev, self._unsaved[-1].inode) == (
            record.dev,
            record.inode,
        ):
            self._unsaved[-1] = record
        else:
            self._unsaved.append(record)
