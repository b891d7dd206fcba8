"""Gathering: what a reader hands on at once (a possible NaN, an error), what waits a window.

The policy is pure (times are passed in); the pump and the tailer run on a real pipe and a
real file, with a window of an hour, so that only an urgent read can end it in a test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sentinel.follow.gathering import URGENT_BURST, URGENT_PER_S, Gathering, may_be_urgent, pump
from sentinel.follow.tailer import LogTailer

HOUR_S = 3600.0
DEADLINE_S = 10.0


@pytest.mark.parametrize(
    ("data", "urgent"),
    [
        (b'{"step": 7, "loss": NaN}\n', True),
        (b"step 7 loss=nan lr=3e-4\n", True),
        (b"{'loss': inf, 'grad_norm': 1.0}\n", True),
        (b'{"loss": -Infinity}\n', True),
        (b"tensor(nan, device='cuda:0')\n", True),
        (b"Traceback (most recent call last):\n", True),
        (b"RuntimeError: CUDA error: an illegal memory access\n", True),
        (b"OSError: [Errno 28] No space left on device\n", True),
        (b"2026-11-25 INFO train.py:88 step 7 loss 2.01\n", False),
        (b'{"step": 7, "nan_count": 0, "nanoseconds": 12}\n', False),
        (b"finance inference information\n", False),
        (b'{"val_error_rate": 0.1, "errors": 0}\n', False),
        (b'{"step": 7, "loss": 2.0, "grad_norm": 1.0}\n', False),
    ],
    ids=[
        "json-NaN",
        "keyvalue-nan",
        "hf-inf",
        "negative-Infinity",
        "tensor-nan",
        "traceback",
        "runtime-error",
        "os-error",
        "INFO-is-not-inf",
        "nan-inside-names",
        "inf-inside-words",
        "error-inside-names",
        "healthy",
    ],
)
def test_may_be_urgent(data: bytes, urgent: bool) -> None:
    assert may_be_urgent(data) is urgent


def test_a_non_finite_float_in_a_binary_file_is_urgent(tmp_path: Path) -> None:
    """A TensorBoard event file holds its scalars as binary floats: no text says NaN. Each
    non-finite one torch writes is found; finite ones and the records around them are not."""
    from torch.utils.tensorboard import SummaryWriter

    for index, value in enumerate((float("nan"), float("inf"), float("-inf"), -float("nan"))):
        folder = tmp_path / str(index)
        writer = SummaryWriter(str(folder))
        writer.add_scalar("loss", 1.5, 1)
        writer.add_scalar("grad_norm", 0.25, 1)
        writer.flush()
        (path,) = folder.iterdir()
        healthy = path.read_bytes()
        writer.add_scalar("loss", value, 2)
        writer.close()
        data = path.read_bytes()
        assert not may_be_urgent(healthy), value
        assert may_be_urgent(data[len(healthy) :]), value


def test_the_first_read_goes_at_once_and_the_next_waits_for_the_window() -> None:
    gathering = Gathering(batch_s=0.25)
    assert gathering.hand_on_now(urgent=False, now=100.0)
    gathering.handed_on(100.0)
    assert not gathering.hand_on_now(urgent=False, now=100.1)
    assert gathering.due() == 100.25
    assert gathering.hand_on_now(urgent=False, now=100.25)


def test_an_urgent_read_ends_the_window() -> None:
    gathering = Gathering(batch_s=0.25)
    gathering.handed_on(100.0)
    assert gathering.hand_on_now(urgent=True, now=100.01)


def test_urgent_reads_beyond_the_budget_wait_for_their_window() -> None:
    gathering = Gathering(batch_s=HOUR_S)
    gathering.handed_on(100.0)
    granted = [gathering.hand_on_now(urgent=True, now=100.0) for _ in range(20)]
    assert granted == [True] * int(URGENT_BURST) + [False] * (20 - int(URGENT_BURST))
    # The budget refills with time: one more a 1/URGENT_PER_S later.
    assert gathering.hand_on_now(urgent=True, now=100.0 + 1.0 / URGENT_PER_S)
    assert not gathering.hand_on_now(urgent=True, now=100.0 + 1.0 / URGENT_PER_S)


def test_without_a_window_every_read_goes_and_nothing_waits() -> None:
    gathering = Gathering(batch_s=0.0)
    assert gathering.look_s == 0.0
    gathering.handed_on(100.0)
    assert gathering.hand_on_now(urgent=False, now=100.0)


class HandOns:
    """What a reader handed on, a call at a time, with waiting for a count of calls."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self._changed = threading.Condition()

    def __call__(self, *args: Any) -> None:
        """The pump's reads (joined), or the tailer's lines."""
        with self._changed:
            self.calls.append(b"".join(data for data, _ in args[0]) if len(args) == 1 else args[1])
            self._changed.notify_all()

    def wait(self, count: int) -> list[Any]:
        with self._changed:
            got = self._changed.wait_for(lambda: len(self.calls) >= count, DEADLINE_S)
            assert got, self.calls
            return list(self.calls)


