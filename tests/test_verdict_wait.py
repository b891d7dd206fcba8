"""``sentinel verdict [--wait]``: the final code, or the job's own status when none will come.

A sentinel is "alive" while something holds the state dir's lock: here the test
itself (a flock taken on another descriptor conflicts within one process too), or
a real writer process that a test kills with SIGKILL.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sentinel.service import verdict_wait
from sentinel.service.verdict_wait import HOLDER_CHECK_S, await_verdict
from sentinel.store.lock import acquire
from sentinel.store.verdict import clear, mark_deciding, write_final
from tests.helpers.env import clean_env

ROOT = Path(__file__).resolve().parent.parent
NOW = 1_764_100_000.0

# A stand-in for sentinel: holds the lock, marks deciding, says so, and after DELAY writes
# the final CODE (none when CODE is "-"), then lingers LINGER seconds.
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sentinel.store.lock import acquire
    from sentinel.store.verdict import clear, mark_deciding, write_final
    state, code = Path(sys.argv[1]), sys.argv[2]
    delay, linger = float(sys.argv[3]), float(sys.argv[4])
    lock = acquire(state)
    mark_deciding(state, rule="nan_inf", step=40, attempt=1, time=time.time())
    print("deciding", flush=True)
    time.sleep(delay)
    if code != "-":
        write_final(state, int(code), None, "nan_inf", 40, state / "ckpt", 1, time.time())
    time.sleep(linger)
    """
)


def later(delay_s: float, action: object) -> threading.Timer:
    assert callable(action)
    timer = threading.Timer(delay_s, action)
    timer.start()
    return timer


def test_a_final_record_is_the_answer_at_once(tmp_path: Path) -> None:
    write_final(tmp_path, 91, None, "nan_inf", 40, None, 1, NOW)
    outcome = await_verdict(tmp_path, wait=False, job_status=143)
    assert (outcome.code, outcome.reason) == (91, "")
    assert outcome.record is not None and outcome.record.rule == "nan_inf"


def test_without_wait_no_final_record_is_the_job_status_else_1(tmp_path: Path) -> None:
    mark_deciding(tmp_path, rule="nan_inf", step=40, attempt=1, time=NOW)
    outcome = await_verdict(tmp_path, wait=False, job_status=143)
    assert (outcome.code, outcome.record) == (143, None)
    assert "sentinel is still deciding" in outcome.reason
    assert await_verdict(tmp_path / "none", wait=False).code == 1


@pytest.mark.slow
def test_wait_returns_the_code_written_while_it_waits(tmp_path: Path) -> None:
    with acquire(tmp_path):
        mark_deciding(tmp_path, rule="nan_inf", step=40, attempt=1, time=NOW)
        written_at: list[float] = []

        def write() -> None:
            write_final(tmp_path, 90, None, "nan_inf", 40, None, 2, NOW)
            written_at.append(time.monotonic())

        start = time.monotonic()  # before the timer's 0.3 s begin, so they bound the wait
        timer = later(0.3, write)
        outcome = await_verdict(tmp_path, wait=True, timeout_s=30, job_status=143)
        returned_at = time.monotonic()
        timer.join()
    assert outcome.code == 90 and outcome.record is not None and outcome.record.attempt == 2
    assert returned_at - start >= 0.3
    # The file event wakes it, not the lock's check every HOLDER_CHECK_S.
    assert returned_at - written_at[0] < HOLDER_CHECK_S * 0.6


@pytest.mark.slow
def test_wait_ends_at_the_timeout_with_the_job_status(tmp_path: Path) -> None:
    with acquire(tmp_path):
        mark_deciding(tmp_path, rule="nan_inf", step=40, attempt=1, time=NOW)
        start = time.monotonic()
        outcome = await_verdict(tmp_path, wait=True, timeout_s=0.4, job_status=143)
        took = time.monotonic() - start
    assert (outcome.code, outcome.record) == (143, None)
    assert 0.4 <= took < 2.0
    assert outcome.reason == (
        f"no final verdict in {tmp_path} within 0.4 s; exit with the job's status 143"
    )


