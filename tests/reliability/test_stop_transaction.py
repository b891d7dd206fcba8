"""A stop is a transaction: sentinel SIGKILLed at each step of a stop and rollback, started
again on the same state dir, ends where it would have ended without the kill.

Real ``sentinel run`` processes, really killed (from outside, or at a kill point that
``killpoint.py`` injects around ``os.rename``/``os.replace``); a real job that saves
DeepSpeed-style checkpoints (``global_stepN`` folders and a ``latest`` pointer) every 5
steps and goes NaN at step 30. Each case checks the end state: the job that was stopped is
gone, nothing written at or after the NaN is left in place, the quarantine's manifest is
complete, the job resumed from the last clean checkpoint (never from scratch), the verdict
is final.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "deepspeed"
KILLPOINT = Path(__file__).with_name("killpoint.py")
DEADLINE_S = 60.0
NAN_AT = 30
CLEAN = "global_step25"

JOB = textwrap.dedent(
    """
    import json, os, shutil, signal, sys, time
    ck, fixture, record = sys.argv[1:4]
    on_term = os.environ.get("JOB_ON_TERM", "exit")
    resume = os.environ.get("SENTINEL_RESUME_FROM")
    start = int(os.path.basename(resume).removeprefix("global_step")) if resume else 0
    with open(record, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "resume_from": resume, "start": start}) + "\\n")
    if on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif on_term == "slow":
        def late_exit(signum, frame):
            time.sleep(1.5)  # a last save
            sys.exit(143)
        signal.signal(signal.SIGTERM, late_exit)
    for step in range(start + 1, 61):
        nan = resume is None and step >= NAN_AT
        # DeepSpeed's order: the save, then `latest`, then the step's log line (so that the
        # stop never races the save of the NaN's own step).
        if step % 5 == 0:
            tag = f"global_step{step}"
            shutil.copytree(os.path.join(fixture, "global_step40"), os.path.join(ck, tag))
            with open(os.path.join(ck, "latest"), "w") as pointer:
                pointer.write(tag)
            with open(record, "a") as out:
                out.write(json.dumps({"pid": os.getpid(), "saved": tag}) + "\\n")
        print(f"step {step} loss {'nan' if nan else 2.0 / step}", flush=True)
        time.sleep(0.05)
    while resume is None and on_term == "ignore":
        time.sleep(1)  # hung after its NaN: it runs until it is killed
    with open(record, "a") as out:
        out.write(json.dumps({"pid": os.getpid(), "finished": True}) + "\\n")
    """
).replace("NAN_AT", str(NAN_AT))


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "job.py").write_text(JOB)
    (tmp_path / "ck").mkdir()
    yield tmp_path
    for start in _records(tmp_path):
        with contextlib.suppress(ProcessLookupError, KeyError):
            os.kill(start["pid"], signal.SIGKILL)  # the test's own job, if a check failed


def _records(work: Path) -> list[dict[str, Any]]:
    path = work / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _readyz_until_ready(port: int) -> list[int]:
    """``/readyz``'s answers, from the first until the first 200."""
    answers: list[int] = []
    deadline = time.monotonic() + DEADLINE_S
    while not answers or answers[-1] != 200:
        assert time.monotonic() < deadline, f"not ready within {DEADLINE_S} s: {answers}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                answers.append(answer.status)
        except urllib.error.HTTPError as error:
            answers.append(error.code)
        except OSError:
            pass  # not serving yet
        time.sleep(0.05)
    return answers


def _sentinel(
    work: Path, name: str, *extra: str, killpoint: str = "none", **env: str
) -> subprocess.Popen[bytes]:
    environ = clean_env(
        KILLPOINT_AT=killpoint,
        SENTINEL_JOB__GRACE_PERIOD_S=env.pop("grace", "3"),
        SENTINEL_JOB__RESTART_BACKOFF_S=env.pop("backoff", "0.1"),
        **env,
    )
    argv = [
        sys.executable, str(KILLPOINT), "run", "--checkpoints", str(work / "ck"),
        "--state-dir", str(work / "state"), "--max-restarts", "2", *extra,
        "--", sys.executable, str(work / "job.py"), str(work / "ck"), str(FIXTURE),
        str(work / "record.jsonl"),
    ]  # fmt: skip
    with open(work / f"{name}.out", "wb") as out, open(work / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            argv, cwd=work, env=environ, stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )


