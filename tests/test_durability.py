"""Notifications of a real ``sentinel run``: they survive ``kill -9`` and are delivered once;
the notices of one divergence (grad-norm run, NaN, rollback) go out as one message.

What a message says is ``messages.render``'s; here a message is found by its
idempotency key, and its notices are read from the outbox (state.db).
"""

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
from typing import Any

import pytest

from tests.helpers.webhook import WebhookReceiver

pytestmark = pytest.mark.slow

JOB = textwrap.dedent(
    """
    import json, os, sys, time
    open(sys.argv[1], "w").write(str(os.getpid()))
    print(json.dumps({"step": 1, "loss": 2.0, "grad_norm": 1.0}), flush=True)
    print(json.dumps({"step": 2, "loss": float("nan"), "grad_norm": float("nan")}), flush=True)
    time.sleep(120)
    """
)


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def stored_messages(state: Path) -> list[tuple[str, list[dict[str, Any]], float | None]]:
    """Each message in the outbox: its key, its notices, when it was delivered."""
    db = state / "state.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute(
                "SELECT key, notices, delivered_at FROM notify_messages ORDER BY id"
            ).fetchall()
        except sqlite3.OperationalError:  # table not created yet
            return []
    return [(key, json.loads(notices), delivered_at) for key, notices, delivered_at in rows]


def pending_deliveries(state: Path) -> int:
    return sum(1 for _, _, delivered_at in stored_messages(state) if delivered_at is None)


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
        # One message per incident, so each is pending on its own when sentinel dies.
        "SENTINEL_NOTIFY__GROUP_WAIT_S": "0",
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
        accepted = hook.accepted
    finally:
        hook.stop()

    messages = stored_messages(state)
    assert sorted((n["rule"], n["severity"]) for _, notices, _ in messages for n in notices) == [
        ("nan_inf", "critical"),
        ("stall", "warning"),
    ]
    for key, _, delivered_at in messages:
        assert delivered_at is not None
        assert len([r for r in accepted if key in r.json["message"]]) == 1, key
    assert len(accepted) == len(messages) == 2
    journal = [json.loads(line) for line in (state / "alerts.jsonl").read_text().splitlines()]
    assert [a["rule"] for a in journal][:2] == ["nan_inf", "stall"]


# A run in miniature: grad-norm climbs for three steps, then the loss is NaN; a step_<N>
# checkpoint every 5 steps; after sentinel restarts it (SENTINEL_RESTART), it trains cleanly.
DIVERGING = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    ckpt = Path(sys.argv[1])
    restart = int(os.environ.get("SENTINEL_RESTART") or 0)
    start = int(os.environ.get("SENTINEL_RESUME_STEP") or 0)
    for step in range(start + 1, 21):
        if step % 5 == 0:
            (ckpt / f"step_{step}").mkdir(parents=True, exist_ok=True)
            (ckpt / f"step_{step}" / "weights.json").write_text(json.dumps({"step": step}))
        grad_norm = 50.0 if restart == 0 and 11 <= step <= 13 else 1.0
        loss = float("nan") if restart == 0 and step == 14 else 2.0 - step / 100
        print(json.dumps({"step": step, "loss": loss, "grad_norm": grad_norm}), flush=True)
        if restart == 0 and step == 14:
            time.sleep(60)  # sentinel must stop it
        time.sleep(0.01)
    """
)


def test_grad_norm_run_nan_and_rollback_go_out_as_one_message(tmp_path: Path) -> None:
    state, ckpt, job = tmp_path / "state", tmp_path / "ckpt", tmp_path / "job.py"
    job.write_text(DIVERGING)
    env = {
        **os.environ,
        "SENTINEL_NOTIFY__GROUP_WAIT_S": "5",
        "SENTINEL_JOB__RESTART_BACKOFF_S": "0.1",
    }
    with WebhookReceiver() as hook:
        result = subprocess.run(
            [sys.executable, "-m", "sentinel", "run", "--notify", hook.url,
             "--checkpoints", str(ckpt), "--state-dir", str(state), "--max-restarts", "1",
             "--", sys.executable, str(job), str(ckpt)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (request,) = hook.wait_for(1)

    ((key, notices, delivered_at),) = stored_messages(state)
    assert delivered_at is not None
    assert key in request.json["message"]
    assert [(n["kind"], n["alert"]["rule"]) for n in notices] == [
        ("opened", "grad_norm_run"),
        ("escalated", "nan_inf"),
        ("actions", "grad_norm_run"),
    ]
    assert any("rolled back to step_10" in line for line in notices[-1]["actions"]), notices[-1]
    body = request.json["message"]
    for text in ("grad_norm_run", "nan_inf", "rolled back to step_10"):
        assert text in body


def test_messages_still_undelivered_at_exit_are_counted_in_one_line(tmp_path: Path) -> None:
    """A target that never answers: the run ends, and says what nobody has received yet."""
    state, job, pidfile = tmp_path / "state", tmp_path / "job.py", tmp_path / "job.pid"
    job.write_text(JOB)
    hook = WebhookReceiver(listening=False)  # the port is ours, nothing answers
    try:
        result = subprocess.run(
            [sys.executable, "-m", "sentinel", "run", "--notify", hook.url, "--state-dir",
             str(state), "--max-restarts", "0", "--", sys.executable, str(job), str(pidfile)],
            env={**os.environ, "SENTINEL_DRAIN_TIMEOUT_S": "1"},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        hook.stop()
    undelivered = pending_deliveries(state)
    assert undelivered >= 1
    said = [line for line in result.stderr.splitlines() if "not delivered yet" in line]
    assert len(said) == 1, result.stderr
    assert f"{undelivered} notification message(s) not delivered yet" in said[0]
