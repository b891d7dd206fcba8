"""``sentinel run`` killed with SIGKILL: the job runs on; a restarted ``sentinel run`` adopts it.

A real ``kill -9`` of a real ``sentinel run``; the job is a real process that never
learns its watchdog died (its terminal is the relay's, not sentinel's).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.config import Settings
from sentinel.process.adopted import AdoptedJob
from sentinel.supervisor.holders import Child
from sentinel.supervisor.restarts import Restarts
from tests.helpers.env import clean_env

JOB = textwrap.dedent(
    """
    import os, signal, sys, time
    work = sys.argv[1]
    def on_term(signum, frame):
        open(os.path.join(work, "stopped"), "w").write("SIGTERM\\n")
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(work, "starts"), "a") as starts:
        starts.write(f"{os.getpid()}\\n")
    step = 0
    while True:
        step += 1
        nan = os.path.exists(os.path.join(work, "nan"))
        print(f"\\x1b[32mstep {step}\\x1b[0m | loss {'nan' if nan else 2.0 - step / 1000}")
        print(f"step {step} done", file=sys.stderr)
        time.sleep(0.05)
    """
)
DEADLINE_S = 30.0


def wait_for(what: str, check: object) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.05)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "job.py").write_text(JOB)
    yield tmp_path
    starts = tmp_path / "starts"
    for pid in starts.read_text().split() if starts.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)  # the test's own job, if a check failed


def sentinel_run(work: Path, name: str) -> subprocess.Popen[bytes]:
    env = clean_env()
    with open(work / f"{name}.out", "wb") as out, open(work / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sentinel",
                "run",
                "--state-dir",
                str(work / "state"),
                "--max-restarts",
                "0",
                "--",
                sys.executable,
                str(work / "job.py"),
                str(work),
            ],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )


@pytest.mark.slow
def test_a_killed_sentinel_leaves_the_job_running_and_the_next_one_adopts_it(work: Path) -> None:
    first = sentinel_run(work, "first")
    current = work / "state" / "job" / "current.json"
    wait_for("job", lambda: current.exists() and (work / "first.out").read_text().count("\n") > 3)
    record = json.loads(current.read_text())
    job_pid = record["job"][0]
    assert (current.parent / "job.pid").read_text() == f"{job_pid}\n"  # for watch --pidfile
    stdout_log = Path(record["directory"]) / "stdout.log"

    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL

    # The job never noticed: it runs on and writes on, into the relay's file.
    size = stdout_log.stat().st_size
    wait_for("output after the kill", lambda: stdout_log.stat().st_size > size + 100)
    os.kill(job_pid, 0)
    assert not (work / "stopped").exists()

    second = sentinel_run(work, "second")
    try:
        wait_for("adoption", lambda: "adopted the job" in (work / "second.err").read_text())
        lines = (work / "second.out").read_text
        wait_for("the adopted job's output", lambda: lines().count("\n") > 2)
        (work / "nan").touch()
        assert second.wait(DEADLINE_S) == 143, (work / "second.err").read_text()
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert (work / "stopped").read_text() == "SIGTERM\n"
    assert (work / "starts").read_text().split() == [str(job_pid)], "one job, never a second"
    alerts = [
        json.loads(line)
        for line in (work / "state" / "alerts.jsonl").read_text().split("\n")
        if line
    ]
    nan = [alert for alert in alerts if alert["rule"] == "nan_inf"]
    assert nan and nan[0]["metric"] == "loss", alerts

    # Its output passed through the second sentinel from a little before where the first
    # had read (what the first had not handed on yet is read again), none lost between.
    def steps(name: str) -> list[int]:
        text = (work / name).read_text().replace("\x1b[32m", "").replace("\x1b[0m", "")
        # The job's terminal is one for both streams: its "step N done" on stderr is there too.
        return [
            int(line.split()[1])
            for line in text.splitlines()
            if line.startswith("step") and "| loss" in line
        ]

    first, second_steps = steps("first.out"), steps("second.out")
    assert second_steps[0] <= first[-1] + 1
    assert second_steps == list(range(second_steps[0], second_steps[0] + len(second_steps)))


@pytest.mark.slow
def test_an_adopted_job_keeps_the_restart_budget_it_was_started_under(tmp_path: Path) -> None:
    """The second sentinel takes the job's attempt as it was: a job started as restart 2
    leaves one restart of three, not three more."""
    state = tmp_path / "state"
    settings = Settings(state_dir=state)
    first = Restarts(settings.job, None, relaunches=True)
    first.from_state({"restarts.count": "2", "restarts.resume": '["/ckpt/step_10", 10]'})
    child = Child([sys.executable, "-c", "import time; time.sleep(30)"], settings,
                  stdout=io.BytesIO(), stderr=io.BytesIO())  # fmt: skip
    events: list[tuple[str, object]] = []
    job = child.begin(1, first, events.append)
    try:
        second = Restarts(settings.job, None, relaunches=True)
        adopted = Child(["unused"], settings, stdout=io.BytesIO(), stderr=io.BytesIO())
        handle = adopted.begin(1, second, events.append)
        assert isinstance(handle, AdoptedJob)
        assert handle.pid == job.pid
        assert (second.count, second.resume.checkpoint, second.resume.step) == (
            2,
            "/ckpt/step_10",
            10,
        )
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        assert job.wait(10)