def _verdict(work: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((work / "state" / "verdict.json").read_text()))
    except (OSError, ValueError):
        return {}


def _wait_for(what: str, check: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.02)


def _killed(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGKILL)
    assert process.wait(10) == -signal.SIGKILL


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: nothing reaps orphans on some machines)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_finished_as_without_the_kill(work: Path, second: subprocess.Popen[bytes]) -> None:
    err = lambda: (work / "second.err").read_text()  # noqa: E731
    assert second.wait(DEADLINE_S) == 0, err()
    starts = [r for r in _records(work) if "start" in r]
    assert [s["resume_from"] is None for s in starts] == [True, False], starts
    # Resumed from the last clean checkpoint, never from scratch.
    assert Path(starts[1]["resume_from"]).name == CLEAN, starts
    assert not _running(starts[0]["pid"]), "the stopped job still runs"
    assert any(r.get("finished") for r in _records(work))

    folders = list((work / "ck" / "quarantine").iterdir())
    assert len(folders) == 1, folders
    manifest = json.loads((folders[0] / ".sentinel-manifest.json").read_text())
    assert manifest["complete"] is True, manifest
    aside = {Path(item["origin"]).name for item in manifest["items"] if item["moved"]}
    assert f"global_step{NAN_AT}" in aside, manifest
    assert all(int(name.removeprefix("global_step")) >= NAN_AT for name in aside), aside
    for name in aside:
        assert (folders[0] / name).is_dir(), f"{name} is not in the quarantine"
    # Nothing poisoned is left in place: from step 30 on, each checkpoint there now is one
    # the resumed job saved after the rollback (it saves under the same names).
    resaved = {r.get("saved") for r in _records(work) if r.get("pid") == starts[1]["pid"]}
    for path in (work / "ck").glob("global_step*"):
        if int(path.name.removeprefix("global_step")) >= NAN_AT:
            assert path.name in resaved, f"{path.name} in place was not saved by the resumed job"
    assert [p.name for p in (work / "ck").glob(".sentinel-replace-*")] == []
    changes = [p for p in manifest["pointers"] if Path(p["path"]).name == "latest"]
    assert changes and changes[-1]["after"] == CLEAN, manifest["pointers"]

    record = _verdict(work)
    assert record["state"] == "final" and record["code"] == 91, record
    assert Path(record["resume_from"]).name == CLEAN
    assert "finishing what it decided" in err()


@pytest.mark.parametrize("on_term", ["ignore", "slow"])
def test_killed_during_the_grace_the_next_sentinel_stops_rolls_back_and_resumes(
    work: Path, on_term: str
) -> None:
    first = _sentinel(work, "first", JOB_ON_TERM=on_term, grace="4")
    _wait_for("the stop", lambda: "stop" in _verdict(work))
    _killed(first)
    stopped = _records(work)[0]["pid"]
    assert _running(stopped) or on_term == "slow", "the job should still run in its grace"

    port = _free_port()
    second = _sentinel(
        work, "second", "--http", f"127.0.0.1:{port}", JOB_ON_TERM=on_term, grace="4"
    )
    # Not ready while it finishes the last one's stop (the rest of the grace of a job that
    # ignores SIGTERM: seconds); ready once it has.
    answers = _readyz_until_ready(port)
    assert answers[0] == (503 if on_term == "ignore" else answers[0]), answers
    _assert_finished_as_without_the_kill(work, second)
    err = (work / "second.err").read_text()
    if on_term == "ignore":
        assert "SIGKILL" in err, err