def test_the_pump_hands_on_a_nan_at_once_with_what_it_held(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    hand_ons = HandOns()
    reader = threading.Thread(target=pump, args=(read_fd, HOUR_S, hand_ons, 1 << 20))
    reader.start()
    try:
        os.write(write_fd, b"first\n")
        assert hand_ons.wait(1) == [b"first\n"]  # after a quiet spell: at once
        os.write(write_fd, b"held\n")
        os.write(write_fd, b'{"loss": NaN}\n')
        # The window is an hour: only the NaN can end it while the pipe is open.
        assert hand_ons.wait(2) == [b"first\n", b'held\n{"loss": NaN}\n']
        os.write(write_fd, b"after\n")
    finally:
        os.close(write_fd)
        reader.join(DEADLINE_S)
        os.close(read_fd)
    assert hand_ons.calls == [b"first\n", b'held\n{"loss": NaN}\n', b"after\n"]


def hour_tailer(log: Path, hand_ons: HandOns, mode: str = "polling") -> LogTailer:
    """A started tailer of ``log`` (made empty) with a window of an hour: only an urgent look
    (or a call) ends it in a test."""
    log.touch()
    tailer = LogTailer(
        [str(log)],
        hand_ons,
        poll=mode == "polling",
        poll_interval_s=60.0 if mode == "inotify" else 0.02,
        batch_s=HOUR_S,
    )
    tailer.start()
    return tailer


@pytest.mark.parametrize("mode", ["inotify", "polling"])
def test_the_tailer_hands_on_a_nan_at_once_with_what_it_held(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "train.log"
    hand_ons = HandOns()
    tailer = hour_tailer(log, hand_ons, mode)
    try:
        with open(log, "ab", buffering=0) as file:
            file.write(b"first\n")
            assert hand_ons.wait(1) == [["first"]]
            file.write(b"held\n")
            file.write(b"step 9 loss nan\n")
            assert hand_ons.wait(2) == [["first"], ["held", "step 9 loss nan"]]
            file.write(b"after\n")
    finally:
        tailer.stop()  # hands on what it holds
    assert hand_ons.calls == [["first"], ["held", "step 9 loss nan"], ["after"]]


def test_the_end_of_a_line_that_went_early_goes_at_once() -> None:
    # An unbuffered print writes a line's text and its newline apart.
    read_fd, write_fd = os.pipe()
    hand_ons = HandOns()
    reader = threading.Thread(target=pump, args=(read_fd, HOUR_S, hand_ons, 1 << 20))
    reader.start()
    try:
        os.write(write_fd, b"first")
        assert hand_ons.wait(1) == [b"first"]
        os.write(write_fd, b"\n")
        assert hand_ons.wait(2) == [b"first", b"\n"]
        os.write(write_fd, b"held\n")
        os.write(write_fd, b'{"loss": NaN}')
        assert hand_ons.wait(3)[-1].endswith(b"NaN}")
        os.write(write_fd, b"\n")
        # The window is an hour: the NaN line's end can only come now because it ends it.
        assert hand_ons.wait(4)[-1] == b"\n"
    finally:
        os.close(write_fd)
        reader.join(DEADLINE_S)
        os.close(read_fd)


def written(lines: list[str], times: Path) -> list[float]:
    """When each line's write had ended (``WRITER``'s ``times``, by the line's index)."""
    after = [float(text) for text in times.read_text().split()]
    return [after[json.loads(line)["i"]] for line in lines]


#: Writes 120 lines to argv[1] (``-``: stdout), one every 10 ms, and the time each write had
#: ended to argv[2]: a bound must never be after it (the time taken before a write is no
#: reference: a look between it and the write may rightly bound the line after it).
WRITER = """
import json, sys, time
out = open(sys.argv[1], "a", buffering=1) if sys.argv[1] != "-" else sys.stdout
with open(sys.argv[2], "w") as times:
    for index in range(120):
        out.write(json.dumps({"i": index}) + "\\n")
        out.flush()
        times.write(f"{time.time()!r}\\n")
        time.sleep(0.01)
"""


def bounds_of(lines: list[str], marks: tuple[tuple[int, float], ...]) -> list[float | None]:
    """Each line's bound by ``marks`` (None before the first)."""
    bounds: list[float | None] = [None] * len(lines)
    for index, since in marks:
        bounds[index:] = [since] * (len(lines) - index)
    return bounds


def test_the_tailer_says_when_each_line_it_gathered_was_written_to_a_look(tmp_path: Path) -> None:
    """A real writer appends a line every 10 ms, each holding when it was written; the
    tailer gathers them for a second and hands them on together. Each line's bound (its
    ``Marks``) is never after it was written, and comes within a look or so of it, where
    the window's start is up to a second early."""
    log, times = tmp_path / "train.log", tmp_path / "times"
    log.touch()
    batches: list[tuple[list[str], tuple[tuple[int, float], ...]]] = []
    tailer = LogTailer([str(log)], lambda _, lines, marks: batches.append((lines, marks)))
    tailer.start()
    try:
        subprocess.run([sys.executable, "-c", WRITER, str(log), str(times)], check=True, timeout=60)
    finally:
        tailer.stop()
    lines = [line for batch, _ in batches for line in batch]
    assert len(lines) == 120
    assert len(batches) < 10, "gathered"  # 1.2 s of lines: a few windows, not a batch a look
    early = []
    for batch, marks in batches:
        for line_written, bound in zip(written(batch, times), bounds_of(batch, marks), strict=True):
            assert bound is not None and bound <= line_written, (bound, line_written)
            early.append(line_written - bound)
    # Within a look and the merging of marks (0.1 s) of its write, most lines: a loaded
    # machine delays looks, never makes a bound later than the write.
    assert statistics.median(early) < 0.3, early


def test_the_pump_says_when_each_read_it_gathered_was_written(tmp_path: Path) -> None:
    """The same through a pipe: a read's bytes were written after the read before it."""
    reads: list[list[tuple[bytes, float]]] = []
    times = tmp_path / "times"
    argv = [sys.executable, "-c", WRITER, "-", str(times)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as job:
        assert job.stdout is not None
        pump(job.stdout.fileno(), 1.0, reads.append, 1 << 20)
    assert len(reads) < 10, "gathered"
    early = []
    for held in reads:
        for data, since in held:
            for line_written in written(data.decode().splitlines(), times):
                if since:  # the first read: its bytes are of any age
                    assert since <= line_written, (since, line_written)
                    early.append(line_written - since)
    assert early and statistics.median(early) < 0.3, early


def test_hand_on_soon_ends_the_window_at_the_next_look(tmp_path: Path) -> None:
    """The job ended: what the tailer holds goes now, not at the end of its window."""
    log = tmp_path / "train.log"
    hand_ons = HandOns()
    tailer = hour_tailer(log, hand_ons)
    try:
        with open(log, "ab", buffering=0) as file:
            file.write(b"first\n")
            assert hand_ons.wait(1) == [["first"]]
            file.write(b"last words\n")
            time.sleep(0.2)
            assert hand_ons.calls == [["first"]], "held for the window (an hour)"
            tailer.hand_on_soon()
            assert hand_ons.wait(2) == [["first"], ["last words"]]
    finally:
        tailer.stop()
