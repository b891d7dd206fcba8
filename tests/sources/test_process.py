"""JobProcess: a real job's output passed through byte for byte, gathered into batches of lines.

Each job is paced by the test through a FIFO (the job's stdin is /dev/null): ``go()``
lets it take its next step, so which lines can gather together is decided, not raced.
"""

from __future__ import annotations

import io
import os
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sentinel.parsing.lines import MAX_BATCH_S
from sentinel.process.launched import PIPE_BYTES, JobProcess

DEADLINE_S = 10.0

#: The job's side of the FIFO: ``wait_go()`` blocks until the test says go.
PRELUDE = """
import os, sys, time
_go = open(sys.argv[1], "rb", buffering=0)
def wait_go():
    assert _go.read(1) == b"g"
"""


class Job:
    """A real job under JobProcess: every hand-over of lines, and the exit, in order."""

    def __init__(self, code: str, fifo: Path, batch_s: float) -> None:
        self.fifo = fifo
        self.stdout = io.BytesIO()
        self.stderr = io.BytesIO()
        self.events: list[tuple[str, Any]] = []
        self._changed = threading.Condition()
        # Read-write (Linux): opening it never blocks, and the job's open finds a writer.
        self._go_fd = os.open(fifo, os.O_RDWR)
        self.process = JobProcess(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(code), str(fifo)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            on_lines=lambda name, lines, _at, _marks: self._add(name, lines),
            on_exit=lambda code: self._add("exit", code),
            stdout=self.stdout,
            stderr=self.stderr,
            batch_s=batch_s,
        )

    def _add(self, kind: str, payload: Any) -> None:
        with self._changed:
            self.events.append((kind, payload))
            self._changed.notify_all()

    def batches(self, name: str = "stdout") -> list[list[str]]:
        with self._changed:
            return [payload for kind, payload in self.events if kind == name]

    def lines(self, name: str = "stdout") -> list[str]:
        return [line for batch in self.batches(name) for line in batch]

    def wait_lines(self, count: int) -> None:
        """Until ``count`` stdout lines have been handed on."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.lines()) >= count, DEADLINE_S):
                raise AssertionError(f"{count} lines not within {DEADLINE_S} s: {self.events}")

    def wait_exit(self) -> int:
        """The job's exit code, once reported; it must come after every line."""
        with self._changed:
            exited = self._changed.wait_for(lambda: "exit" in dict(self.events), DEADLINE_S)
            assert exited, f"no exit within {DEADLINE_S} s: {self.events}"
            kind, code = self.events[-1]
        assert kind == "exit" and isinstance(code, int), self.events
        return code

    def go(self) -> None:
        """Let the job take its next step."""
        os.write(self._go_fd, b"g")

    def close(self) -> None:
        os.close(self._go_fd)


@contextmanager
def job(code: str, tmp_path: Path, batch_s: float = 0.05) -> Iterator[Job]:
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    started = Job(code, fifo, batch_s)
    started.process.start()
    try:
        yield started
    finally:
        started.close()  # a job still waiting for go reads EOF and fails its assert
        if not started.process.wait(DEADLINE_S):
            os.killpg(started.process.pid, 9)
            started.process.wait(DEADLINE_S)


def test_output_is_passed_through_byte_for_byte_and_split_into_lines(tmp_path: Path) -> None:
    out = b"plain\r\nbar 10%\rbar 20%\r\xff\xfe not utf-8\n\x00\x00after NULs\nno end"
    err = b"Traceback (most recent call last):\nValueError: bad\n"
    code = f"""
        sys.stdout.buffer.write({out!r})
        sys.stderr.buffer.write({err!r})
    """
    with job(code, tmp_path) as running:
        assert running.wait_exit() == 0
    assert running.stdout.getvalue() == out
    assert running.stderr.getvalue() == err
    assert running.lines() == [
        "plain",
        "bar 10%",
        "bar 20%",
        "\ufffd\ufffd not utf-8",
        "after NULs",
        "no end",
    ]
    assert running.lines("stderr") == ["Traceback (most recent call last):", "ValueError: bad"]


