"""The tailer checklist: real files really appended, renamed, truncated and relinked.

Every FileFollower case drives one follower (or a restarted one) over files in
``tmp_path`` and asserts the exact lines read: nothing lost, nothing twice.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sentinel.sources.logfile import FileFollower, LogTailer
from sentinel.state import FileOffset, StateStore

MAX_LINE = 1 << 20


class Tail:
    """One followed path, a state store, and every line read so far."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.path = tmp_path / "app.log"
        self.store = StateStore(tmp_path / "state")
        self.got: list[str] = []
        self._followers: list[FileFollower] = []
        self.follower = self.restart()

    def restart(self) -> FileFollower:
        """A new follower on the same path and store: sentinel restarted."""
        self.follower = FileFollower(self.path, offsets=self.store, max_line_bytes=MAX_LINE)
        self._followers.append(self.follower)
        return self.follower

    def read(self, *, commit: bool = True) -> list[str]:
        lines: list[str] = []
        while True:
            lines += self.follower.read()
            if commit:
                self.follower.commit()
            if not self.follower.has_backlog:
                break
        self.got += lines
        return lines

    def append(self, data: bytes, path: Path | None = None) -> None:
        with open(path or self.path, "ab") as file:
            file.write(data)

    def close(self) -> None:
        for follower in self._followers:
            follower.close()
        self.store.close()


@pytest.fixture
def tail(tmp_path: Path) -> Iterator[Tail]:
    harness = Tail(tmp_path)
    yield harness
    harness.close()


# -- the checklist: each case drives a Tail and returns the lines it must have read --


def plain_append(t: Tail) -> list[str]:
    t.append(b"a\nb\n")
    t.read()
    t.read()  # nothing new: nothing returned
    t.append(b"c\n")
    t.read()
    return ["a", "b", "c"]


def partial_line_held(t: Tail) -> list[str]:
    t.append(b"a\npar")
    assert t.read() == ["a"]
    assert t.follower.offset == 2  # never past the last complete line
    t.append(b"tial\n")
    t.read()
    return ["a", "partial"]


def crlf(t: Tail) -> list[str]:
    t.append(b"a\r\nb\r")
    t.read()
    t.append(b"\nc\r\n")
    t.read()
    return ["a", "b", "c"]


def tqdm_updates(t: Tail) -> list[str]:
    t.append(b" 10%|#   | 1/10\r 20%|##  | 2/10\r")
    t.read()
    t.append(b" 30%|### | 3/10\nloss=1\n")
    t.read()
    return [" 10%|#   | 1/10", " 20%|##  | 2/10", " 30%|### | 3/10", "loss=1"]


def invalid_utf8(t: Tail) -> list[str]:
    t.append(b"ok \xff\xfe\n\xc3")
    t.read()
    t.append(b"\xa9t\xe9\n")
    t.read()
    return ["ok \ufffd\ufffd", "ét\ufffd"]


def ten_mb_line(t: Tail) -> list[str]:
    t.append(b"start\n")
    for _ in range(10):
        t.append(b"x" * (1 << 20))
        t.read()
        assert len(t.follower._splitter._partial) <= MAX_LINE  # bounded while unfinished
    t.append(b"\nnext1\nnext2\n")
    t.read()
    long_line = t.got[1]
    assert len(long_line.encode()) <= MAX_LINE + 40
    return ["start", "x" * MAX_LINE + f" …[truncated {9 * MAX_LINE} bytes]", "next1", "next2"]


def rename_rotation_x3(t: Tail) -> list[str]:
    expected: list[str] = []
    for round_ in range(3):
        writer = open(t.path, "ab")  # noqa: SIM115 - the writer outlives the rename
        try:
            writer.write(b"r%d-a\n" % round_)
            writer.flush()
            t.read()
            os.replace(t.path, t.dir / "app.log.1")
            # The writer still holds the old file: these land in app.log.1.
            writer.write(b"r%d-late1\n" % round_)
            writer.flush()
            t.read()  # the path is missing now: the old file is drained, kept open
            writer.write(b"r%d-late2\nr%d-partial" % (round_, round_))
        finally:
            writer.close()
        expected += [f"r{round_}-a", f"r{round_}-late1", f"r{round_}-late2", f"r{round_}-partial"]
    t.append(b"final\n")
    t.read()
    return [*expected, "final"]


