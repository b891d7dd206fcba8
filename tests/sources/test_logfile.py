"""The follower checklist: real files really appended, renamed, truncated and relinked.

Every FileFollower case drives one follower (or a restarted one) over files in
``tmp_path`` and asserts the exact lines read: nothing lost, nothing twice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sentinel.follow.logfile import FileFollower
from sentinel.store.state import FileOffset, StateStore

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


@pytest.mark.slow
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


# -- block-buffered writers ---------------------------------------------------------------

# A job printing a step line every 2 ms: 40 000 lines over ~80 s at most, stopped once read.
_PRINTING_JOB = (
    "import sys, time\n"
    "for step in range(40000):\n"
    "    print(f'step {step} loss {2.0 - step / 100000:.6f} grad_norm 1.00', file=OUT)\n"
    "    time.sleep(0.002)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("writer", "buffered"),
    [
        pytest.param(
            [sys.executable, "-c", _PRINTING_JOB.replace("OUT", "sys.stdout")],
            True,
            id="python-no-u",
        ),
        pytest.param(
            [sys.executable, "-u", "-c", _PRINTING_JOB.replace("OUT", "sys.stdout")],
            False,
            id="python-u",
        ),
        pytest.param(
            [
                "perl",
                "-e",
                'for $s (0..40000) { print "step $s loss 1.0\\n";'
                " select(undef, undef, undef, 0.002) }",
            ],
            True,
            id="perl-stdio",
        ),
    ],
)
def test_a_log_written_in_whole_blocks_is_named_once_with_the_fix(
    tmp_path: Path, writer: list[str], buffered: bool, caplog: pytest.LogCaptureFixture
) -> None:
    if writer[0] == "perl" and shutil.which("perl") is None:
        pytest.skip("no perl here: its stdio-buffered output is the C-style case")
    log = tmp_path / "train.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(log, "wb") as out:
        job = subprocess.Popen(writer, stdout=out, stderr=subprocess.DEVNULL, env=env)
    follower = FileFollower(log)
    try:
        read = 0
        deadline = time.monotonic() + 30
        while read < 64 * 1024 and time.monotonic() < deadline:
            read += sum(len(line) + 1 for line in follower.read())
            time.sleep(0.05)
    finally:
        job.kill()
        job.wait()
    said = [r.getMessage() for r in caplog.records if "block-buffered" in r.getMessage()]
    if buffered:
        assert len(said) == 1, said
        assert said[0].startswith(f"{log} grows in whole blocks")
        assert "python -u, PYTHONUNBUFFERED=1, or stdbuf -oL" in said[0]
    else:
        assert said == []


def test_a_restart_on_a_short_log_that_grew_meanwhile_reads_on(tail: Tail) -> None:
    """Resumed at a saved offset under 4 KiB with lines written after it: the bytes kept to
    tell a truncation took the file's first 4 KiB, past the offset, and every later read
    failed on a negative offset (EINVAL): a restarted ``watch`` read nothing more of a
    short log, whose NaN it then never saw."""
    tail.append(b"a\nb\n")
    tail.read()
    tail.append(b"c\n")  # written while sentinel was down
    tail.follower.close()
    tail.restart()
    assert tail.read() == ["c"]
    tail.append(b"d\n")
    assert tail.read() == ["d"]
    tail.append(b"e\n")
    assert tail.read() == ["e"]


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_path_that_is_no_regular_file_is_not_read_and_said_once(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO blocked the open until a writer came: sentinel hung at its start, deaf to
    SIGTERM, the job never launched. /dev/zero never ends; a directory holds no lines."""
    path = tmp_path / "train.log"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    follower = FileFollower(path)
    with caplog.at_level("WARNING"):
        assert follower.read() == [] and follower.read() == []
    said = [r.getMessage() for r in caplog.records if "not a regular file" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert {"fifo": "a FIFO", "device": "a character device", "directory": "a directory"}[
        kind
    ] in said[0]
