"""The relay: the job's terminals held by a process of its own, its output copied to files and to
sentinel, the job never blocked nor killed by sentinel's end, and adopted again from the files.

Real relays, real jobs, real terminals; sentinel's death is its ends of the pipes closing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import struct
import sys
import termios
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.process.adopted import AdoptedJob
from sentinel.process.identity import ProcessIdentity
from sentinel.process.launched import JobProcess
from sentinel.process.relay import DEFAULT_COLUMNS, DEFAULT_ROWS
from sentinel.process.relay_copies import BOTH_FILE, DETACHED, EXIT
from sentinel.process.relayed import JobRecord, RelayedStart, terminal_size

#: The job's environment: no PYTHONUNBUFFERED, so Python buffers as a terminal makes it.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}


class Captured:
    """One attempt under a relay: its lines by stream, its exit."""

    def __init__(self, tmp_path: Path, code: str, *, pty: bool = True) -> None:
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self.exited = threading.Event()
        self.returncode: int | None = None
        self.relay = RelayedStart(tmp_path / "attempt", pty=pty)
        self.job = JobProcess(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=ENV,
            on_lines=lambda source, lines, at, marks: self.lines[source].extend(lines),
            on_exit=self._exit,
            stdout=None,
            stderr=None,
            relay=self.relay,
        )

    def _exit(self, returncode: int) -> None:
        self.returncode = returncode
        self.exited.set()

    def run(self) -> Captured:
        self.job.start()
        assert self.exited.wait(20), "the job did not end"
        return self


def test_the_job_writes_to_one_terminal_for_both_streams_copied_to_a_file(tmp_path: Path) -> None:
    done = Captured(
        tmp_path,
        """
        import os, sys
        out = sys.stdout
        print("stdout", out.isatty(), out.line_buffering, os.get_terminal_size().columns)
        print("stderr", sys.stderr.isatty(), file=sys.stderr)
        print("loss 1.5", end="\\r"); print("loss 1.4")
        sys.exit(3)
        """,
    ).run()
    assert done.returncode == 3
    assert done.lines["stdout"][0].startswith("stdout True True ")
    # As in a shell: stderr is the same terminal, its line in the order it was written.
    assert done.lines["stdout"][1:] == ["stderr True", "loss 1.5", "loss 1.4"]  # \r ends a line
    assert done.lines["stderr"] == []
    attempt = done.relay.directory
    kept = (attempt / "stdout.log").read_bytes()
    assert kept.endswith(b"stderr True\nloss 1.5\rloss 1.4\n")  # no \r\n
    assert (attempt / "stderr.log").read_bytes() == b""
    assert (attempt / BOTH_FILE).samefile(attempt / "stdout.log"), "kept once"
    assert json.loads((attempt / EXIT).read_text())["returncode"] == 3
    assert not (attempt / DETACHED).exists(), "sentinel read to the end: nothing detached"


@pytest.mark.parametrize("pty", [True, False], ids=["terminals", "pipes"])
def test_both_streams_go_to_one_file_too_each_line_whole(tmp_path: Path, pty: bool) -> None:
    """``output.log``: what ``replay`` reads to see the attempt as sentinel did. From two
    pipes, a part of a line the other stream cut into ends on a line of its own."""
    done = Captured(
        tmp_path,
        """
        import sys, time
        for step in range(40):
            print(f"out {step}", flush=True)
            print(f"err {step}", file=sys.stderr, flush=True)
            if step % 10 == 0:
                time.sleep(0.03)
        sys.stdout.write("half a line"); sys.stdout.flush(); time.sleep(0.1)
        print("err last", file=sys.stderr, flush=True)
        """,
        pty=pty,
    ).run()
    assert done.returncode == 0
    both = (done.relay.directory / BOTH_FILE).read_bytes().decode().splitlines()
    if pty:  # one terminal: the order written, and a half line is glued as on a screen
        written = [f"{stream} {step}" for step in range(40) for stream in ("out", "err")]
        assert both == [*written, "half a lineerr last"]
        assert done.lines["stdout"] == both
        return
    for stream in ("out", "err"):
        mine = [line for line in both if line.startswith(stream)]
        assert mine == [f"{stream} {step}" for step in range(40)] + (
            [] if stream == "out" else ["err last"]
        )
    assert "half a line" in both, both[-3:]
    assert sorted(both) == sorted(done.lines["stdout"] + done.lines["stderr"])


@pytest.mark.slow
def test_without_a_terminal_the_job_gets_pipes(tmp_path: Path) -> None:
    done = Captured(
        tmp_path, "import sys; print(sys.stdout.isatty(), sys.stderr.isatty())", pty=False
    ).run()
    assert (done.returncode, done.lines["stdout"]) == (0, ["False False"])


def test_a_job_killed_by_a_signal_says_so(tmp_path: Path) -> None:
    done = Captured(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)").run()
    assert done.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_files_that_cannot_be_written_cost_the_job_nothing(tmp_path: Path) -> None:
    """A full state dir (writes fail) or a broken one (the file cannot be made): the job
    runs on and sentinel still gets every line."""
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (attempt / "stdout.log").symlink_to("/dev/full")  # every write: ENOSPC
    (attempt / "stderr.log").mkdir()  # cannot be opened as a file
    done = Captured(
        tmp_path,
        """
        import sys
        for step in range(50):
            print(f"step {step}")
            print(f"warn {step}", file=sys.stderr)
        """,
    ).run()
    assert done.returncode == 0
    assert done.lines == {  # one terminal for both streams
        "stdout": [line for n in range(50) for line in (f"step {n}", f"warn {n}")],
        "stderr": [],
    }


def test_a_command_that_cannot_start_is_an_oserror(tmp_path: Path) -> None:
    relay = RelayedStart(tmp_path / "attempt", pty=True)
    with pytest.raises(FileNotFoundError):
        relay.start([str(tmp_path / "no-such-program")], ENV)


@pytest.mark.slow
def test_two_ranks_on_one_terminal_never_glue_their_lines(tmp_path: Path) -> None:
    """torchrun's ranks share the job's stdout: a line is one write on a terminal."""
    done = Captured(
        tmp_path,
        """
        import subprocess, sys
        rank = '''
        import sys
        r = sys.argv[1]
        for step in range(400):
            print(f"[rank{r}] step {step} | loss {10 ** int(r) * 2.5:.4f} | tokens/s 5050")
        '''.replace("\\n        ", "\\n")
        ranks = [subprocess.Popen([sys.executable, "-c", rank, str(r)]) for r in (0, 1)]
        sys.exit(max(p.wait() for p in ranks))
        """,
    ).run()
    assert done.returncode == 0
    whole = re.compile(r"\[rank[01]\] step \d+ \| loss \d+\.\d{4} \| tokens/s 5050")
    glued = [line for line in done.lines["stdout"] if not whole.fullmatch(line)]
    assert glued == []
    assert len(done.lines["stdout"]) == 800


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[RelayedStart, object, Path]]:
    """A job under a relay that writes a numbered line every 20 ms until ``stop`` appears,
    then ``loss nan`` if ``nan`` appeared meanwhile; its relay started by this test."""
    code = textwrap.dedent(
        """
        import os, sys, time
        stop, nan = os.path.join(sys.argv[1], "stop"), os.path.join(sys.argv[1], "nan")
        step = 0
        while not os.path.exists(stop):
            step += 1
            print(f"step {step} loss {'nan' if os.path.exists(nan) else 1.0}")
            time.sleep(0.02)
        """
    )
    relay = RelayedStart(tmp_path / "attempt", pty=True)
    process = relay.start([sys.executable, "-c", code, str(tmp_path)], ENV)
    yield relay, process, tmp_path
    (tmp_path / "stop").touch()
    relay.returncode(process.wait(10))  # type: ignore[attr-defined]
    for pipe in (process.stdout, process.stderr):  # type: ignore[attr-defined]
        pipe.close()


@pytest.mark.slow
def test_the_job_outlives_its_reader_and_is_adopted_from_the_files(
    writer: tuple[RelayedStart, object, Path],
) -> None:
    relay, process, work = writer
    stdout = process.stdout  # type: ignore[attr-defined]
    read = b""
    while read.count(b"\n") < 5:
        read += os.read(stdout.fileno(), 1 << 16)
    # Sentinel dies: its ends close. The relay notes how far it had read, at once.
    stdout.close()
    process.stderr.close()  # type: ignore[attr-defined]
    attempt = relay.directory
    deadline = time.monotonic() + 5
    while not (attempt / DETACHED).exists():
        assert time.monotonic() < deadline, "the relay did not see sentinel go"
        time.sleep(0.02)
    detached = json.loads((attempt / DETACHED).read_text())
    assert detached["read"]["stdout"] == len(read)
    # What the dead reader was sent lately it may not have handed on: read again.
    assert 0 <= detached["resume"]["stdout"] < len(read)
    # The job goes on writing, to the file now, never blocked nor killed.
    size = (attempt / "stdout.log").stat().st_size
    time.sleep(0.3)
    assert (attempt / "stdout.log").stat().st_size > size
    assert process.poll() is None  # type: ignore[attr-defined]

    record = JobRecord(
        1, attempt, ProcessIdentity.of(relay.relay_pid), ProcessIdentity.of(relay.job_pid),
        ["job"], time.time(),
    )  # fmt: skip
    lines: list[str] = []
    ended: list[int | None] = []
    adopted = AdoptedJob(
        record,
        on_lines=lambda source, new, at, marks: lines.extend(new),
        on_exit=ended.append,
        stdout=None,
        stderr=None,
    )
    adopted.start()
    assert adopted.identity == record.job
    # From a little before where the dead reader had read (whole lines), none lost.
    last_read = int(read.splitlines()[-1].split()[1])
    deadline = time.monotonic() + 10
    while not lines:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first = int(lines[0].split()[1])
    assert 1 <= first <= last_read
    assert lines[0] == f"step {first} loss 1.0"
    (work / "nan").touch()
    while not any("nan" in line for line in lines):
        assert time.monotonic() < deadline, lines[-3:]
        time.sleep(0.02)
    (work / "stop").touch()
    assert adopted.wait(10)
    assert ended == [0]
    steps = [int(line.split()[1]) for line in lines]
    assert steps == list(range(first, first + len(steps)))


@pytest.mark.slow
@pytest.mark.parametrize("pty", [True, False], ids=["terminal", "pipes"])
def test_the_relay_sends_a_busy_job_a_window_at_a_time_and_a_nan_at_once(
    tmp_path: Path, pty: bool
) -> None:
    """At 200 lines a second and one-second windows, sentinel gets a few reads, not a read
    a line; the read that holds the NaN ends a look after it, not at its window's end."""
    code = textwrap.dedent(
        """
        import time
        for step in range(1, 301):
            print(f"step {step} loss {'nan' if step == 150 else 1.0}", flush=True)
            time.sleep(0.005)
        """
    )
    relay = RelayedStart(tmp_path / "attempt", pty=pty)
    process = relay.start([sys.executable, "-c", code], ENV, batch_s=1.0, look_s=0.02)
    reads: list[bytes] = []
    while chunk := os.read(process.stdout.fileno(), 1 << 16):  # type: ignore[union-attr]
        reads.append(chunk)
    assert relay.returncode(process.wait(10)) == 0
    process.stdout.close()  # type: ignore[union-attr]
    process.stderr.close()  # type: ignore[union-attr]
    assert b"".join(reads) == (tmp_path / "attempt" / "stdout.log").read_bytes()
    assert b"".join(reads).count(b"\n") == 300
    assert len(reads) < 30  # about 300 lines at 200 a second: 3 windows, the NaN, the end
    with_nan = next(read for read in reads if b"loss nan" in read)
    after = with_nan.split(b"loss nan\n", 1)[1]
    assert after.count(b"\n") < 100  # a window holds about 200


@pytest.mark.parametrize(("columns", "rows"), [(0, 0), (132, 40)])
def test_the_jobs_terminal_is_sentinels_size_or_the_default_when_it_has_none(
    monkeypatch: pytest.MonkeyPatch, columns: int, rows: int
) -> None:
    """A terminal that reports no size (``script`` to a file: 0 x 0) would give the job a
    0-column terminal, on which tqdm draws nothing."""
    master, slave = os.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        with os.fdopen(os.dup(slave), "w") as own:
            monkeypatch.setattr(sys, "__stdout__", own)
            size = terminal_size()
    finally:
        os.close(master)
        os.close(slave)
    assert size == ((columns, rows) if columns else (DEFAULT_COLUMNS, DEFAULT_ROWS))