def copytruncate(t: Tail) -> list[str]:
    t.append(b"a\nb\n")
    t.read()
    shutil.copyfile(t.path, t.dir / "app.log.1")
    os.truncate(t.path, 0)
    t.read()
    t.append(b"c\n")
    t.read()
    return ["a", "b", "c"]


def truncate_then_regrow_past_offset(t: Tail) -> list[str]:
    t.append(b"aaaa\nbbbb\n")
    t.read()
    os.truncate(t.path, 0)
    t.append(b"cccc\ndddd\neeee\n")  # regrew past the old offset before we looked
    t.read()
    return ["aaaa", "bbbb", "cccc", "dddd", "eeee"]


def leading_nuls_from_a_gt_writer(t: Tail) -> list[str]:
    writer = open(t.path, "wb")  # noqa: SIM115 - `>`: no O_APPEND, keeps its own position
    try:
        writer.write(b"a\nb\n")
        writer.flush()
        t.read()
        os.truncate(t.path, 0)  # someone truncates; the writer goes on at byte 4
        writer.write(b"c\n")
        writer.flush()
        t.read()
        writer.write(b"d\n")
        writer.flush()
        t.read()
    finally:
        writer.close()
    return ["a", "b", "c", "d"]


def delete_and_recreate(t: Tail) -> list[str]:
    t.append(b"old1\nold2\n")
    t.read()
    t.path.unlink()
    t.read()
    t.append(b"new1\n")
    t.read()
    return ["old1", "old2", "new1"]


def symlink_retarget(t: Tail) -> list[str]:
    targets = t.dir / "runs"
    targets.mkdir()
    first, second = targets / "run1.log", targets / "run2.log"
    t.append(b"one-a\n", first)
    t.path.symlink_to(first)
    t.read()
    t.append(b"one-b\none-last", first)
    link = t.dir / "app.log.tmp"
    link.symlink_to(second)
    t.append(b"two-a\n", second)
    os.replace(link, t.path)  # atomic retarget, as `ln -sfn` does
    t.read()
    t.append(b"two-b\n", second)
    t.read()
    return ["one-a", "one-b", "one-last", "two-a", "two-b"]


def created_after_start(t: Tail) -> list[str]:
    assert t.read() == []
    t.append(b"hello\n")
    t.read()
    return ["hello"]


def restart_with_persisted_offsets(t: Tail) -> list[str]:
    t.append(b"a\nb\n")
    t.read()
    t.append(b"c\npart")
    t.read()
    t.follower.close()  # sentinel dies with "part" pending
    t.restart()
    t.append(b"ial\nd\n")
    t.read()
    t.restart()
    t.read()  # a second restart with nothing new reads nothing
    t.append(b"e\n")
    t.read()
    return ["a", "b", "c", "partial", "d", "e"]


def restart_after_rotation(t: Tail) -> list[str]:
    t.append(b"a\n")
    t.read()
    t.follower.close()
    os.replace(t.path, t.dir / "app.log.1")
    t.append(b"b\n")
    t.restart()
    t.read()
    return ["a", "b"]


def inode_reused_with_different_content(t: Tail) -> list[str]:
    t.append(b"old line 1\nold line 2\n")
    t.read()
    t.follower.close()
    # Same dev and inode, different bytes: to the store it looks like the old file.
    with open(t.path, "r+b") as file:
        file.truncate(0)
        file.write(b"new line 1\nnew line 2\nnew line 3\n")
    t.restart()
    t.read()
    return ["old line 1", "old line 2", "new line 1", "new line 2", "new line 3"]


def inode_reused_after_delete(t: Tail) -> list[str]:
    t.append(b"old line 1\nold line 2\n")
    t.read()
    t.follower.close()
    t.path.unlink()
    t.append(b"another file with other text\n")  # may or may not get the old inode
    t.restart()
    t.read()
    return ["old line 1", "old line 2", "another file with other text"]


CHECKLIST: list[Callable[[Tail], list[str]]] = [
    plain_append,
    partial_line_held,
    crlf,
    tqdm_updates,
    invalid_utf8,
    ten_mb_line,
    rename_rotation_x3,
    copytruncate,
    truncate_then_regrow_past_offset,
    leading_nuls_from_a_gt_writer,
    delete_and_recreate,
    symlink_retarget,
    created_after_start,
    restart_with_persisted_offsets,
    restart_after_rotation,
    inode_reused_with_different_content,
    inode_reused_after_delete,
]


