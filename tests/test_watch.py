"""``sentinel watch`` end to end: a job sentinel did not start, relaunched by someone else.

An orchestrator process (standing in for systemd's ``Restart=`` with
``RestartPreventExitStatus=90``, or a Kubernetes podFailurePolicy) runs the job
through the two-line wrapper of the README and relaunches it unless the wrapper
exits 0 or 90. It is started by a launcher that exits at once, so neither it nor the
job is sentinel's child. sentinel follows the job by its pidfile and its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

# Saves step_<N> every 10 steps (and step_25 right before its NaN), resumes from the
# newest step_* it finds: the "resume from latest" a plain script does.
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    run = Path(sys.argv[1]); ckpt = run / "ckpt"; ckpt.mkdir(parents=True, exist_ok=True)
    mode = sys.argv[2]  # "once", "always" or "never"
    (run / "job.pid.tmp").write_text(str(os.getpid()))
    os.replace(run / "job.pid.tmp", run / "job.pid")
    saved = sorted(int(p.name[5:]) for p in ckpt.glob("step_*"))
    start = saved[-1] if saved else 0
    attempt = len(list(run.glob("attempt-*"))) + 1
    (run / f"attempt-{attempt}").write_text(json.dumps({"pid": os.getpid(), "start": start}))
    with (run / "train.log").open("a") as log:
        for step in range(start + 1, 41):
            if step % 10 == 0 or step == 25:
                (ckpt / f"step_{step}").mkdir(exist_ok=True)
                (ckpt / f"step_{step}" / "state.json").write_text(json.dumps({"step": step}))
            bad = step == 25 and mode != "never" and (attempt == 1 or mode == "always")
            loss = float("nan") if bad else 2.0 - step / 100
            log.write(json.dumps({"step": step, "loss": loss}) + "\\n"); log.flush()
            time.sleep(60 if bad else 0.05 if mode != "never" else 1.0)
    """
)

ORCHESTRATOR = textwrap.dedent(
    """
    import json, subprocess, sys
    py, job, run, mode, state = sys.argv[1:6]
    wrapper = (f"{py} {job} {run} {mode}; status=$?; "
               f"exec {py} -m sentinel verdict --state-dir {state} --wait --timeout 60"
               " --job-status $status")
    codes = []
    for _ in range(4):
        codes.append(subprocess.call(["bash", "-c", wrapper]))
        (__import__("pathlib").Path(run) / "codes.json").write_text(json.dumps(codes))
        if codes[-1] in (0, 90):
            break
    """
)


