"""Notification delivery against real receivers: an HTTP webhook, SQLite, threads.

Messages reach the worker through the outbox (``outbox.add``) as they do in
sentinel; what a body says is ``messages.render``'s (tests/actions/test_messages.py),
so these tests find a message by its idempotency key.
"""

from __future__ import annotations

import email.utils
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.model.records import Severity
from sentinel.model.secrets import mask_url, validate_url
from sentinel.notify import retry_after
from sentinel.notify.notices import JobInfo, Notice, NoticeKind
from sentinel.notify.notifier import DeliveryError, Notifier, Outbox, backoff_s, send_envelope
from sentinel.notify.outbox import Batching, Target
from sentinel.store.state import StateStore
from tests.helpers.webhook import ReceivedRequest, WebhookReceiver

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
JOB = JobInfo("llama-ft", "gpu-node-7", "run-1")
AT_ONCE = Batching(group_wait_s=0.0)


def make_notice(incident: str = "run-1-1", severity: Severity = Severity.CRITICAL) -> Notice:
    alert = {
        "rule": "nan_inf",
        "severity": str(severity),
        "step": 1200,
        "metric": "loss",
        "value": "nan",
        "message": f"loss is NaN ({incident})",
        "time": time.time(),
        "source": "train.log",
    }
    return Notice(NoticeKind.OPENED, incident, "nan_inf", severity, alert, time.time())


def enqueue(outbox: Outbox, incident: str = "run-1-1", batching: Batching = AT_ONCE) -> list[str]:
    """Add one notice for every target of ``outbox``; the keys of the messages it is in."""
    outbox.add(make_notice(incident), JOB, outbox.targets, time.time(), batching)
    return [
        m.envelope.key
        for m in outbox.messages()
        if any(n.incident_id == incident for n in m.envelope.notices)
    ]


def carrying(requests: list[ReceivedRequest], key: str) -> list[ReceivedRequest]:
    """The requests whose message carries ``key``."""
    return [r for r in requests if key in r.json["message"]]


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


def test_delivers_the_message_with_its_key(store: StateStore, hook: WebhookReceiver) -> None:
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    (key,) = enqueue(outbox)
    (request,) = hook.wait_for(1)
    notifier.stop()

    assert request.path == "/hook"
    assert request.json["type"] == "failure"
    assert carrying([request], key) == [request]
    assert outbox.pending_count() == 0
    assert notifier.results()[hook.url].last_success_at is not None


@pytest.mark.slow
def test_endpoint_down_then_up_delivers_once(store: StateStore) -> None:
    with WebhookReceiver(listening=False) as hook:
        outbox = Outbox(store, [hook.url])
        notifier = Notifier(outbox, **FAST)
        notifier.start()
        (key,) = enqueue(outbox)
        eventually(lambda: notifier.results()[hook.url].last_failure_at is not None)
        assert outbox.pending_count() == 1

        hook.start()
        hook.wait_for(1)
        notifier.stop()
        assert len(carrying(hook.requests, key)) == 1
        assert outbox.pending_count() == 0
    result = notifier.results()[hook.url]
    assert result.last_success_at is not None and result.last_failure_at is not None
    assert result.last_success_at > result.last_failure_at
    assert "Connection error" in (result.last_error or "")


@pytest.mark.slow
def test_503_then_200_delivers_once(store: StateStore, hook: WebhookReceiver) -> None:
    hook.respond(503, times=3)
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    enqueue(outbox)
    hook.wait_for(1)
    notifier.stop()
    assert [r.status for r in hook.requests] == [503, 503, 503, 200]
    assert outbox.pending_count() == 0