@pytest.mark.parametrize("case", CHECKLIST, ids=[case.__name__ for case in CHECKLIST])
def test_follower_checklist(tail: Tail, case: Callable[[Tail], list[str]]) -> None:
    expected = case(tail)
    assert tail.got == expected


def test_lines_read_but_not_committed_are_read_again(tail: Tail) -> None:
    tail.append(b"a\n")
    tail.read()
    tail.append(b"b\n")
    assert tail.read(commit=False) == ["b"]
    tail.follower.close()
    tail.restart()
    assert tail.read() == ["b"]


def test_a_stale_offset_record_for_this_inode_is_ignored(tail: Tail) -> None:
    tail.append(b"line one\nline two\n")
    st = os.stat(tail.path)
    tail.store.save_offset(FileOffset(str(tail.path), st.st_dev, st.st_ino, 9, "9:00", "9:00"))
    assert tail.read() == ["line one", "line two"]


def test_a_missing_file_never_raises(tmp_path: Path) -> None:
    follower = FileFollower(tmp_path / "nope" / "app.log")
    assert follower.read() == []
    follower.commit()
    follower.close()


# -- LogTailer: a real thread, real watchdog events -----------------------------


class Collector:
    """``on_lines`` that records (path, line) and lets a test wait with a deadline."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lines: list[tuple[str, str]] = []

    def __call__(self, path: str, lines: list[str]) -> None:
        with self.cond:
            self.lines += [(path, line) for line in lines]
            self.cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 5.0) -> list[tuple[str, str]]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.lines) >= count, timeout_s)
            return list(self.lines)


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as file:
        file.write(data)


@pytest.fixture(params=["inotify", "polling"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_tailer(patterns: list[str], collector: Collector, mode: str) -> LogTailer:
    # In inotify mode the safety poll is too slow to pass a test: events must do it.
    interval = 60.0 if mode == "inotify" else 0.02
    return LogTailer(patterns, collector, poll=mode == "polling", poll_interval_s=interval)


def test_tailer_reads_existing_lines_before_start_returns(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "app.log"
    append(log, b"a\nb\n")
    collector = Collector()
    tailer = make_tailer([str(log)], collector, mode)
    tailer.start()
    try:
        assert collector.lines == [(str(log), "a"), (str(log), "b")]
        assert tailer.mode == mode
        assert tailer.files == [str(log)]
    finally:
        tailer.stop()


def test_tailer_delivers_appended_lines(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "app.log"
    collector = Collector()
    tailer = make_tailer([str(log)], collector, mode)
    tailer.start()
    try:
        append(log, b"one\n")
        assert collector.wait_for(1) == [(str(log), "one")]
        append(log, b"two\nthree\n")
        assert collector.wait_for(3) == [(str(log), x) for x in ("one", "two", "three")]
    finally:
        tailer.stop()


def test_tailer_glob_picks_up_a_new_file(tmp_path: Path, mode: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    append(logs / "a.log", b"a1\n")
    collector = Collector()
    tailer = make_tailer([str(logs / "*.log")], collector, mode)
    tailer.start()
    try:
        append(logs / "b.log", b"b1\n")
        append(logs / "ignored.txt", b"nope\n")
        assert collector.wait_for(2) == [(str(logs / "a.log"), "a1"), (str(logs / "b.log"), "b1")]
        assert tailer.files == [str(logs / "a.log"), str(logs / "b.log")]
    finally:
        tailer.stop()


def test_tailer_follows_rename_rotation(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "app.log"
    collector = Collector()
    tailer = make_tailer([str(log)], collector, mode)
    tailer.start()
    expected: list[tuple[str, str]] = []
    try:
        for round_ in range(3):
            with open(log, "ab") as writer:
                writer.write(b"r%d-a\n" % round_)
                writer.flush()
                expected.append((str(log), f"r{round_}-a"))
                assert collector.wait_for(len(expected)) == expected
                os.replace(log, tmp_path / "app.log.1")
                writer.write(b"r%d-late\n" % round_)
            expected.append((str(log), f"r{round_}-late"))
        append(log, b"new\n")
        expected.append((str(log), "new"))
        assert collector.wait_for(len(expected)) == expected
    finally:
        tailer.stop()
    assert collector.lines == expected


def test_tailer_follows_a_file_in_a_directory_created_later(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "later" / "deeper" / "app.log"
    collector = Collector()
    tailer = make_tailer([str(log)], collector, mode)
    tailer.start()
    try:
        log.parent.mkdir(parents=True)
        append(log, b"first\n")
        assert collector.wait_for(1) == [(str(log), "first")]
        append(log, b"second\n")
        assert collector.wait_for(2)[-1] == (str(log), "second")
    finally:
        tailer.stop()


def test_tailer_follows_a_symlink_into_another_directory(tmp_path: Path, mode: str) -> None:
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "run1.log"
    append(target, b"")
    log = tmp_path / "app.log"
    log.symlink_to(target)
    collector = Collector()
    tailer = make_tailer([str(log)], collector, mode)
    tailer.start()
    try:
        append(target, b"through the link\n")
        assert collector.wait_for(1) == [(str(log), "through the link")]
    finally:
        tailer.stop()


def test_tailer_stop_delivers_lines_appended_just_before(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    collector = Collector()
    tailer = LogTailer([str(log)], collector, poll=True, poll_interval_s=60.0)
    tailer.start()
    append(log, b"last words\n")
    tailer.stop()
    assert collector.lines == [(str(log), "last words")]
    assert tailer.files == []


def test_tailer_commits_offsets_so_a_restart_reads_only_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    store = StateStore(tmp_path / "state")
    try:
        append(log, b"a\n")
        first = Collector()
        tailer = LogTailer([str(log)], first, offsets=store, poll=True, poll_interval_s=60.0)
        tailer.start()
        tailer.stop()
        append(log, b"b\n")
        second = Collector()
        tailer = LogTailer([str(log)], second, offsets=store, poll=True, poll_interval_s=60.0)
        tailer.start()
        tailer.stop()
    finally:
        store.close()
    assert first.lines == [(str(log), "a")]
    assert second.lines == [(str(log), "b")]


def test_tailer_survives_a_failing_on_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "app.log"
    collector = Collector()

    def on_lines(path: str, lines: list[str]) -> None:
        collector(path, lines)
        if "boom" in lines:
            raise RuntimeError("consumer bug")

    tailer = LogTailer([str(log)], on_lines, poll=True, poll_interval_s=0.02)
    with caplog.at_level(logging.ERROR):
        tailer.start()
        try:
            append(log, b"boom\n")
            assert collector.wait_for(1) == [(str(log), "boom")]
            append(log, b"after\n")
            assert collector.wait_for(2) == [(str(log), "boom"), (str(log), "after")]
        finally:
            tailer.stop()
    failures = [r for r in caplog.records if r.exc_info and "on_lines failed" in r.getMessage()]
    assert len(failures) == 1


class _BrokenObserver:
    """Stands in for an observer that hit the inotify watch limit."""

    def schedule(self, *args: object, **kwargs: object) -> None:
        raise OSError(28, "inotify watch limit reached")

    def start(self) -> None:  # pragma: no cover - never reached
        raise AssertionError

    def stop(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False


def test_tailer_falls_back_to_polling_when_events_are_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("sentinel.sources.logfile.Observer", _BrokenObserver)
    log = tmp_path / "app.log"
    collector = Collector()
    tailer = LogTailer([str(log)], collector, poll_interval_s=0.02)
    with caplog.at_level(logging.WARNING):
        tailer.start()
    try:
        assert tailer.mode == "polling"
        assert [r.getMessage() for r in caplog.records if "polling" in r.getMessage()]
        append(log, b"still read\n")
        assert collector.wait_for(1) == [(str(log), "still read")]
    finally:
        tailer.stop()


def test_tailer_drops_a_globbed_file_that_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sentinel.sources.logfile.VANISHED_GRACE_S", 0.0)
    logs = tmp_path / "logs"
    logs.mkdir()
    a_log, b_log = logs / "a.log", logs / "b.log"
    append(a_log, b"a1\n")
    append(b_log, b"b1\n")
    collector = Collector()
    tailer = LogTailer([str(logs / "*.log")], collector, poll=True, poll_interval_s=0.02)
    tailer.start()
    try:
        append(b_log, b"b-last")
        b_log.unlink()
        append(a_log, b"a2\n")
        lines = collector.wait_for(4)
        gone = threading.Event()
        deadline = time.monotonic() + 5.0
        while tailer.files != [str(a_log)] and time.monotonic() < deadline:
            gone.wait(0.01)
        assert tailer.files == [str(a_log)]
    finally:
        tailer.stop()
    assert sorted(lines[2:]) == [(str(a_log), "a2"), (str(b_log), "b-last")]