def _launch_orchestrator(tmp_path: Path, mode: str, job: str = JOB) -> Path:
    """Start the orchestrator through a launcher that exits: the job is nobody's child here."""
    run, state = tmp_path / "run", tmp_path / "state"
    run.mkdir()
    (tmp_path / "job.py").write_text(job)
    (tmp_path / "orchestrator.py").write_text(ORCHESTRATOR)
    args = [sys.executable, str(tmp_path / "orchestrator.py"), sys.executable,
            str(tmp_path / "job.py"), str(run), mode, str(state)]  # fmt: skip
    launcher = (
        "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    subprocess.run([sys.executable, "-c", launcher, *args], check=True, timeout=30)
    return run


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _watch(tmp_path: Path, run: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sentinel", "watch", "--pidfile", str(run / "job.pid"),
         "--log", str(run / "train.log"), "--checkpoints", str(run / "ckpt"),
         "--state-dir", str(tmp_path / "state"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SENTINEL_JOB__GRACE_PERIOD_S": "5"},
    )  # fmt: skip


def _read_stderr(watch: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    """sentinel's stderr, line by line as it comes, into the list returned."""
    said: list[str] = []
    assert watch.stderr is not None
    stderr = watch.stderr
    reader = threading.Thread(target=lambda: said.extend(iter(stderr.readline, "")))
    reader.start()
    return said, reader


def _stop(watch: subprocess.Popen[str], reader: threading.Thread) -> None:
    """SIGTERM to sentinel, then its end and its pipes'."""
    watch.send_signal(signal.SIGTERM)
    watch.wait(timeout=30)
    reader.join()
    for pipe in (watch.stdout, watch.stderr):
        assert pipe is not None
        pipe.close()


def _wait_for(predicate: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_watch_rolls_back_writes_91_follows_attempt_2_and_gives_up_with_90(
    tmp_path: Path,
) -> None:
    port = _free_port()
    run = _launch_orchestrator(tmp_path, "always")
    watch = _watch(tmp_path, run, "--http", f"127.0.0.1:{port}")
    try:
        _wait_for(lambda: (run / "codes.json").exists() and 90 in json.loads(
            (run / "codes.json").read_text()))  # fmt: skip
        metrics = _metrics(port)
        probe = urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5)
        assert probe.status == 200, "a NaN in the job never makes sentinel look unhealthy"
    finally:
        watch.send_signal(signal.SIGTERM)
        _out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert json.loads((run / "codes.json").read_text()) == [91, 90]
    attempts = [json.loads((run / f"attempt-{n}").read_text()) for n in (1, 2)]
    assert [a["start"] for a in attempts] == [0, 20], "attempt 2 resumed from the clean step_20"
    quarantined = [p.name for p in (run / "ckpt" / "quarantine").rglob("step_*")]
    # Each attempt's step_25 (written at its NaN) was set aside, the one given up on too,
    # so that whoever resumes this run later resumes clean.
    assert quarantined == ["step_25", "step_25"]
    assert sorted(p.name for p in (run / "ckpt").glob("step_*")) == ["step_10", "step_20"]
    final = json.loads((tmp_path / "state" / "verdict.json").read_text())
    assert (final["state"], final["code"], final["rule"], final["attempt"]) == (
        "final",
        90,
        "nan_inf",
        2,
    )
    assert metrics["sentinel_job_attempt"] == 2
    assert metrics["sentinel_log_lines_total"] >= 25
    for attempt in attempts:
        with pytest.raises(ProcessLookupError):
            os.kill(attempt["pid"], 0)
    assert "recurred at the same step (25)" in err


def test_watch_pid_ends_after_its_rollback_and_the_relaunch_is_not_handed_a_stale_91(
    tmp_path: Path,
) -> None:
    """``--pid`` names one process: after the rollback of its NaN, sentinel says that it
    cannot follow the relaunch (naming the checkpoint it resumes from) and ends, exit 0.
    The wrapper took the 91, so the relaunch that finished exits 0 and the loop ends. It
    used to wait for ever for the dead pid, holding the state dir, and every later wrapper
    got the same 91: a finished job relaunched until the orchestrator gave up."""
    waits = "while not (run / 'go').exists(): time.sleep(0.05)\nsaved = sorted"
    run = _launch_orchestrator(tmp_path, "once", JOB.replace("saved = sorted", waits, 1))
    _wait_for(lambda: (run / "job.pid").is_file())
    watch = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "watch", "--pid", (run / "job.pid").read_text(),
         "--log", str(run / "train.log"), "--checkpoints", str(run / "ckpt"),
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SENTINEL_JOB__GRACE_PERIOD_S": "5"},
    )  # fmt: skip
    said, reader = _read_stderr(watch)
    try:
        _wait_for(lambda: any("job found (attempt 1" in line for line in said))
        (run / "go").touch()
        watch.wait(timeout=60)  # it ends by itself
        _wait_for(lambda: (run / "codes.json").exists() and 0 in json.loads(
            (run / "codes.json").read_text()))  # fmt: skip
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
        reader.join()
        for pipe in (watch.stdout, watch.stderr):
            assert pipe is not None
            pipe.close()
    err = "".join(said)
    assert watch.returncode == 0, err
    assert json.loads((run / "codes.json").read_text()) == [91, 0]
    attempts = [json.loads((run / f"attempt-{n}").read_text()) for n in (1, 2)]
    assert [a["start"] for a in attempts] == [0, 20], "the relaunch resumed from step_20"
    ended = [line for line in err.splitlines() if "a bare --pid cannot follow" in line]
    assert len(ended) == 1 and "resumes from" in ended[0] and "step_20" in ended[0], err
    assert "Result: sentinel stopped watching (exit 0)" in err


def test_watch_pid_that_gives_up_exits_with_the_verdicts_90(tmp_path: Path) -> None:
    """``--max-restarts 0``: the stop writes 90 and nothing is restarted. The watch ended
    with 0 beside it, and told to watch a relaunch that should not come."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "job.py").write_text(JOB)
    job = subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(run), "once"])
    try:
        _wait_for(lambda: (run / "job.pid").is_file())
        result = subprocess.run(
            [sys.executable, "-m", "sentinel", "watch", "--pid", str(job.pid),
             "--log", str(run / "train.log"), "--checkpoints", str(run / "ckpt"),
             "--state-dir", str(tmp_path / "state"), "--max-restarts", "0"],
            capture_output=True, text=True, timeout=90,
            env={**os.environ, "SENTINEL_JOB__GRACE_PERIOD_S": "5"},
        )  # fmt: skip
    finally:
        job.kill()
        job.wait()
    assert result.returncode == 90, result.stderr
    record = json.loads((tmp_path / "state" / "verdict.json").read_text())
    assert (record["state"], record["code"]) == ("final", 90)
    assert "the verdict is 90: nothing should relaunch it here" in result.stderr
    assert "watch it with `sentinel watch --pid NEW`" not in result.stderr


def test_watch_pid_ends_when_its_job_ends_by_itself(tmp_path: Path) -> None:
    """Nothing can bring that process back: sentinel ends with it (exit 0), saying why,
    rather than wait for ever for a pid that names no one."""
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "sentinel", "watch", "--pid", str(job.pid),
             "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=60, env=os.environ.copy(),
        )  # fmt: skip
    finally:
        job.kill()
        job.wait()
    assert result.returncode == 0, result.stderr
    assert f"pid {job.pid} has ended; a relaunch is a new process" in result.stderr
    assert "Result: sentinel stopped watching (exit 0)" in result.stderr


def test_watch_pid_of_no_running_process_ends_at_once(tmp_path: Path) -> None:
    """A bare pid that names no process now never will: a later one that takes it is
    someone else. It waited for ever."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "watch", "--pid", str(gone.pid),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60, env=os.environ.copy(),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"pid {gone.pid} names no running process: nothing to watch" in result.stderr


def test_watch_pid_beside_a_stop_a_dead_sentinel_left_still_finds_its_process(
    tmp_path: Path,
) -> None:
    """A stop left "deciding" by a sentinel that died, finished by the new one before its
    first look: it said "pid P names no running process" of a P that ran, and ended with 1
    (oos47b). It now looks for P, watches it to its end, and ends with the verdict's 90."""
    state = tmp_path / "state"
    gave_up = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--", sys.executable,
         "-c", "import json\nfor i in range(1, 8): print(json.dumps({'step': i, 'loss': 2.0 "
         "if i < 5 else float('nan')}))"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert gave_up.returncode == 90, gave_up.stderr
    record = json.loads((state / "verdict.json").read_text())
    record.update(state="deciding", code=None)
    record["stop"]["phase"] = "stopping"  # the sentinel died mid-stop
    (state / "verdict.json").write_text(json.dumps(record))
    (tmp_path / "train.log").write_text('{"step": 1, "loss": 1.0}\n')
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "sentinel", "watch", "--pid", str(job.pid),
             "--log", str(tmp_path / "train.log"), "--state-dir", str(state)],
            capture_output=True, text=True, timeout=60, env=clean_env(),
        )  # fmt: skip
    finally:
        job.kill()
        job.wait()
    assert "finishing what it decided" in result.stderr
    assert "names no running process" not in result.stderr, result.stderr
    [found] = [line for line in result.stderr.splitlines() if "job found" in line]
    assert f"pid {job.pid}" in found, result.stderr
    assert result.returncode == 90, result.stderr