@pytest.mark.slow
def test_dead_target_does_not_duplicate_live_one(store: StateStore, hook: WebhookReceiver) -> None:
    dead = dead_url()
    outbox = Outbox(store, [dead, hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    enqueue(outbox)
    hook.wait_for(1)
    eventually(lambda: notifier.results()[dead].last_failure_at is not None)
    # A few more rounds for the dead target must not resend to the live one.
    failed_at = notifier.results()[dead].last_failure_at
    eventually(lambda: notifier.results()[dead].last_failure_at != failed_at)
    notifier.stop()
    assert len(hook.requests) == 1
    assert outbox.pending_count() == 1
    assert "Connection error" in (notifier.results()[dead].last_error or "")


@pytest.mark.slow
def test_stop_drains_every_target_at_once(store: StateStore) -> None:
    with WebhookReceiver() as slow, WebhookReceiver() as slower, WebhookReceiver() as quick:
        slow.delay_s = slower.delay_s = 30.0
        outbox = Outbox(store, [slow.url, slower.url, quick.url])
        notifier = Notifier(outbox, **{**FAST, "timeout_s": 30.0})
        notifier.start()
        enqueue(outbox)
        slow.wait_for(1, accepted_only=False)
        slower.wait_for(1, accepted_only=False)
        quick.wait_for(1)
        began = time.monotonic()
        notifier.stop(drain_s=1.0)
        # One drain for all: not one after the other.
        assert 0.9 <= time.monotonic() - began < 1.5
        assert outbox.pending_count(slow.url) == outbox.pending_count(slower.url) == 1
        assert outbox.pending_count(quick.url) == 0


def test_a_target_configured_after_start_gets_its_messages(
    store: StateStore, hook: WebhookReceiver
) -> None:
    outbox = Outbox(store)
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    outbox.add_targets([Target(hook.url, "late")])
    (key,) = enqueue(outbox)
    (request,) = hook.wait_for(1)
    notifier.stop()
    assert carrying([request], key) == [request]
    assert notifier.results()["late"].last_success_at is not None


def test_a_restarted_notifier_delivers_what_it_left(store: StateStore) -> None:
    with WebhookReceiver() as hook:
        hook.delay_s = 30.0
        outbox = Outbox(store, [hook.url])
        notifier = Notifier(outbox, **{**FAST, "timeout_s": 30.0})
        notifier.start()
        (key,) = enqueue(outbox)
        hook.wait_for(1, accepted_only=False)
        notifier.stop(drain_s=0.0)  # left waiting for its answer
        assert outbox.pending_count() == 1
        hook.stop()  # the held answer goes out, to a worker that may no longer record it
        hook.delay_s = 0.0
        hook.start()
        notifier.start()
        eventually(lambda: outbox.pending_count() == 0)
        notifier.stop()
    assert len(carrying(hook.requests, key)) == 2  # at least once: the receiver dedups by key
    assert outbox.messages()[0].delivered_at is not None


def test_adding_never_waits_for_a_hanging_endpoint(
    store: StateStore, hook: WebhookReceiver
) -> None:
    hook.delay_s = 30.0
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **{**FAST, "timeout_s": 30.0})
    notifier.start()
    enqueue(outbox, "inc-0")
    hook.wait_for(1, accepted_only=False)  # the worker is now stuck waiting for the answer

    for index in range(1, 6):
        enqueue(outbox, f"inc-{index}")
    # All five were stored while the first is still unanswered.
    assert len(hook.requests) == 1
    assert outbox.pending_count() == 6

    hook.release()
    hook.wait_for(6)
    notifier.stop()


def test_stop_sends_messages_still_gathering_their_group(
    store: StateStore, hook: WebhookReceiver
) -> None:
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    (key,) = enqueue(outbox, batching=Batching(group_wait_s=3600.0))
    notifier.stop(drain_s=5.0)
    assert len(carrying(hook.accepted, key)) == 1
    assert outbox.pending_count() == 0


def test_stop_leaves_a_rate_limited_digest_for_later(
    store: StateStore, hook: WebhookReceiver
) -> None:
    limited = Batching(group_wait_s=0.0, rate_limit=1, rate_window_s=3600.0)
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    enqueue(outbox, "inc-1", limited)
    hook.wait_for(1)
    enqueue(outbox, "inc-2", limited)
    notifier.stop(drain_s=1.0)
    assert len(hook.requests) == 1
    (digest,) = [m for m in outbox.messages() if m.delivered_at is None]
    assert digest.digest and digest.envelope.notices[0].incident_id == "inc-2"


def test_secret_never_logged_or_stored(
    store: StateStore, hook: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret_url = f"json://sentinel:{SECRET}@127.0.0.1:{hook.port}/hook"
    hook.respond(503, times=100)
    outbox = Outbox(store, [secret_url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    enqueue(outbox)
    eventually(lambda: any(s.last_failure_at for s in notifier.results().values()))
    notifier.stop()

    assert hook.requests[0].headers["Authorization"].startswith("Basic ")  # it was really used
    assert SECRET not in caplog.text
    assert SECRET not in repr(notifier.results())
    (status,) = notifier.results().values()
    assert status.last_error
    with sqlite3.connect(store.path) as db:
        dump = "\n".join(db.iterdump())
    assert "notify_messages" in dump
    assert SECRET not in dump


def test_apprise_debug_logs_are_masked(store: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    token = "TIiajkdnlazkcOXrIdevi7FQ"
    Notifier(Outbox(store, [f"slack://T1JJ3T3L2/A1BRTD4JD/{token}"]))
    caplog.set_level(logging.DEBUG)
    # What apprise's Slack plugin logs at DEBUG before each POST.
    logging.getLogger("apprise").debug(
        "Slack POST URL: %s", f"https://hooks.slack.com/services/T1JJ3T3L2/A1BRTD4JD/{token}"
    )
    assert "Slack POST URL: https://hooks.slack.com/services/" in caplog.text
    assert token not in caplog.text


def test_send_error_is_masked() -> None:
    from sentinel.notify.notices import Envelope

    dead = dead_url().replace("json://", f"json://user:{SECRET}@")
    with pytest.raises(DeliveryError) as raised:
        send_envelope(dead, Envelope("k-1", JOB, (make_notice(),)), timeout_s=1.0)
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
    [
        ("json://127.0.0.1:1/x", True),
        ("notaservice://x", False),
        ("not a url", False),
        # apprise keeps a port past 65535: it failed only when a message was to go.
        ("json://u:pw@127.0.0.1:99999/x", False),
    ],
)
def test_validate_url(url: str, valid: bool) -> None:
    error = validate_url(url)
    assert (error is None) == valid, error


def test_backoff_grows_and_is_capped() -> None:
    assert 0.5 <= backoff_s(1, 1.0, 300.0) <= 1.0
    assert 4.0 <= backoff_s(4, 1.0, 300.0) <= 8.0
    assert 150.0 <= backoff_s(50, 1.0, 300.0) <= 300.0


# A retry cap well above the Retry-After values below, so only the header sets the wait.
PATIENT: dict[str, Any] = {**FAST, "retry_max_s": 30.0}


def attempts_made(store: StateStore) -> list[int]:
    with sqlite3.connect(store.path) as db:
        return [row[0] for row in db.execute("SELECT attempts FROM notify_messages ORDER BY id")]


def send_one(store: StateStore, hook: WebhookReceiver, **options: float) -> Outbox:
    """Deliver one message to ``hook`` through a started notifier; return once accepted."""
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **options)
    notifier.start()
    enqueue(outbox)
    hook.wait_for(1)
    notifier.stop()
    return outbox


@pytest.mark.slow
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


@pytest.mark.slow
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
@pytest.mark.slow
def test_503_without_usable_retry_after_retries_with_normal_backoff(
    store: StateStore, hook: WebhookReceiver, headers: dict[str, str]
) -> None:
    hook.respond(503, headers=headers)
    send_one(store, hook, **PATIENT)
    assert [r.status for r in hook.requests] == [503, 200]
    # Retried by the in-process tries, not deferred to a later outbox round.
    assert attempts_made(store) == [1]


@pytest.mark.slow
def test_huge_retry_after_is_capped_at_retry_max(store: StateStore, hook: WebhookReceiver) -> None:
    hook.respond(429, headers={"Retry-After": "3600"})
    send_one(store, hook, **{**FAST, "retry_max_s": 0.5})
    refused, accepted = hook.requests
    assert refused.status == 429
    # It waited the cap (far above FAST's backoff), not the hour asked for.
    assert accepted.received_at - refused.received_at >= 0.5
    assert attempts_made(store) == [2]


@pytest.mark.slow
def test_retry_after_blocks_neither_other_messages_nor_other_targets(store: StateStore) -> None:
    with WebhookReceiver() as limited, WebhookReceiver() as other:
        limited.respond(429, headers={"Retry-After": "60"})
        outbox = Outbox(store, [limited.url, other.url])
        notifier = Notifier(outbox, **{**FAST, "retry_max_s": 60.0})
        notifier.start()
        first_keys = enqueue(outbox, "inc-1")
        other.wait_for(1)
        eventually(lambda: notifier.results()[limited.url].last_failure_at is not None)
        second_keys = enqueue(outbox, "inc-2")
        limited.wait_for(1)
        other.wait_for(2)
        notifier.stop()
    assert [r.status for r in limited.requests] == [429, 200]
    assert not any(carrying(limited.accepted, key) for key in first_keys)
    assert sum(len(carrying(limited.accepted, key)) for key in second_keys) == 1
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


#: Every notice a message of its own, with no rate limit's digest.
EACH_ALONE = Batching(group_wait_s=0.0, rate_limit=1000)


def _fill(store: StateStore) -> None:
    """The database file may grow no more: SQLite answers "database or disk is full", as it
    does on a full disk (once what is free in its pages is taken)."""
    with store.transaction() as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")


def _read_only(store: StateStore, read_only: bool = True) -> None:
    """SQLite refuses every write on the state DB's connection ("attempt to write a readonly
    database"), as it does when the state dir turned read-only."""
    with store.transaction() as conn:
        conn.execute(f"PRAGMA query_only = {int(read_only)}")


def test_a_notice_the_full_state_db_refuses_is_delivered_from_memory(
    store: StateStore, hook: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    outbox = Outbox(store, [hook.url])
    notifier = Notifier(outbox, **FAST)
    notifier.start()
    with caplog.at_level(logging.ERROR, logger="sentinel.notify.outbox"):
        _read_only(store)
        for n in range(3):
            outbox.add(make_notice(f"run-1-{n}"), JOB, [hook.url], time.time(), EACH_ALONE)
        assert outbox.refused is not None and "readonly" in outbox.refused
        hook.wait_for(3)
        eventually(lambda: outbox.pending_count() == 0)
    notifier.stop()
    assert outbox.messages() == [], "the spill is not in the state DB"
    for n in range(3):
        assert len(carrying(hook.accepted, f"run-1-{n}")) == 1
    assert len([r for r in caplog.records if "held in memory" in r.getMessage()]) == 1


def test_the_outbox_writes_to_the_state_db_again_once_it_takes_writes(
    store: StateStore, hook: WebhookReceiver
) -> None:
    outbox = Outbox(store, [hook.url])
    _fill(store)
    for n in range(30):  # enough that the database would have to grow
        outbox.add(make_notice(f"run-1-{n}"), JOB, [hook.url], time.time(), EACH_ALONE)
    assert outbox.refused is not None and "full" in outbox.refused
    with store.transaction() as conn:
        conn.execute("PRAGMA max_page_count = 1073741823")
    enqueue(outbox, "run-1-after", EACH_ALONE)
    assert outbox.refused is None
    stored = [m.envelope.notices[0].incident_id for m in outbox.messages()]
    assert "run-1-after" in stored and "run-1-29" not in stored
    assert outbox.pending_count() == 31, "none lost: the rest wait in memory"
