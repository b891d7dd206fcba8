"""systemd's notify protocol against a real AF_UNIX datagram socket standing in for
systemd: a path in tmp_path and an abstract name."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from sentinel.service.sdnotify import SystemdNotifier, format_status, strip_notify_env


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class FakeSystemd:
    """A bound datagram socket that reads what a notifier sends, as systemd would."""

    def __init__(self, address: str) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(address)
        self.socket.settimeout(2.0)

    def receive(self) -> list[str]:
        """The lines of the next datagram."""
        data = self.socket.recv(4096)
        assert data.endswith(b"\n")
        return data.decode().splitlines()

    def nothing_waiting(self) -> bool:
        self.socket.setblocking(False)
        try:
            self.socket.recv(4096)
        except BlockingIOError:
            return True
        finally:
            self.socket.settimeout(2.0)
        return False


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    path = str(tmp_path / "notify")
    assert len(path) < 100  # sun_path holds 108 bytes
    return path


@pytest.fixture
def systemd(socket_path: str) -> Iterator[FakeSystemd]:
    fake = FakeSystemd(socket_path)
    yield fake
    fake.socket.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


Notifier = Callable[..., SystemdNotifier]


@pytest.fixture
def notifier() -> Iterator[Notifier]:
    """Makes notifiers with pid 4242 (closed after the test)."""
    made: list[SystemdNotifier] = []

    def make(env: dict[str, str], clock: Clock | None = None) -> SystemdNotifier:
        made.append(SystemdNotifier(env, pid=4242, clock=clock or Clock()))
        return made[-1]

    yield make
    for sd in made:
        sd.close()


def test_ready_status_stopping_and_extend(
    systemd: FakeSystemd, socket_path: str, notifier: Notifier
) -> None:
    sd = notifier({"NOTIFY_SOCKET": socket_path})
    assert sd.enabled
    assert sd.ready("watching train@7")
    assert systemd.receive() == ["READY=1", "STATUS=watching train@7"]
    assert sd.status("step 10, attempt 1, 0 open incidents")
    assert systemd.receive() == ["STATUS=step 10, attempt 1, 0 open incidents"]
    assert sd.extend_timeout(12.5, "draining the outbox")
    assert systemd.receive() == ["EXTEND_TIMEOUT_USEC=12500000", "STATUS=draining the outbox"]
    assert sd.stopping()
    assert systemd.receive() == ["STOPPING=1"]
    sd.close()


def test_an_unchanged_status_is_not_resent(
    systemd: FakeSystemd, socket_path: str, notifier: Notifier
) -> None:
    sd = notifier({"NOTIFY_SOCKET": socket_path})
    sd.status("step 1")
    sd.status("step 1")
    sd.status("step 2")
    assert systemd.receive() == ["STATUS=step 1"]
    assert systemd.receive() == ["STATUS=step 2"]
    assert systemd.nothing_waiting()


def test_a_status_is_one_line(systemd: FakeSystemd, socket_path: str, notifier: Notifier) -> None:
    notifier({"NOTIFY_SOCKET": socket_path}).status("step 5\nREADY=1")
    assert systemd.receive() == ["STATUS=step 5 READY=1"]


def test_abstract_socket(notifier: Notifier) -> None:
    name = f"sentinel-test-{uuid.uuid4().hex}"
    fake = FakeSystemd("\0" + name)
    try:
        sd = notifier({"NOTIFY_SOCKET": "@" + name})
        assert sd.ready()
        assert fake.receive() == ["READY=1"]
    finally:
        fake.socket.close()


def test_watchdog_at_half_the_interval_after_good_cycles(
    systemd: FakeSystemd, socket_path: str, clock: Clock, notifier: Notifier
) -> None:
    env = {"NOTIFY_SOCKET": socket_path, "WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "4242"}
    sd = notifier(env, clock)
    assert sd.watchdog_interval_s == 30.0
    assert sd.good_cycle()  # the first good cycle pings at once
    assert systemd.receive() == ["WATCHDOG=1"]
    clock.now += 29.0
    assert not sd.good_cycle()
    assert systemd.nothing_waiting()
    clock.now += 1.0
    assert sd.good_cycle()
    assert systemd.receive() == ["WATCHDOG=1"]


def test_no_good_cycle_no_ping(
    systemd: FakeSystemd, socket_path: str, clock: Clock, notifier: Notifier
) -> None:
    """A wedged loop calls nothing, and systemd hears nothing: it restarts sentinel."""
    env = {"NOTIFY_SOCKET": socket_path, "WATCHDOG_USEC": "2000000"}
    sd = notifier(env, clock)
    sd.ready()
    assert systemd.receive() == ["READY=1"]
    clock.now += 60.0
    sd.status("step 3; cannot write state: No space left on device")
    assert systemd.receive() == ["STATUS=step 3; cannot write state: No space left on device"]
    assert systemd.nothing_waiting()


@pytest.mark.parametrize(
    "extra",
    [
        {"WATCHDOG_PID": "1"},  # meant for another process
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_USEC": ""},
    ],
    ids=["other-pid", "zero", "not-a-number", "unset"],
)
def test_watchdog_off(
    systemd: FakeSystemd, socket_path: str, extra: dict[str, str], notifier: Notifier
) -> None:
    env = {"NOTIFY_SOCKET": socket_path, "WATCHDOG_USEC": "60000000", **extra}
    sd = notifier(env)
    assert sd.watchdog_interval_s is None
    assert not sd.good_cycle()
    assert systemd.nothing_waiting()


def test_watchdog_pid_defaults_to_ours(systemd: FakeSystemd, socket_path: str) -> None:
    env = {
        "NOTIFY_SOCKET": socket_path,
        "WATCHDOG_USEC": "1000000",
        "WATCHDOG_PID": str(os.getpid()),
    }
    with closing(SystemdNotifier(env)) as sd:
        assert sd.watchdog_interval_s == 0.5
        assert sd.good_cycle()
    assert systemd.receive() == ["WATCHDOG=1"]


def test_no_notify_socket_is_a_no_op(notifier: Notifier) -> None:
    sd = notifier({"WATCHDOG_USEC": "1000000"})
    assert not sd.enabled
    assert sd.watchdog_interval_s is None
    assert not sd.ready()
    assert not sd.status("step 1")
    assert not sd.good_cycle()
    assert not sd.stopping()


def test_unsupported_socket_kind_is_a_no_op(
    caplog: pytest.LogCaptureFixture, notifier: Notifier
) -> None:
    with caplog.at_level(logging.WARNING, logger="sentinel.service.sdnotify"):
        sd = notifier({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not sd.enabled
    assert not sd.ready()
    assert "not a path or @name" in caplog.text


def test_a_missing_systemd_is_logged_once_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, notifier: Notifier
) -> None:
    path = str(tmp_path / "gone")
    sd = notifier({"NOTIFY_SOCKET": path})
    with caplog.at_level(logging.INFO, logger="sentinel.service.sdnotify"):
        assert not sd.status("step 1")
        assert not sd.status("step 1")
        fake = FakeSystemd(path)  # systemd is back
        try:
            assert sd.status("step 1")  # the failed status is sent again
            assert fake.receive() == ["STATUS=step 1"]
        finally:
            fake.socket.close()
    warnings = [r for r in caplog.records if "cannot notify systemd" in r.getMessage()]
    assert len(warnings) == 1
    assert "works again" in caplog.text


def test_strip_notify_env() -> None:
    env = {
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "60000000",
        "WATCHDOG_PID": "1",
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "0",
    }
    assert strip_notify_env(env) == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0"}
    assert "NOTIFY_SOCKET" in env  # a copy: the original is left alone


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (
            {"step": 1234, "attempt": 2, "open_incidents": 1},
            "step 1234, attempt 2, 1 open incident",
        ),
        (
            {"step": None, "attempt": 1, "open_incidents": 0},
            "no step yet, attempt 1, 0 open incidents",
        ),
        (
            {"step": 7, "attempt": 1, "open_incidents": 3, "problem": "cannot write state: ENOSPC"},
            "step 7, attempt 1, 3 open incidents; cannot write state: ENOSPC",
        ),
    ],
    ids=["one-incident", "no-step", "problem"],
)
def test_format_status(kwargs: dict[str, object], expected: str) -> None:
    assert format_status(**kwargs) == expected  # type: ignore[arg-type]