def test_sigterm_stops_sentinel_and_never_the_job(tmp_path: Path) -> None:
    run = _launch_orchestrator(tmp_path, "never")
    watch = _watch(tmp_path, run)
    said, reader = _read_stderr(watch)
    try:
        _wait_for(lambda: any("job found (attempt 1" in line for line in said))
    finally:
        _stop(watch, reader)
    err = "".join(said)
    assert watch.returncode == 0, err
    pid = json.loads((run / "attempt-1").read_text())["pid"]
    os.kill(pid, 0)  # still running: a watchdog being stopped leaves its job alone
    os.killpg(os.getpgid(pid), signal.SIGKILL)  # the job and its stand-in orchestrator
    assert "leaving the job alone" in err


CRASHING = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    run = Path(sys.argv[1])
    (run / "job.pid.tmp").write_text(str(os.getpid()))
    os.replace(run / "job.pid.tmp", run / "job.pid")
    for step in range(1, 1201):  # until the test says sentinel is watching
        print(json.dumps({"step": step, "loss": 2.0 - step / 10000}), flush=True)
        if (run / "crash").exists():
            # It dies as it writes its traceback: sentinel, reading the log in windows of
            # 0.25 s, sees its end before its last lines, and waits for them.
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        time.sleep(0.05)
    """
)


def test_a_job_it_did_not_start_that_dies_on_a_traceback_is_reported(tmp_path: Path) -> None:
    """The job runs as ``python train.py >> train.log 2>&1`` under a launcher that exits:
    sentinel sees it vanish, never its exit status, and its log ends in a traceback. It says
    so (a job_crash warning, classed oom), where it had said nothing."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "job.py").write_text(CRASHING)
    command = f"exec {sys.executable} {tmp_path / 'job.py'} {run} >> {run / 'train.log'} 2>&1"
    launcher = (
        "import subprocess, sys; subprocess.Popen(['bash', '-c', sys.argv[1]],"
        " start_new_session=True)"
    )
    subprocess.run([sys.executable, "-c", launcher, command], check=True, timeout=30)
    watch = _watch(tmp_path, run)
    alerts = tmp_path / "state" / "alerts.jsonl"
    said, reader = _read_stderr(watch)
    try:
        _wait_for(lambda: any("job found (attempt 1" in line for line in said))
        (run / "crash").touch()  # sentinel is watching: now the job dies
        _wait_for(lambda: alerts.exists() and "job_crash" in alerts.read_text())
    finally:
        _stop(watch, reader)
    err = "".join(said)
    (crash,) = [
        json.loads(line)
        for line in alerts.read_text().splitlines()
        if json.loads(line)["rule"] == "job_crash"
    ]
    assert crash["severity"] == "warning", crash
    assert "exit status unknown" in crash["message"], err
    assert "likely a crash, oom (RuntimeError: CUDA out of memory" in crash["message"], crash
    # Its own exit, not the job's: it said "the job finished with exit status 0" here.
    assert "Result: sentinel stopped watching (exit 0)" in err, err
    assert "the job finished" not in err