def test_killed_during_the_grace_with_the_jobs_record_lost_no_copy_starts_beside_it(
    work: Path,
) -> None:
    """The record ``run`` adopts a job by is gone (a state dir restored from a backup, a
    write that failed): the next sentinel cannot adopt the job it finds stopping, and
    must not start the command beside it from scratch. It stops it by its pid and start
    time, then rolls back and resumes as planned."""
    first = _sentinel(work, "first", JOB_ON_TERM="ignore", grace="3")
    _wait_for("the stop", lambda: "stop" in _verdict(work))
    _killed(first)
    stopped = _records(work)[0]["pid"]
    assert _running(stopped), "the job should still run in its grace"
    (work / "state" / "job" / "current.json").unlink()

    second = _sentinel(work, "second", JOB_ON_TERM="ignore", grace="3")
    _assert_finished_as_without_the_kill(work, second)
    assert "no record to adopt it by" in (work / "second.err").read_text()


@pytest.mark.parametrize("killpoint", ["after-first-move", "before-pointer"])
def test_killed_in_the_middle_of_the_rollback_the_next_sentinel_finishes_it(
    work: Path, killpoint: str
) -> None:
    first = _sentinel(work, "first", killpoint=killpoint)
    assert first.wait(DEADLINE_S) == -signal.SIGKILL, (work / "first.err").read_text()
    assert f"killpoint {killpoint}" in (work / "first.err").read_text()
    if killpoint == "before-pointer":  # the moves are done, and the new pointer not renamed
        assert (work / "ck" / "latest").read_text() != CLEAN
        assert list((work / "ck").glob(".sentinel-replace-*"))

    second = _sentinel(work, "second")
    _assert_finished_as_without_the_kill(work, second)


def test_killed_during_the_backoff_the_next_sentinel_restarts_from_the_planned_checkpoint(
    work: Path,
) -> None:
    first = _sentinel(work, "first", backoff="60")
    _wait_for("the final verdict", lambda: _verdict(work).get("state") == "final")
    _killed(first)
    assert len([r for r in _records(work) if "start" in r]) == 1

    second = _sentinel(work, "second", backoff="60")
    _assert_finished_as_without_the_kill(work, second)


def test_a_stop_no_sentinel_could_finish_in_three_tries_gives_up_with_90(work: Path) -> None:
    # Every sentinel dies at the same point of the rollback: the one started, then 3 tries.
    for name in ("first", "try-1", "try-2", "try-3"):
        dying = _sentinel(work, name, killpoint="before-pointer")
        assert dying.wait(DEADLINE_S) == -signal.SIGKILL, (work / f"{name}.err").read_text()
    last = _sentinel(work, "last")
    err = (work / "last.err").read_text
    assert last.wait(DEADLINE_S) == 90, err()
    assert "3 sentinels started on the unfinished stop for nan_inf" in err(), err()
    assert "none finished it: giving up" in err()
    record = _verdict(work)
    assert record["state"] == "final" and record["code"] == 90, record
    # Never relaunched, least of all from scratch.
    assert len([r for r in _records(work) if "start" in r]) == 1


# The same job, started by someone else (a launcher that exits at once): it writes its pid and
# its log lines to files, for ``sentinel watch``.
WATCHED_JOB = JOB.replace(
    "for step in range(start + 1, 61):",
    "open(os.path.join(os.path.dirname(record), 'job.pid'), 'w').write(str(os.getpid()))\n"
    "sys.stdout = open(os.path.join(os.path.dirname(record), 'train.log'), 'a', buffering=1)\n"
    "for step in range(start + 1, 61):",
)


def _watch(work: Path, name: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "sentinel", "watch", "--pidfile", str(work / "job.pid"),
        "--log", str(work / "train.log"), "--checkpoints", str(work / "ck"),
        "--state-dir", str(work / "state"), "--max-restarts", "2",
    ]  # fmt: skip
    env = clean_env(SENTINEL_JOB__GRACE_PERIOD_S="4")
    with open(work / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=err,
        )  # fmt: skip


