"""``sentinel replay`` of a log that ends where the job died: a log holds no exit status, so
its end is what says so. A Python traceback, or NCCL's watchdog timeout, as its last words is
a ``job_crash`` warning with the crash's class, as ``watch`` says of a job it did not start.
Three real published logs (an OOM, two NCCL timeouts) used to replay to nothing at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.engine.replay import replay
from sentinel.model.records import Severity
from tests.helpers.cli import sentinel_here
from tests.helpers.env import clean_env

LOGS = Path(__file__).parent / "fixtures" / "crash_logs"

OOM = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 88, in <module>\n'
    "    loss.backward()\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
)


def crashes(path: Path) -> list[tuple[Severity, str, str]]:
    result = replay([path], load_settings(None, environ={}))
    return [
        (alert.severity, alert.details["class"], alert.message)
        for alert in result.alerts
        if alert.rule == "job_crash"
    ]


@pytest.mark.parametrize(
    ("log", "crash_class", "evidence"),
    [
        ("uctransnet_oom.log", "oom", "RuntimeError: CUDA out of memory"),
        ("nemo_nccl_watchdog.log", "distributed", "[Rank 7] Watchdog caught collective"),
        # Its poster's paste ends inside the watchdog's line, glued after a tqdm redraw.
        ("llamafactory_nccl_timeout.log", "distributed", "[rank5]:[E602 11:17:52"),
    ],
)
def test_a_real_log_that_ends_on_a_crash_says_so(log: str, crash_class: str, evidence: str) -> None:
    [(severity, found, message)] = crashes(LOGS / log)
    assert (severity, found) == (Severity.WARNING, crash_class)
    assert message.startswith(f"the log ends on an error: likely a crash, {crash_class} (")
    assert evidence in message


@pytest.mark.parametrize("stamped", [False, True], ids=["json-lines", "stamped-lines"])
def test_a_log_with_no_clock_is_judged_by_its_end_too(tmp_path: Path, stamped: bool) -> None:
    """JSON lines name no time: the output hooks never ran on them, and the crash
    classifier's own tail stayed empty. The end is judged from the lines replay read."""
    lines = [
        f"2026-11-29 10:00:{step:02d} step {step} loss {2 - step / 100:.3f}"
        if stamped
        else json.dumps({"step": step, "loss": 2 - step / 100})
        for step in range(1, 51)
    ]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n" + OOM)
    [(severity, crash_class, message)] = crashes(log)
    assert (severity, crash_class) == (Severity.WARNING, "oom")
    assert "torch.OutOfMemoryError: CUDA out of memory" in message


def test_a_traceback_the_run_went_on_after_is_no_crash(tmp_path: Path) -> None:
    """An exception printed and caught mid-run (a skipped batch), training going on after
    it: the log's end is healthy."""
    before = [json.dumps({"step": step, "loss": 2.0}) for step in range(1, 21)]
    after = [json.dumps({"step": step, "loss": 1.9}) for step in range(21, 41)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(before) + "\n" + OOM + "\n".join(after) + "\n")
    assert crashes(log) == []


def test_replay_fail_on_warning_exits_1_on_a_log_that_ends_on_a_crash(tmp_path: Path) -> None:
    result = sentinel_here(
        "replay", "--fail-on", "warning", str(LOGS / "uctransnet_oom.log"),
        cwd=tmp_path, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "warning job_crash: the log ends on an error: likely a crash, oom" in result.stdout


@pytest.mark.parametrize(
    "last",
    [
        "Killed",  # bash, the job in the foreground (a stable-baselines3 run's paste)
        "./train.sh: line 3: 48213 Killed                  python train.py --env Breakout",
    ],
)
def test_a_log_that_ends_in_the_shells_killed_is_an_oom_kill(tmp_path: Path, last: str) -> None:
    lines = [json.dumps({"step": step, "loss": 2 - step / 100}) for step in range(1, 51)]
    log = tmp_path / "train.log"
    log.write_text("\n".join([*lines, last]) + "\n")
    [(severity, crash_class, message)] = crashes(log)
    assert (severity, crash_class) == (Severity.WARNING, "oom")
    assert message == f"the log ends on an error: likely a crash, oom ({last})"


@pytest.mark.parametrize("last", ["Killed 3 stale workers, training on", "Process killed: no"])
def test_killed_in_a_sentence_is_no_kill(tmp_path: Path, last: str) -> None:
    lines = [json.dumps({"step": step, "loss": 2 - step / 100}) for step in range(1, 51)]
    log = tmp_path / "train.log"
    log.write_text("\n".join([*lines, last]) + "\n")
    assert crashes(log) == []


def test_a_log_that_ends_on_torchruns_sigterm_was_stopped_not_crashed(tmp_path: Path) -> None:
    """OLMo under torchrun, stopped from outside: its log ends on the elastic agent's
    SignalException (and an NCCL teardown would say "distributed", which it is not)."""
    lines = [json.dumps({"step": step, "loss": 3.0}) for step in range(1, 51)]
    tail = [
        "Traceback (most recent call last):",
        '  File "api.py", line 85, in _terminate_process_handler',
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 9724 got"
        " signal: 15",
    ]
    log = tmp_path / "train.log"
    log.write_text("\n".join([*lines, *tail]) + "\n")
    [(severity, crash_class, message)] = crashes(log)
    assert (severity, crash_class) == (Severity.WARNING, "terminated")
    assert "stopped from outside, not a crash" in message


def test_replay_of_a_file_it_reads_nothing_from_says_so(tmp_path: Path) -> None:
    """An RL run's progress CSV whose columns none of sentinel's names are: 4,720 lines, 0
    samples, and no word of it; a NaN in it would go by in silence."""
    log = tmp_path / "progress.csv"
    log.write_text("episode;time;reward\n1;0.5;-21\n2;0.6;-20\n")
    result = sentinel_here("replay", str(log), cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert "no metric was read from 3 lines" in result.stderr
    assert "[parsers] regexes" in result.stderr
