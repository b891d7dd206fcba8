"""Notification delivery against real receivers: HTTP webhook, SMTP server, SQLite, processes."""

from __future__ import annotations

import email
import email.policy
import email.utils
import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from sentinel.actions import retry_after
from sentinel.actions.notify import (
    Message,
    Notifier,
    Outbox,
    backoff_s,
    mask_url,
    send_apprise,
    validate_url,
)
from sentinel.records import Alert, Severity
from sentinel.state import StateStore
from tests.helpers.webhook import WebhookReceiver

# Backoffs small enough that a retry round takes tens of milliseconds.
FAST: dict[str, Any] = {
    "tries": 2,
    "try_wait_initial_s": 0.02,
    "try_wait_max_s": 0.05,
    "retry_initial_s": 0.05,
    "retry_max_s": 0.2,
    "timeout_s": 2.0,
}
SECRET = "s3cr3t-T0KEN-9f8e"


def make_message(key: str = "inc-1:opened", severity: Severity = Severity.CRITICAL) -> Message:
    alert = Alert(
        rule="nan_inf",
        severity=severity,
        message=f"loss is NaN ({key})",
        time=1_700_000_000.0,
        source="train.log",
        step=1200,
        metric="loss",
        value=float("nan"),
    )
    return Message(
        title=f"[sentinel] {severity}: nan_inf",
        body=f"loss became NaN at step 1200 ({key})",
        severity=severity,
        alert=alert.to_json(),
        key=key,
    )


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until ``condition()`` holds, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state")
    yield state
    state.close()


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


def dead_url() -> str:
    with WebhookReceiver(listening=False) as receiver:
        return receiver.url


def test_delivers_alert_schema_to_webhook(store: StateStore, hook: WebhookReceiver) -> None:
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    message = make_message()
    notifier.notify(message)
    (request,) = hook.wait_for(1)
    notifier.stop()

    assert request.path == "/hook"
    assert request.json["title"] == message.title
    assert request.json["type"] == "failure"
    alert = json.loads(request.json["message"])
    assert alert == message.alert
    assert set(alert) == {
        "rule",
        "severity",
        "step",
        "metric",
        "value",
        "message",
        "time",
        "source",
    }
    assert alert["value"] == "nan"
    assert outbox.pending_count() == 0
    assert notifier.results()[hook.url].last_success is not None


def test_endpoint_down_then_up_delivers_once(store: StateStore) -> None:
    with WebhookReceiver(listening=False) as hook:
        outbox = Outbox(store, [hook.url])
        notifier = Notifier(outbox, **FAST)
        notifier.start()
        notifier.notify(make_message())
        eventually(lambda: notifier.results()[hook.url].last_failure is not None)
        assert outbox.pending_count() == 1

        hook.start()
        hook.wait_for(1)
        notifier.stop()
        assert len(hook.requests) == 1
        assert outbox.pending_count() == 0


def test_503_then_200_delivers_once(store: StateStore, hook: WebhookReceiver) -> None:
    hook.respond(503, times=3)
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    notifier.notify(make_message())
    hook.wait_for(1)
    notifier.stop()
    assert [r.status for r in hook.requests] == [503, 503, 503, 200]
    assert outbox.pending_count() == 0