def test_watch_killed_during_the_grace_the_next_watch_stops_and_rolls_back(work: Path) -> None:
    from tests.helpers.detached import launch_detached

    (work / "job.py").write_text(WATCHED_JOB)
    job = launch_detached(
        ["env", "JOB_ON_TERM=ignore", sys.executable, str(work / "job.py"), str(work / "ck"),
         str(FIXTURE), str(work / "record.jsonl")]
    )  # fmt: skip
    first = _watch(work, "first")
    _wait_for("the stop", lambda: "stop" in _verdict(work))
    _killed(first)
    assert _running(job), "the job ignores SIGTERM: it runs on in its grace"

    second = _watch(work, "second")
    try:
        _wait_for("the final verdict", lambda: _verdict(work).get("state") == "final")
        _wait_for("the job's end", lambda: not _running(job))
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(DEADLINE_S) == 0, (work / "second.err").read_text()
    record = _verdict(work)
    assert record["code"] == 91 and Path(record["resume_from"]).name == CLEAN, record
    manifest = json.loads(
        next((work / "ck" / "quarantine").glob("*/.sentinel-manifest.json")).read_text()
    )
    assert manifest["complete"] is True
    assert (work / "ck" / "latest").read_text() == CLEAN
    said = (work / "second.err").read_text()
    assert "finishing what it decided" in said
    # One incident, the one taken back from the first sentinel's memory, holds the whole
    # stop: its timeline (and report) end on the rollback, as one sentinel's would.
    timeline = said.split("\nTimeline\n", 1)[1].split("\nResult:", 1)[0]
    assert "rolled back to global_step25" in timeline, said
    assert "another took it up" in timeline, said
    assert "attempt 1, pid" in said and "(attempt 2, pid" not in said, said


def test_a_relaunch_made_before_the_rollback_is_stopped_when_it_fails_and_rolled_back_again(
    work: Path,
) -> None:
    """The wrapper gave up waiting for the dead sentinel's stop (30 s) and relaunched the job,
    which resumed what the dir held then. The next sentinel took the stop up under it. It
    said the relaunch "resumed from global_step25" (it had not), kept the stop's incident
    open for it, so its NaN joined that incident and stopped nothing: it trained on NaN to
    its end, its saves left in place (an out-of-sample run, twice)."""
    from tests.helpers.detached import launch_detached

    slow = WATCHED_JOB.replace(
        "time.sleep(0.05)", "time.sleep(float(os.environ.get('STEP_S', '0.05')))"
    ).replace("nan = resume is None and", "nan = (resume is None or 'POISONED' in os.environ) and")
    (work / "job.py").write_text(slow)
    argv = [sys.executable, str(work / "job.py"), str(work / "ck"), str(FIXTURE),
            str(work / "record.jsonl")]  # fmt: skip
    first_job = launch_detached(["env", "JOB_ON_TERM=ignore", *argv])
    first = _watch(work, "first")
    _wait_for("the stop", lambda: "stop" in _verdict(work))
    _killed(first)
    os.kill(first_job, signal.SIGKILL)  # it ends; nobody rolled back
    _wait_for("its end", lambda: not _running(first_job))
    # The wrapper's relaunch resumes the newest save, the poisoned global_step30: NaN from
    # its first step on (31, 0.3 s a step).
    poisoned = f"SENTINEL_RESUME_FROM={work / 'ck' / 'global_step30'}"
    relaunch = launch_detached(["env", "STEP_S=0.3", "POISONED=1", poisoned, *argv])
    _wait_for("the relaunch's pid", lambda: (work / "job.pid").read_text() == str(relaunch))
    second = _watch(work, "second")
    try:
        _wait_for("the relaunch stopped", lambda: not _running(relaunch))
        _wait_for(
            "its verdict",
            lambda: _verdict(work).get("state") == "final" and _verdict(work).get("attempt") == 2,
        )
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(DEADLINE_S) == 0, (work / "second.err").read_text()
    said = (work / "second.err").read_text()
    record = _verdict(work)
    assert record["code"] == 91, (record, said)  # rolled back again, not given up as recurred
    assert Path(record["resume_from"]).name == CLEAN, record
    assert "relaunched before the rollback was done" in said, said
    assert f"resumed from {work / 'ck' / CLEAN}" not in said.split("second")[0], said
    assert not [p for p in (work / "ck").glob("global_step*") if int(p.name[11:]) >= NAN_AT]