@pytest.mark.slow
def test_lines_that_come_while_the_pump_gathers_are_handed_on_together(tmp_path: Path) -> None:
    code = """
        print("first")
        wait_go()
        for n in range(5):
            print(f"line {n}")
            time.sleep(0.005)
        wait_go()
    """
    # The longest gathering window: five lines 5 ms apart all fall in it. The first of
    # them goes alone when a look at the pipe found it quiet before it came.
    with job(code, tmp_path, batch_s=MAX_BATCH_S) as running:
        running.wait_lines(1)
        running.go()
        running.wait_lines(6)
        running.go()
    lines = [f"line {n}" for n in range(5)]
    assert running.batches()[0] == ["first"]
    assert running.batches()[1:] in ([lines], [lines[:1], lines[1:]])


@pytest.mark.slow
def test_lines_held_while_gathering_are_handed_on_once_the_output_goes_quiet(
    tmp_path: Path,
) -> None:
    code = """
        print("first")
        wait_go()
        print("a")
        print("b")
        wait_go()
        print("nan")
        wait_go()
    """
    with job(code, tmp_path, batch_s=MAX_BATCH_S) as running:
        running.wait_lines(1)
        running.go()
        running.wait_lines(3)  # a and b, once a look at the pipe found it quiet
        running.go()
        running.wait_lines(4)
        running.go()
    assert running.lines() == ["first", "a", "b", "nan"]
    assert running.batches()[-1] == ["nan"]


@pytest.mark.slow
def test_a_pipe_closed_while_the_pump_gathers_gives_its_last_lines_then_the_exit(
    tmp_path: Path,
) -> None:
    code = """
        print("first")
        wait_go()
        print("last words")
        sys.exit(5)
    """
    with job(code, tmp_path, batch_s=MAX_BATCH_S) as running:
        running.wait_lines(1)
        running.go()
        assert running.wait_exit() == 5
    assert running.batches() == [["first"], ["last words"]]


def test_without_gathering_each_read_is_handed_on(tmp_path: Path) -> None:
    code = """
        for n in range(3):
            print(f"line {n}")
            wait_go()
    """
    with job(code, tmp_path, batch_s=0.0) as running:
        for n in range(3):
            running.wait_lines(n + 1)
            running.go()
    assert running.batches() == [["line 0"], ["line 1"], ["line 2"]]


@pytest.mark.slow
def test_the_exit_comes_after_the_last_lines_of_a_burst(tmp_path: Path) -> None:
    # Far more than a pipe holds, then a crash: every byte, then the exit code.
    code = """
        for n in range(40000):
            print(f"{n:08d} " + "x" * 60)
        sys.exit(3)
    """
    with job(code, tmp_path) as running:
        assert running.wait_exit() == 3
    assert running.stdout.getvalue() == b"".join(
        f"{n:08d} {'x' * 60}\n".encode() for n in range(40000)
    )
    assert len(running.lines()) == 40000
    assert running.events[-1] == ("exit", 3)


@pytest.mark.skipif(sys.platform != "linux", reason="F_SETPIPE_SZ is Linux's")
def test_the_job_can_write_half_a_mebibyte_while_the_pump_gathers(tmp_path: Path) -> None:
    # A pipe of the default 64 KiB would take only part of the write (EAGAIN after it):
    # the job would block on its own output while sentinel gathers.
    size = PIPE_BYTES // 2
    code = f"""
        print("first")
        wait_go()
        os.set_blocking(1, False)
        written = os.write(1, b"y" * {size})
        os.set_blocking(1, True)
        print("", flush=True)
        print(f"wrote {{written}}", file=sys.stderr)
    """
    with job(code, tmp_path, batch_s=0.5) as running:
        running.wait_lines(1)
        running.go()
        assert running.wait_exit() == 0
    assert running.lines("stderr") == [f"wrote {size}"]


def test_a_nan_ends_the_gathering_window_at_once(tmp_path: Path) -> None:
    code = """
        print("first")
        wait_go()
        print("held")
        print('{"loss": NaN}')
        wait_go()
    """
    # A window of an hour: only the NaN can end it while the job still runs.
    with job(code, tmp_path, batch_s=3600.0) as running:
        running.wait_lines(1)
        running.go()
        running.wait_lines(3)
        before_exit = running.batches()
        running.go()
        assert running.wait_exit() == 0
    assert before_exit == [["first"], ["held", '{"loss": NaN}']]
    assert running.stdout.getvalue() == b'first\nheld\n{"loss": NaN}\n'
