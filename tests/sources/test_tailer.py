"""LogTailer: a real thread, real watchdog events, real files.

Each test runs in both wake-up modes where that matters: with inotify the
safety poll is too slow to pass a test, so the events must do the work.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from sentinel.follow.tailer import LogTailer
from sentinel.model.records import Marks
from sentinel.parsing.lines import MAX_BATCH_S
from sentinel.store.state import StateStore


class Collector:
    """``on_lines`` that records (path, line) and lets a test wait with a deadline."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.lines: list[tuple[str, str]] = []

    def __call__(self, path: str, lines: list[str], _marks: Marks) -> None:
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_tailer_survives_a_failing_on_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "app.log"
    collector = Collector()

    def on_lines(path: str, lines: list[str], _marks: Marks) -> None:
        collector(path, lines, _marks)
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
    monkeypatch.setattr("sentinel.follow.tail_wakeups.Observer", _BrokenObserver)
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
    monkeypatch.setattr("sentinel.follow.tailer.VANISHED_GRACE_S", 0.0)
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


class Batches:
    """What ``on_lines`` was handed, a list per call, with waiting for a count of lines."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self._changed = threading.Condition()

    def __call__(self, _path: str, lines: list[str], _marks: Marks) -> None:
        with self._changed:
            self.batches.append(lines)
            self._changed.notify_all()

    def wait_lines(self, count: int) -> None:
        with self._changed:
            got = self._changed.wait_for(lambda: sum(map(len, self.batches)) >= count, timeout=5.0)
        assert got, self.batches


def gathering_tailer(log: Path, mode: str, received: Batches) -> LogTailer:
    """A tailer of ``log`` with the longest gathering window: appends made one after
    another while it gathers all fall in one window."""
    interval = 60.0 if mode == "inotify" else 0.02
    return LogTailer(
        [str(log)],
        received,
        poll=mode == "polling",
        poll_interval_s=interval,
        batch_s=MAX_BATCH_S,
    )


@pytest.mark.slow
def test_lines_written_while_the_tailer_gathers_come_in_one_batch(
    tmp_path: Path, mode: str
) -> None:
    log = tmp_path / "app.log"
    received = Batches()
    tailer = gathering_tailer(log, mode, received)
    tailer.start()
    try:
        append(log, b"first\n")
        received.wait_lines(1)
        for line in (b"a\n", b"b\n", b"c\n"):
            append(log, line)
        received.wait_lines(4)
    finally:
        tailer.stop()
    # The first append goes alone if a read found the file quiet before it came.
    assert received.batches[0] == ["first"]
    assert received.batches[1:] in ([["a", "b", "c"]], [["a"], ["b", "c"]])


@pytest.mark.slow
def test_lines_held_while_gathering_are_handed_on_once_the_output_goes_quiet(
    tmp_path: Path, mode: str
) -> None:
    log = tmp_path / "app.log"
    received = Batches()
    tailer = gathering_tailer(log, mode, received)
    tailer.start()
    try:
        append(log, b"first\n")
        received.wait_lines(1)
        append(log, b"a\n")
        append(log, b"b\n")
        received.wait_lines(3)  # once a read found nothing new
        append(log, b"nan\n")
        received.wait_lines(4)
    finally:
        tailer.stop()
    assert [line for batch in received.batches for line in batch] == ["first", "a", "b", "nan"]
    assert received.batches[-1] == ["nan"]


def test_lines_held_while_gathering_are_handed_on_at_stop(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "app.log"
    received = Batches()
    tailer = gathering_tailer(log, mode, received)
    tailer.start()
    try:
        append(log, b"first\n")
        received.wait_lines(1)
        append(log, b"a\n")
    finally:
        tailer.stop()
    assert received.batches == [["first"], ["a"]]


@pytest.mark.slow
def test_a_log_that_never_appears_is_named_once(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in --log: after ``missing_warn_s`` it is named once; a log that appeared in
    time, and a glob that matched, are not."""
    typo, real = tmp_path / "trian.log", tmp_path / "train.log"
    real.write_text("step 1 loss 2.0\n")
    received = Batches()
    tailer = LogTailer(
        [str(typo), str(real), str(tmp_path / "*.jsonl")],
        received,
        poll=mode == "polling",
        poll_interval_s=0.05,
        missing_warn_s=0.3,
    )
    (tmp_path / "metrics.jsonl").write_text('{"loss": 1.0}\n')
    with caplog.at_level(logging.WARNING, logger="sentinel.follow.tailer"):
        tailer.start()
        try:
            deadline = time.monotonic() + 10
            while not any("no such file" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the missing log was never named"
                time.sleep(0.05)
            time.sleep(0.5)  # more turns: still once
        finally:
            tailer.stop()
    named = [r.getMessage() for r in caplog.records if "no such file" in r.getMessage()]
    assert len(named) == 1, named
    assert named[0].startswith(f"--log {typo}: no such file 0.3 s after the start")
