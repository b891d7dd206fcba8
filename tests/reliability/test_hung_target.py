"""A notification target that hangs never holds up another, nor sentinel's exit.

The hung target is a real TCP listener on the receiver's port that accepts and never
answers (nor reads); beside it a working webhook receiver. Later the same port
answers (``WebhookReceiver.start``), as an endpoint that comes back does.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import pytest

from sentinel.model.records import Severity
from sentinel.notify.notices import JobInfo, Notice, NoticeKind
from sentinel.notify.notifier import Notifier, Outbox
from sentinel.notify.outbox import Batching
from sentinel.store.state import StateStore
from tests.helpers.env import clean_env
from tests.helpers.webhook import ReceivedRequest, WebhookReceiver

JOB = JobInfo("llama-ft", "gpu-node-7", "run-1")
AT_ONCE = Batching(group_wait_s=0.0)


class HungListener:
    """Accepts TCP connections on ``port`` of 127.0.0.1 and never reads or answers them."""

    def __init__(self, port: int) -> None:
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", port))
        self._server.listen(16)
        self._server.settimeout(0.05)
        self.accepted: list[socket.socket] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                continue
            self.accepted.append(connection)

    def close(self) -> None:
        """Stop listening; the connections it holds are closed (the client sees EOF)."""
        self._closing.set()
        self._thread.join(timeout=5)
        self._server.close()
        for connection in self.accepted:
            connection.close()

    def __enter__(self) -> HungListener:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def notice(incident: str, rule: str, severity: Severity) -> Notice:
    alert = {"rule": rule, "severity": str(severity), "step": 20, "message": f"{rule} at 20"}
    return Notice(NoticeKind.OPENED, incident, rule, severity, alert, time.time())


def carrying(requests: list[ReceivedRequest], key: str) -> list[ReceivedRequest]:
    return [r for r in requests if key in r.json["message"]]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)


def notify_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sentinel-notify")]


@pytest.fixture
def hung_port() -> Iterator[WebhookReceiver]:
    """A receiver not listening yet: its port is the hung target's, then its own."""
    receiver = WebhookReceiver(listening=False)
    yield receiver
    receiver.stop()


@pytest.mark.slow
def test_a_hung_target_holds_up_neither_the_other_nor_the_stop(
    tmp_path: Path, hung_port: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    state = tmp_path / "state"
    with HungListener(hung_port.port) as hung, WebhookReceiver() as working:
        store = StateStore(state)
        outbox = Outbox(store, [hung_port.url, working.url])
        notifier = Notifier(outbox, timeout_s=10.0, tries=1)
        notifier.start()
        # A warning first, so the hung target's worker is stuck in it when the critical comes.
        outbox.add(notice("inc-1", "loss_spike", Severity.WARNING), JOB, outbox.targets,
                   time.time(), AT_ONCE)  # fmt: skip
        working.wait_for(1)
        wait_until(lambda: len(hung.accepted) == 1)

        added_at = time.time()
        outbox.add(notice("inc-2", "nan_inf", Severity.CRITICAL), JOB, outbox.targets,
                   time.time(), AT_ONCE)  # fmt: skip
        working.wait_for(2, timeout=1.0)
        (critical,) = [r for r in working.accepted if "nan_inf" in r.json["message"]]
        assert critical.received_at - added_at < 1.0
        # The hung one is still waiting for its first answer.
        assert notifier.results()[hung_port.url].last_failure_at is None
        assert outbox.pending_count(hung_port.url) == 2

        began = time.monotonic()
        notifier.stop(drain_s=1.0)
        stopped_in = time.monotonic() - began
        assert stopped_in < 2.0
        assert outbox.pending_count(hung_port.url) == 2
        assert outbox.pending_count(working.url) == 0
        store.close()
    # The hung send now ends (its connection closed) after the DB was closed: the left
    # worker must neither touch it nor fail loudly.
    for thread in notify_threads():
        thread.join(timeout=15)
    assert not notify_threads()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert "still sending after 1.0s" in caplog.text

    # sentinel starts again and the target answers now: each pending message once.
    hung_port.start()
    store = StateStore(state)
    try:
        outbox = Outbox(store, [hung_port.url, working.url])
        notifier = Notifier(outbox, timeout_s=10.0, tries=1)
        notifier.start()
        hung_port.wait_for(2)
        notifier.stop(drain_s=1.0)
        keys = [m.envelope.key for m in outbox.messages(hung_port.url)]
        assert len(keys) == 2
        for key in keys:
            assert len(carrying(hung_port.accepted, key)) == 1
        assert len(hung_port.requests) == 2
        assert outbox.pending_count() == 0
    finally:
        store.close()


JOB_SCRIPT = textwrap.dedent(
    """
    import json, signal, sys, time
    def on_term(signum, frame):
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    for step in range(1, 200):
        if step == 10:
            open(sys.argv[1], "w").write(repr(time.time()))
            print(json.dumps({"step": step, "loss": float("nan")}), flush=True)
            time.sleep(60)
        print(json.dumps({"step": step, "loss": 1.0}), flush=True)
        time.sleep(0.05)
    """
)


def pending_of(state: Path) -> int:
    with sqlite3.connect(state / "state.db") as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM notify_messages WHERE delivered_at IS NULL"
        ).fetchone()
    return int(count)


@pytest.mark.slow
def test_sentinel_run_pages_the_working_target_and_exits_on_time(
    tmp_path: Path, hung_port: WebhookReceiver
) -> None:
    state, job, nan_at = tmp_path / "state", tmp_path / "job.py", tmp_path / "nan_at"
    job.write_text(JOB_SCRIPT)
    # No chart (clean_env): the exit's bound is the drain's alone here.
    env = clean_env(SENTINEL_NOTIFY__TIMEOUT_S="10", SENTINEL_NOTIFY__GROUP_WAIT_S="0")
    with HungListener(hung_port.port), WebhookReceiver() as working:
        result = subprocess.run(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
             "--notify", hung_port.url, "--notify", working.url, "--max-restarts", "0",
             "--drain-timeout", "1", "--", sys.executable, str(job), str(nan_at)],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        # From the NaN on: the start of two Pythons (sentinel's, the job's) is no part of it.
        ran_s = time.time() - float(nan_at.read_text())
        pages = [r for r in working.accepted if "nan_inf" in r.json["message"]]
    assert result.returncode == 143, result.stderr
    assert "Traceback" not in result.stderr
    assert pages, result.stderr
    assert pages[0].received_at - float(nan_at.read_text()) < 1.0
    # Far under the hung target's 10 s timeout: the drain gave it 1 s.
    assert ran_s < 5.0, result.stderr
    assert pending_of(state) >= 1

    hung_port.start()  # it answers now: the next start delivers what it was owed, once
    for _ in range(2):
        again = subprocess.run(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state),
             "--notify", hung_port.url, "--notify", working.url, "--drain-timeout", "5",
             "--", sys.executable, "-c", "print('ok')"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
    assert pending_of(state) == 0
    delivered = [json.loads(r.body)["message"] for r in hung_port.accepted]
    assert any("nan_inf" in message for message in delivered)
    assert len(delivered) == len(set(delivered))