def test_dead_target_does_not_duplicate_live_one(store: StateStore, hook: WebhookReceiver) -> None:
    dead = dead_url()
    outbox = Outbox(store, [dead, hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    notifier.notify(make_message())
    hook.wait_for(1)
    eventually(lambda: notifier.results()[dead].last_failure is not None)
    # A few more rounds for the dead target must not resend to the live one.
    failed_at = notifier.results()[dead].last_failure
    eventually(lambda: notifier.results()[dead].last_failure != failed_at)
    notifier.stop()
    assert len(hook.requests) == 1
    assert outbox.pending_count() == 1
    assert "Connection error" in (notifier.results()[dead].last_error or "")


def test_notify_does_not_block_on_hanging_endpoint(
    store: StateStore, hook: WebhookReceiver
) -> None:
    hook.delay_s = 5.0
    notifier = Notifier(Outbox(store, [hook.url]), **{**FAST, "timeout_s": 10.0})
    notifier.start()
    notifier.notify(make_message("inc-0:opened"))
    hook.wait_for(1)  # the worker is now stuck waiting for the answer

    durations = []
    for index in range(1, 6):
        started = time.perf_counter()
        notifier.notify(make_message(f"inc-{index}:opened"))
        durations.append(time.perf_counter() - started)
    assert max(durations) < 0.05, durations

    hook.release()
    hook.wait_for(6)
    notifier.stop()


CHILD = """
import sys, time
from pathlib import Path
from sentinel.actions.notify import Message, Notifier, Outbox
from sentinel.records import Severity
from sentinel.state import StateStore

outbox = Outbox(StateStore(Path(sys.argv[1])), [sys.argv[2]])
notifier = Notifier(outbox, tries=1, retry_initial_s=0.05, retry_max_s=0.2, timeout_s=2.0)
notifier.start()
for index in range(3):
    alert = {"rule": "nan_inf", "message": f"incident {index}"}
    notifier.notify(Message("title", "body", Severity.CRITICAL, alert, f"inc-{index}:opened"))
print("enqueued", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_outbox_survives_kill_9(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with (
        WebhookReceiver(listening=False) as hook,
        (tmp_path / "child.err").open("w") as child_stderr,
    ):
        child = subprocess.Popen(
            [sys.executable, str(script), str(state_dir), hook.url],
            stdout=subprocess.PIPE,
            stderr=child_stderr,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "enqueued"
            # The child has tried and failed each row at least once, and persisted that.
            with sqlite3.connect(state_dir / "state.db") as db:
                eventually(
                    lambda: (
                        db.execute(
                            "SELECT COUNT(*) FROM notify_outbox WHERE attempts > 0"
                        ).fetchone()[0]
                        == 3
                    )
                )
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=5)
            child.stdout.close()  # type: ignore[union-attr]
        assert child.returncode == -signal.SIGKILL

        hook.start()
        store = StateStore(state_dir)
        try:
            outbox = Outbox(store, [hook.url])
            assert outbox.pending_count() == 3
            notifier = Notifier(outbox, **FAST)
            notifier.start()
            hook.wait_for(3)
            notifier.stop()
            assert len(hook.requests) == 3
            alerts = [json.loads(r.json["message"]) for r in hook.requests]
            assert sorted(a["message"] for a in alerts) == [f"incident {i}" for i in range(3)]
            assert outbox.pending_count() == 0
            for index in range(3):
                again = Message("t", "b", Severity.CRITICAL, {}, f"inc-{index}:opened")
                assert outbox.enqueue(again) == 0
            assert outbox.pending_count() == 0
        finally:
            store.close()


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []
        self.logins: list[tuple[bytes, bytes]] = []
        self.condition = threading.Condition()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = envelope.content
        assert isinstance(content, bytes)
        parsed = email.message_from_bytes(content, policy=email.policy.default)
        with self.condition:
            self.messages.append(parsed)  # type: ignore[arg-type]
            self.condition.notify_all()
        return "250 OK"

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        assert isinstance(data, LoginPassword)
        self.logins.append((data.login, data.password))
        return AuthResult(success=data.password == b"pass")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_email_through_real_smtp_server(store: StateStore) -> None:
    mailbox = _Mailbox()
    port = free_port()
    controller = Controller(
        mailbox,
        hostname="127.0.0.1",
        port=port,
        authenticator=mailbox.authenticate,
        auth_require_tls=False,  # apprise's mode=insecure speaks plain SMTP
    )
    controller.start()
    try:
        url = (
            f"mailto://user:pass@127.0.0.1:{port}?from=sentinel@example.com"
            "&to=oncall@example.com&smtp=127.0.0.1&mode=insecure"
        )
        notifier = Notifier(Outbox(store, [url]), **FAST)
        notifier.start()
        message = make_message(severity=Severity.WARNING)
        notifier.notify(message)
        with mailbox.condition:
            assert mailbox.condition.wait_for(lambda: mailbox.messages, timeout=10)
        notifier.stop()
    finally:
        controller.stop()
    (received,) = mailbox.messages
    assert received["Subject"] == message.title
    assert received["To"] == "oncall@example.com"
    assert message.body in received.get_body(("plain", "html")).get_content()  # type: ignore[union-attr]
    assert mailbox.logins == [(b"user", b"pass")]


def test_secret_never_logged_or_reported(
    store: StateStore, hook: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_url = f"json://sentinel:{SECRET}@127.0.0.1:{hook.port}/hook"
    hook.respond(503, times=100)
    outbox = Outbox(store, [secret_url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    notifier.notify(make_message())
    eventually(lambda: any(s.last_failure for s in notifier.results().values()))
    notifier.stop()

    assert hook.requests[0].headers["Authorization"].startswith("Basic ")  # it was really used
    assert SECRET not in caplog.text
    assert SECRET not in repr(notifier.results())
    (status,) = notifier.results().values()
    assert status.last_error
    with sqlite3.connect(store.path) as db:
        stored = db.execute("SELECT * FROM notify_outbox").fetchall()
    assert stored
    assert SECRET not in repr(stored)


def test_apprise_debug_logs_are_masked(store: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    token = "TIiajkdnlazkcOXrIdevi7FQ"
    Outbox(store, [f"slack://T1JJ3T3L2/A1BRTD4JD/{token}"])
    caplog.set_level(logging.DEBUG)
    # What apprise's Slack plugin logs at DEBUG before each POST.
    logging.getLogger("apprise").debug(
        "Slack POST URL: %s", f"https://hooks.slack.com/services/T1JJ3T3L2/A1BRTD4JD/{token}"
    )
    assert "Slack POST URL: https://hooks.slack.com/services/" in caplog.text
    assert token not in caplog.text


def test_send_error_is_masked() -> None:
    dead = dead_url().replace("json://", f"json://user:{SECRET}@")
    with pytest.raises(Exception) as raised:
        send_apprise(dead, make_message(), timeout_s=1.0)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "shown", "hidden"),
    [
        ("json://127.0.0.1:8080/hook", "json://127.0.0.1:8080/hook", None),
        (
            f"json://user:{SECRET}@127.0.0.1:8080/hook",
            "json://user:****@127.0.0.1:8080/hook",
            SECRET,
        ),
        (
            f"jsons://example.com/hook?-token={SECRET}",
            "jsons://example.com/hook?-token=****",
            SECRET,
        ),
        (
            "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ",
            "slack://T...2/A...D/T...Q",
            "TIiajkdnlazkcOXrIdevi7FQ",
        ),
        ("notaservice://user:pw@host/x", "notaservice://****", "pw@host"),
    ],
    ids=["plain", "password", "query-token", "slack", "unknown"],
)
def test_mask_url(url: str, shown: str, hidden: str | None) -> None:
    masked = mask_url(url)
    assert masked.startswith(shown)
    if hidden:
        assert hidden not in masked


@pytest.mark.parametrize(
    ("url", "valid"),
    [("json://127.0.0.1:1/x", True), ("notaservice://x", False), ("not a url", False)],
)
def test_validate_url(url: str, valid: bool) -> None:
    error = validate_url(url)
    assert (error is None) == valid, error


def test_enqueue_is_idempotent_per_key_and_target(store: StateStore) -> None:
    outbox = Outbox(store, ["json://127.0.0.1:1/a", "json://127.0.0.1:1/b"])
    assert outbox.enqueue(make_message("inc-1:opened")) == 2
    assert outbox.enqueue(make_message("inc-1:opened")) == 0
    assert outbox.enqueue(make_message("inc-1:resolved")) == 2
    assert outbox.pending_count() == 4

    first, *_ = outbox.due(time.time())
    outbox.mark_failed(first.id, "boom", next_attempt_at=time.time() + 60)
    assert first.id not in [d.id for d in outbox.due(time.time())]
    outbox.mark_delivered(first.id, time.time())
    assert outbox.pending_count() == 3
    # A target no longer configured is not delivered to, nor counted.
    assert Outbox(store, ["json://127.0.0.1:1/b"]).pending_count() == 2


def test_backoff_grows_and_is_capped() -> None:
    assert 0.5 <= backoff_s(1, 1.0, 300.0) <= 1.0
    assert 4.0 <= backoff_s(4, 1.0, 300.0) <= 8.0
    assert 150.0 <= backoff_s(50, 1.0, 300.0) <= 300.0


# A retry cap well above the Retry-After values below, so only the header sets the wait.
PATIENT: dict[str, Any] = {**FAST, "retry_max_s": 30.0}


def attempts_made(store: StateStore) -> list[int]:
    with sqlite3.connect(store.path) as db:
        return [row[0] for row in db.execute("SELECT attempts FROM notify_outbox ORDER BY id")]


def send_one(store: StateStore, hook: WebhookReceiver, **options: float) -> Outbox:
    """Deliver one message to ``hook`` through a started notifier; return once accepted."""
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **options)
    notifier.start()
    notifier.notify(make_message())
    hook.wait_for(1)
    notifier.stop()
    return outbox


@pytest.mark.parametrize("status", [429, 503], ids=["429", "503"])
def test_retry_after_seconds_delays_the_next_attempt(
    store: StateStore, hook: WebhookReceiver, status: int
) -> None:
    hook.respond(status, headers={"Retry-After": "1"})
    outbox = send_one(store, hook, **PATIENT)
    refused, accepted = hook.requests
    assert [refused.status, accepted.status] == [status, 200]
    assert accepted.received_at - refused.received_at >= 1.0
    assert len(hook.accepted) == 1
    assert outbox.pending_count() == 0


def test_retry_after_http_date_delays_the_next_attempt(
    store: StateStore, hook: WebhookReceiver
) -> None:
    not_before = email.utils.formatdate(time.time() + 2, usegmt=True)
    hook.respond(429, headers={"Retry-After": not_before})
    send_one(store, hook, **PATIENT)
    refused, accepted = hook.requests
    assert refused.status == 429
    assert accepted.received_at >= email.utils.parsedate_to_datetime(not_before).timestamp()
    assert len(hook.accepted) == 1


@pytest.mark.parametrize(
    "headers", [{}, {"Retry-After": "soon"}], ids=["no-header", "unparsable-header"]
)
def test_503_without_usable_retry_after_retries_with_normal_backoff(
    store: StateStore, hook: WebhookReceiver, headers: dict[str, str]
) -> None:
    hook.respond(503, headers=headers)
    send_one(store, hook, **PATIENT)
    assert [r.status for r in hook.requests] == [503, 200]
    # Retried by the in-process tries, not deferred to a later outbox round.
    assert attempts_made(store) == [1]


def test_huge_retry_after_is_capped_at_retry_max(store: StateStore, hook: WebhookReceiver) -> None:
    hook.respond(429, headers={"Retry-After": "3600"})
    send_one(store, hook, **{**FAST, "retry_max_s": 0.5})
    refused, accepted = hook.requests
    assert refused.status == 429
    # It waited the cap (far above FAST's backoff), not the hour asked for.
    assert accepted.received_at - refused.received_at >= 0.5
    assert attempts_made(store) == [2]


def test_retry_after_blocks_neither_other_messages_nor_other_targets(store: StateStore) -> None:
    with WebhookReceiver() as limited, WebhookReceiver() as other:
        limited.respond(429, headers={"Retry-After": "60"})
        outbox = Outbox(store, [limited.url, other.url])
        notifier = Notifier(outbox, **{**FAST, "retry_max_s": 60.0})
        notifier.start()
        notifier.notify(make_message("inc-1:opened"))
        other.wait_for(1)
        eventually(lambda: notifier.results()[limited.url].last_failure is not None)
        notifier.notify(make_message("inc-2:opened"))
        limited.wait_for(1)
        other.wait_for(2)
        notifier.stop()
    delivered = [json.loads(r.json["message"])["message"] for r in limited.accepted]
    assert delivered == ["loss is NaN (inc-2:opened)"]
    assert [r.status for r in limited.requests] == [429, 200]
    assert outbox.pending_count() == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2", 1_000_002.0),
        (" 7 ", 1_000_007.0),
        ("1.5", 1_000_001.5),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 1_445_412_480.0),
        ("Wed, 21 Oct 2015 07:28:00 -0000", 1_445_412_480.0),
        ("soon", None),
        ("-1", None),
        ("", None),
    ],
    ids=[
        "seconds",
        "padded",
        "fraction",
        "http-date",
        "http-date-no-zone",
        "word",
        "negative",
        "empty",
    ],
)
def test_retry_at_parses_retry_after(value: str, expected: float | None) -> None:
    assert retry_after.retry_at(value, now=1_000_000.0) == expected
