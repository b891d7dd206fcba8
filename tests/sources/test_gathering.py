"""Gathering: what a reader hands on at once (a possible NaN, an error), what waits a window.

The policy is pure (times are passed in); the pump and the tailer run on a real pipe and a
real file, with a window of an hour, so that only an urgent read can end it in a test.
"""

from __future__ import annotations

import os
import threading
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

    def __call__(self, *args: object) -> None:
        with self._changed:
            self.calls.append(args[-1])
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


@pytest.mark.parametrize("mode", ["inotify", "polling"])
def test_the_tailer_hands_on_a_nan_at_once_with_what_it_held(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "train.log"
    log.touch()
    hand_ons = HandOns()
    tailer = LogTailer(
        [str(log)],
        hand_ons,
        poll=mode == "polling",
        poll_interval_s=60.0 if mode == "inotify" else 0.02,
        batch_s=HOUR_S,
    )
    tailer.start()
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
