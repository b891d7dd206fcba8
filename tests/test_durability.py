"""An alert that could not be delivered survives ``kill -9`` of sentinel and is delivered once."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.webhook import WebhookReceiver

pytestmark = pytest.mark.slow

JOB = textwrap.dedent(
    """
    import json, os, sys, time
    open(sys.argv[1], "w").write(str(os.getpid()))
    print(json.dumps({"step": 1, "loss": 2.0, "grad_norm": 1.0}), flush=True)
    print(json.dumps({"step": 2, "loss": 2.0, "grad_norm": float("nan")}), flush=True)
    time.sleep(120)
    """
)


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def pending_deliveries(state: Path) -> int:
    db = state / "state.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            (count,) = conn.execute(
                "SELECT count(*) FROM notify_outbox WHERE delivered_at IS NULL"
            ).fetchone()
        except sqlite3.OperationalError:  # table not created yet
            return 0
    return int(count)


def test_undelivered_alerts_survive_sigkill_and_are_delivered_exactly_once(
    tmp_path: Path,
) -> None:
    state, job, pidfile = tmp_path / "state", tmp_path / "job.py", tmp_path / "job.pid"
    job.write_text(JOB)
    env = {
        **os.environ,
        # Notify only: the job keeps running, so sentinel is still busy retrying when killed.
        "SENTINEL_RULES__NAN_INF__ON_CRITICAL": "notify",
        "SENTINEL_RULES__STALL__SOFT_TIMEOUT_S": "0.5",
        "SENTINEL_RULES__STALL__HARD_TIMEOUT_S": "600",
        "SENTINEL_TICK_INTERVAL_S": "0.1",
    }
    hook = WebhookReceiver(listening=False)  # the port is ours, nothing answers yet
    try:
        first = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "run", "--notify", hook.url,
             "--state-dir", str(state), "--", sys.executable, str(job), str(pidfile)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # Two incidents: the NaN (critical) and the stall warning that follows it.
        wait_until(lambda: pending_deliveries(state) == 2)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        os.killpg(int(pidfile.read_text()), signal.SIGKILL)  # the orphaned job

        hook.start()
        for _ in range(2):  # a second restart must not deliver anything again
            second = subprocess.run(
                [sys.executable, "-m", "sentinel", "run", "--notify", hook.url,
                 "--state-dir", str(state), "--", sys.executable, "-c", "print('ok')"],
                env=env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert second.returncode == 0, second.stderr
        received = [json.loads(r.json["message"]) for r in hook.accepted]
    finally:
        hook.stop()

    assert sorted((a["rule"], a["severity"]) for a in received) == [
        ("nan_inf", "critical"),
        ("stall", "warning"),
    ]
    assert pending_deliveries(state) == 0
    journal = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    assert [a["rule"] for a in journal][:2] == ["nan_inf", "stall"]
