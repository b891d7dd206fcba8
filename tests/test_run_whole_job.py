"""``sentinel run`` stops the whole job and only the job, and gives it none of its own secrets.

Real jobs, real signals: a grandchild that escaped the tree and ignores SIGTERM, the job's
environment as the job sees it, a state dir sentinel cannot use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.env import without_settings

pytestmark = pytest.mark.slow

# Forks a grandchild that ignores SIGTERM and leaves the tree (its parent exits, so it is
# reparented), staying in the job's process group, or (``setsid``) leaving it for a session
# of its own, as a daemon does; then the job goes NaN and hangs.
ESCAPING_JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    pidfile = sys.argv[1]
    if os.fork() == 0:
        if os.fork() == 0:
            if len(sys.argv) > 2:
                os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(pidfile, "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(1)
        os._exit(0)
    os.wait()
    while not os.path.exists(pidfile):
        time.sleep(0.01)
    for step in range(1, 6):
        loss = float("nan") if step == 5 else 1.0
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        time.sleep(0.05)
    time.sleep(60)
    """
)


def _sentinel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = without_settings()
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "run", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("escape", ["same-group", "setsid"])
def test_a_process_that_left_the_tree_and_ignores_sigterm_is_killed(
    tmp_path: Path, escape: str
) -> None:
    job, pidfile = tmp_path / "job.py", tmp_path / "grandchild.pid"
    job.write_text(ESCAPING_JOB)
    setsid = ["setsid"] if escape == "setsid" else []
    result = _sentinel(
        "--state-dir", str(tmp_path / "state"), "--max-restarts", "0",
        "--", sys.executable, str(job), str(pidfile), *setsid,
        env={"SENTINEL_JOB__GRACE_PERIOD_S": "1"},
    )  # fmt: skip
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(grandchild)
    if alive:
        os.kill(grandchild, 9)
    assert not alive, f"the escaped grandchild outlived the stop: {result.stderr}"
    assert "nan_inf" in result.stderr


def test_the_job_gets_none_of_sentinels_settings(tmp_path: Path) -> None:
    job, seen = tmp_path / "job.py", tmp_path / "env.txt"
    job.write_text("import os, sys\nopen(sys.argv[1], 'w').write('\\n'.join(sorted(os.environ)))\n")
    token = "tok3nVisibleToNobody"
    result = _sentinel(
        "--state-dir", str(tmp_path / "state"), "--", sys.executable, str(job), str(seen),
        env={"SENTINEL_NOTIFY__URLS": f"json://127.0.0.1:9/hooks/{token}", "KEEP_ME": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    names = seen.read_text().split()
    assert "KEEP_ME" in names, "the job's own environment is passed on"
    assert not [name for name in names if name.startswith("SENTINEL_")]


def test_a_state_dir_sentinel_cannot_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("")
    marker = tmp_path / "started"
    result = _sentinel(
        "--state-dir", str(not_a_dir),
        "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"sentinel: config error: state_dir: {not_a_dir} is not a directory"
    )
    assert not marker.exists()


STEPPING_JOB = textwrap.dedent(
    """
    import sys, time
    for step in range(1, 400):
        print(f"step {step} loss {2.0 - step / 1000}", flush=True)
        time.sleep(0.05)
    """
)


def test_a_relay_that_dies_is_sentinels_failure_not_the_jobs_crash(tmp_path: Path) -> None:
    job, state = tmp_path / "job.py", tmp_path / "state"
    job.write_text(STEPPING_JOB)
    sentinel = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
         "--", sys.executable, str(job)],
        env=without_settings(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    current = state / "job" / "current.json"
    deadline = time.monotonic() + 20
    while not current.exists():
        assert time.monotonic() < deadline, "no job record"
        time.sleep(0.05)
    time.sleep(0.5)
    record = json.loads(current.read_text())
    os.kill(record["relay"][0], 9)
    _, err = sentinel.communicate(timeout=30)
    assert sentinel.returncode == 1, err
    assert "sentinel's relay" in err and "not the job's crash" in err, err
    assert "job_crash" not in err, err
    alerts = state / "alerts.jsonl"
    rules = (
        [json.loads(line)["rule"] for line in alerts.read_text().splitlines()]
        if alerts.exists()
        else []
    )
    assert "job_crash" not in rules
    assert not _alive(record["job"][0]), "the job outlived the run"