@pytest.mark.slow
def test_a_stop_left_deciding_is_given_the_grace_to_be_taken_up_then_the_job_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sentinel deciding died (its lock free, the record still "deciding"): the next
    one is given ``TAKE_UP_GRACE_S`` to take the stop up before the wait gives up. It used
    to end at once with the job's status: the wrapper relaunched the job from the checkpoint
    the rollback was to set aside (a sentinel SIGKILLed during a stop, restarted 10 s
    later)."""
    monkeypatch.setattr(verdict_wait, "TAKE_UP_GRACE_S", 1.5)
    lock = acquire(tmp_path)
    mark_deciding(tmp_path, rule="nan_inf", step=40, attempt=1, time=NOW)
    timer = later(0.2, lock.release)
    start = time.monotonic()
    outcome = await_verdict(tmp_path, wait=True, timeout_s=30)
    took = time.monotonic() - start
    timer.join()
    assert (outcome.code, outcome.record) == (1, None)
    assert 0.2 + 1.5 <= took < 0.2 + 1.5 + HOLDER_CHECK_S + 1.0
    assert "is gone, and none took up its stop" in outcome.reason
    assert "no job status given" in outcome.reason
    # Taken up within the grace: the next sentinel's final record is the answer.
    mark_deciding(tmp_path, rule="nan_inf", step=40, attempt=1, time=NOW)

    def take_up() -> None:
        with acquire(tmp_path):
            write_final(tmp_path, 91, None, "nan_inf", 40, None, 1, NOW)

    timer = later(1.0, take_up)
    assert await_verdict(tmp_path, wait=True, timeout_s=30, job_status=143).code == 91
    timer.join()


@pytest.mark.slow
def test_a_record_written_just_before_sentinel_exits_is_still_the_answer(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    mark_deciding(tmp_path, rule="gpu_health", step=None, attempt=1, time=NOW)

    def decide_and_exit() -> None:
        write_final(tmp_path, 92, None, "gpu_health", None, None, 1, NOW)
        lock.release()

    timer = later(0.2, decide_and_exit)
    outcome = await_verdict(tmp_path, wait=True, job_status=1)
    timer.join()
    assert outcome.code == 92


def sentinel_verdict(
    state: Path, *args: str, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "verdict", "--state-dir", str(state), *args],
        capture_output=True, text=True, env=env, timeout=timeout_s, cwd=ROOT, check=False,
    )  # fmt: skip


def writer(state: Path, code: str, delay_s: float, linger_s: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(state), code, str(delay_s), str(linger_s)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert process.stdout is not None and process.stdout.readline() == "deciding\n"
    return process


def waiting_verdict(state: Path, *, timeout_s: float, job_status: int) -> subprocess.Popen[str]:
    """The wrapper's ``sentinel verdict --wait``, as a process that waits."""
    return subprocess.Popen(
        [sys.executable, "-m", "sentinel", "verdict", "--state-dir", str(state), "--wait",
         "--timeout", f"{timeout_s:g}", "--job-status", str(job_status)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip


def end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


@pytest.mark.slow
def test_the_verb_waits_for_a_real_writer_and_exits_with_its_code(tmp_path: Path) -> None:
    process = writer(tmp_path / "st", "91", delay_s=1.0, linger_s=5.0)
    try:
        start = time.monotonic()
        result = sentinel_verdict(
            tmp_path / "st", "--wait", "--timeout", "30", "--job-status", "143"
        )
        took = time.monotonic() - start
    finally:
        end(process)
    assert (result.returncode, result.stdout) == (91, "91\n"), result.stderr
    assert 0.5 < took < 10


@pytest.mark.slow
def test_the_verb_after_kill_9_of_sentinel_exits_with_the_job_status(tmp_path: Path) -> None:
    """No sentinel takes the stop up within the wait's bound: the job's own status."""
    process = writer(tmp_path / "st", "-", delay_s=60, linger_s=0)
    try:
        waiting = waiting_verdict(tmp_path / "st", timeout_s=3, job_status=137)
        time.sleep(1.0)
        assert waiting.poll() is None  # sentinel is deciding: it waits (no timeout given)
        os.kill(process.pid, signal.SIGKILL)
        out, err = waiting.communicate(timeout=30)
    finally:
        end(process)
    assert (waiting.returncode, out) == (137, "")
    assert err == (
        f"sentinel verdict: the sentinel deciding on {tmp_path / 'st'} is gone, and none took"
        " up its stop (the rollback may not be done); exit with the job's status 137\n"
    )


@pytest.mark.slow
def test_the_verb_waits_for_the_sentinel_that_takes_up_a_dead_ones_stop(tmp_path: Path) -> None:
    """A sentinel SIGKILLed while deciding, another started a second later (systemd's
    RestartSec): the wrapper waits for it and gets its 91, not the job's 143."""
    first = writer(tmp_path / "st", "-", delay_s=60, linger_s=0)
    second: subprocess.Popen[str] | None = None
    try:
        waiting = waiting_verdict(tmp_path / "st", timeout_s=60, job_status=143)
        time.sleep(0.5)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        time.sleep(1.0 + HOLDER_CHECK_S)
        assert waiting.poll() is None, "a dead sentinel's stop is waited for"
        second = writer(tmp_path / "st", "91", delay_s=0.5, linger_s=2)
        out, err = waiting.communicate(timeout=30)
    finally:
        for process in (first, second):
            if process is not None:
                end(process)
    assert (waiting.returncode, out) == (91, "91\n"), err


@pytest.mark.slow
def test_the_two_line_wrapper_without_sentinel_exits_with_the_job_status(tmp_path: Path) -> None:
    wrapper = (
        f"{sys.executable} -c 'raise SystemExit(3)'; status=$?;"
        f" exec {sys.executable} -m sentinel verdict --state-dir {tmp_path / 'st'}"
        " --wait --timeout 120 --job-status $status"
    )
    result = subprocess.run(
        ["sh", "-c", wrapper], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert result.returncode == 3, result.stderr


@pytest.mark.slow
def test_timeout_without_wait_is_a_usage_error(tmp_path: Path) -> None:
    from sentinel.cli import main as cli

    assert cli.main(["verdict", "--state-dir", str(tmp_path), "--timeout", "5"]) == 2


def test_without_a_deciding_mark_the_jobs_own_status_comes_at_once(tmp_path: Path) -> None:
    """The job ended by itself (sentinel marks deciding before any signal): no verdict comes,
    so the wrapper must not wait for one, even while a sentinel holds the state dir."""
    lock = acquire(tmp_path)
    try:
        start = time.monotonic()
        outcome = await_verdict(tmp_path, wait=True, timeout_s=30, job_status=3)
    finally:
        lock.release()
    assert (outcome.code, outcome.record) == (3, None)
    assert time.monotonic() - start < 1.0
    assert "sentinel did not stop the job" in outcome.reason
    assert "nobody may have watched it" not in outcome.reason, "a sentinel holds it"
    # With none holding the state dir (`watch --pid` ended with the attempt before), "did
    # not stop it" read as a clean bill of health for a run that trained on NaN unwatched.
    alone = await_verdict(tmp_path, wait=True, timeout_s=30, job_status=0)
    assert alone.code == 0 and "(no sentinel holds" in alone.reason, alone.reason
    assert "nobody may have watched it" in alone.reason


def _unreadable(state: Path) -> list[str]:
    """``state`` made unreadable to the verb, as another user's 0700 folder is: mode 000, and
    when the tests run as root (whose capabilities read any folder), the verb run under
    ``setpriv`` without any capability, so the permission bits apply to it too."""
    state.chmod(0o000)
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv is not None, "util-linux's setpriv drops root's capabilities here"
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all"]


@pytest.mark.slow
def test_an_unreadable_state_dir_is_94_never_the_job_status(tmp_path: Path) -> None:
    """A wrapper that cannot read the state dir must not turn a give-up into a restart."""
    state = tmp_path / "st"
    state.mkdir()
    write_final(state, 90, None, "nan_inf", 40, None, 1, NOW)
    prefix = _unreadable(state)
    try:
        result = subprocess.run(
            [*prefix, sys.executable, "-m", "sentinel", "verdict", "--state-dir", str(state),
             "--wait", "--timeout", "5", "--job-status", "143"],
            capture_output=True, text=True, env=clean_env(), cwd=ROOT, timeout=60,
        )  # fmt: skip
    finally:
        state.chmod(0o700)
    assert result.returncode == 94, result.stderr
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"cannot read {state / 'verdict.json'}: Permission denied" in result.stderr
    assert "did not stop the job" not in result.stderr


def test_a_corrupt_record_is_94_saying_what_could_not_be_read(tmp_path: Path) -> None:
    (tmp_path / "verdict.json").write_text('{"state": "final", "code": 90')
    outcome = await_verdict(tmp_path, wait=True, timeout_s=1, job_status=143)
    assert outcome.code == 94
    assert f"{tmp_path / 'verdict.json'} is not a verdict record" in outcome.reason


@pytest.mark.slow
def test_a_verdict_taken_by_the_next_attempt_is_reported_as_such(tmp_path: Path) -> None:
    write_final(tmp_path, 91, None, "nan_inf", 40, None, 1, NOW)
    clear(tmp_path)  # attempt 2 started
    result = sentinel_verdict(tmp_path, "--job-status", "143")
    assert result.returncode == 143
    assert "did not stop the job" not in result.stderr
    assert "sentinel's last one (91 rolled_back, nan_inf at step 40, attempt 1) was taken by" in (
        result.stderr
    )


@pytest.mark.parametrize("recipe", [["--wait"], ["--wait", "--timeout", "5", "--job-status", "0"]])
def test_the_docs_wrapper_line_without_state_dir_reads_the_default_one(
    tmp_path: Path, recipe: list[str]
) -> None:
    """The wrappers of docs/watch.md call ``sentinel verdict --wait`` with no
    ``--state-dir``: the verb's own ``--wait`` flag was read as ``watch --wait S`` ("must be
    a number, not true"), exit 2, and every verdict was lost. It reads ``.sentinel``."""
    from tests.helpers.cli import sentinel_here

    write_final(tmp_path / ".sentinel", 91, None, "nan_inf", 40, None, 1, NOW)
    result = sentinel_here("verdict", *recipe, cwd=tmp_path, env=clean_env())
    assert (result.returncode, result.stdout.strip()) == (91, "91"), result.stderr


def test_a_91_handed_on_by_a_wait_is_not_handed_to_the_next_attempts_wrapper(
    tmp_path: Path,
) -> None:
    """The wrapper's ``verdict --wait`` takes the 91 it hands on: the relaunch that follows
    is the next attempt. A sentinel that cannot see that attempt (``watch --pid``, or none
    left) left it in place, and the wrapper of the relaunch that finished got the same 91
    and relaunched a finished job, again and again (an out-of-sample run, five times)."""
    write_final(tmp_path, 91, None, "nan_inf", 40, None, 1, NOW)
    assert await_verdict(tmp_path, wait=True, timeout_s=5, job_status=143).code == 91
    after = await_verdict(tmp_path, wait=True, timeout_s=5, job_status=0)
    assert (after.code, after.record) == (0, None)
    assert "sentinel's last one (91 rolled_back, nan_inf at step 40, attempt 1) was taken" in (
        after.reason
    )


@pytest.mark.parametrize("code", [90, 92])
def test_a_give_up_or_node_fault_stays_after_a_wait_and_a_plain_read_takes_nothing(
    tmp_path: Path, code: int
) -> None:
    """Nobody relaunches the job after a 90 or a 92 here, and ``sentinel checkpoints`` reads
    the record for the saves the stop left poisoned: it stays. A read without ``--wait``
    (a person, a script checking) takes no record, a 91 neither."""
    write_final(tmp_path, code, None, "nan_inf", 40, None, 1, NOW)
    for _ in range(2):
        assert await_verdict(tmp_path, wait=True, timeout_s=5, job_status=0).code == code
    write_final(tmp_path, 91, None, "nan_inf", 40, None, 1, NOW)
    for _ in range(2):
        assert await_verdict(tmp_path, wait=False, job_status=0).code == 91
    assert (tmp_path / "verdict.json").is_file()


def test_a_record_nested_too_deep_is_94_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "verdict.json").write_text("[" * 100_000 + "]" * 100_000)
    outcome = await_verdict(tmp_path, wait=False, job_status=0)
    assert outcome.code == 94 and "nested too deep" in outcome.reason
