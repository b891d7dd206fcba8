"""The dead-man switch against a real HTTP receiver: pings while healthy, silence otherwise."""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sentinel.model import secrets
from sentinel.notify.heartbeat import LAST_ERROR_AT_KEY, LAST_ERROR_KEY, LAST_OK_KEY, Heartbeat
from sentinel.store.state import StateStore
from tests.helpers.webhook import WebhookReceiver

# A healthchecks.io-style check UUID: the secret part of a ping URL.
CHECK_UUID = "5f3a9c1e-77b2-4d0e-9a61-0c2b7e4d8f10"
PING_PATH = f"/ping/{CHECK_UUID}"
FAST_S = 0.1


def eventually(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Wait until ``condition()`` is true, failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


class Health:
    """A ``healthy`` callable the test flips, counting the calls that said "unhealthy"."""

    def __init__(self) -> None:
        self.ok = True
        self.unhealthy_calls = 0
        self._condition = threading.Condition()

    def __call__(self) -> bool:
        with self._condition:
            if not self.ok:
                self.unhealthy_calls += 1
                self._condition.notify_all()
            return self.ok

    def wait_unhealthy_calls(self, count: int) -> None:
        with self._condition:
            assert self._condition.wait_for(lambda: self.unhealthy_calls >= count, 5.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    store = StateStore(tmp_path / "state")
    yield store
    store.close()


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """The heartbeat's log as the CLI writes it: a stream handler with the masking filter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    secrets.install(handler)
    logger = logging.getLogger("sentinel.notify.heartbeat")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(previous)


@pytest.fixture
def beats() -> Iterator[list[Heartbeat]]:
    """Heartbeats started by a test, stopped after it even when it fails."""
    started: list[Heartbeat] = []
    yield started
    for heartbeat in started:
        heartbeat.stop()


def start(
    beats: list[Heartbeat],
    url: str,
    healthy: Callable[[], bool],
    interval_s: float = FAST_S,
    store: StateStore | None = None,
) -> Heartbeat:
    heartbeat = Heartbeat(url, interval_s, healthy, store=store, timeout_s=2.0)
    beats.append(heartbeat)
    heartbeat.start()
    return heartbeat


def test_first_ping_goes_out_right_after_start(
    hook: WebhookReceiver, beats: list[Heartbeat]
) -> None:
    start(beats, hook.http_url(PING_PATH), lambda: True, interval_s=600.0)
    (ping,) = hook.wait_for(1)
    assert ping.method == "GET"
    assert ping.path == PING_PATH


@pytest.mark.slow
def test_pings_repeat_at_the_interval_while_healthy(
    hook: WebhookReceiver, beats: list[Heartbeat]
) -> None:
    interval_s = 0.1
    before = time.time()
    start(beats, hook.http_url(PING_PATH), lambda: True, interval_s=interval_s)
    pings = hook.wait_for(4)[:4]
    # Ping n goes out on a fixed schedule, no sooner than n intervals after the start. A
    # loaded machine can only make a ping later, so this holds however slow the run is;
    # pings sent back to back (no wait between them) fail it.
    assert [ping.path for ping in pings] == [PING_PATH] * 4
    for n, ping in enumerate(pings):
        assert ping.received_at - before >= n * interval_s - 0.005, (n, ping.received_at - before)


@pytest.mark.slow
def test_unhealthy_sentinel_stays_silent_then_resumes(
    hook: WebhookReceiver, beats: list[Heartbeat], log: io.StringIO
) -> None:
    health = Health()
    start(beats, hook.http_url(PING_PATH), health)
    hook.wait_for(2)
    health.ok = False
    # Checks run on the heartbeat's thread in turn with pings, so after this no ping is in flight.
    health.wait_unhealthy_calls(1)
    silent_from = len(hook.requests)
    health.wait_unhealthy_calls(4)
    assert len(hook.requests) == silent_from
    assert "heartbeat pings to" in log.getvalue() and "paused" in log.getvalue()
    health.ok = True
    hook.wait_for(silent_from + 2)
    assert "resume" in log.getvalue()


@pytest.mark.slow
def test_failing_health_check_counts_as_unhealthy(
    hook: WebhookReceiver, beats: list[Heartbeat], log: io.StringIO
) -> None:
    calls: list[int] = []

    def broken() -> bool:
        calls.append(1)
        raise RuntimeError("engine gone")

    start(beats, hook.http_url(PING_PATH), broken)
    eventually(lambda: len(calls) >= 3)
    assert hook.requests == []
    assert "engine gone" in log.getvalue()


@pytest.mark.slow
def test_endpoint_down_is_recorded_masked_then_recovers(
    hook: WebhookReceiver, beats: list[Heartbeat], store: StateStore, log: io.StringIO
) -> None:
    hook.stop()
    start(beats, hook.http_url(PING_PATH), lambda: True, store=store)
    eventually(lambda: store.get(LAST_ERROR_KEY))
    error = store.get(LAST_ERROR_KEY) or ""
    assert "ConnectionError" in error
    assert CHECK_UUID not in error
    assert store.get(LAST_OK_KEY) is None
    failed_at = float(store.get(LAST_ERROR_AT_KEY) or "nan")

    hook.start()
    hook.wait_for(1)
    eventually(lambda: store.get(LAST_OK_KEY))
    assert float(store.get(LAST_OK_KEY) or "nan") >= failed_at
    text = log.getvalue()
    assert f"heartbeat ping to http://127.0.0.1:{hook.port}/ping/**** failed" in text
    assert "succeeded again" in text
    assert CHECK_UUID not in text


@pytest.mark.slow
def test_http_error_answer_is_a_failure(
    hook: WebhookReceiver, beats: list[Heartbeat], store: StateStore
) -> None:
    hook.respond(503)
    start(beats, hook.http_url(PING_PATH), lambda: True, store=store)
    hook.wait_for(1)  # the 503, then an accepted ping
    assert store.get(LAST_ERROR_KEY) == "HTTP 503 Service Unavailable"
    eventually(lambda: store.get(LAST_OK_KEY))


def test_stop_does_not_wait_out_the_interval(hook: WebhookReceiver) -> None:
    heartbeat = Heartbeat(hook.http_url(PING_PATH), 600.0, lambda: True, timeout_s=2.0)
    heartbeat.start()
    hook.wait_for(1)
    heartbeat.stop()
    assert "sentinel-heartbeat" not in [thread.name for thread in threading.enumerate()]


@pytest.mark.parametrize(
    ("url", "masked", "secret"),
    [
        (f"https://hc-ping.com/{CHECK_UUID}", "https://hc-ping.com/****", CHECK_UUID),
        (
            "https://hc-ping.com/fqOOd6-F4MMNuCEnzTU01w/nightly-backup",
            "https://hc-ping.com/****/nightly-backup",
            "fqOOd6-F4MMNuCEnzTU01w",
        ),
        (
            "https://push.example.com/api/push/beat?token=Zq8wLkPp",
            "https://push.example.com/api/push/beat?token=****",
            "Zq8wLkPp",
        ),
        (
            "https://ops:hunter2pw@status.example.com:8443/ping",
            "https://status.example.com:8443/ping",
            "hunter2pw",
        ),
    ],
    ids=["uuid-path", "ping-key-and-slug", "query-token", "basic-auth"],
)
def test_heartbeat_url_masking(url: str, masked: str, secret: str) -> None:
    assert secrets.mask_heartbeat_url(url) == masked
    assert secret in secrets.heartbeat_secrets(url)


def test_plain_words_of_a_heartbeat_url_are_not_secrets() -> None:
    found = secrets.heartbeat_secrets(f"https://example.com/api/heartbeat/{CHECK_UUID}")
    assert "api" not in found
    assert "heartbeat" not in found
