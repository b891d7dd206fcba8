"""The stop's first signal goes from the loop's thread: a new thread waited for the
interpreter's lock while the loop went on to the incident's report."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from sentinel.config import JobConfig
from sentinel.supervisor import stopping
from sentinel.supervisor.events import Stop
from tests.actions.test_signal_tree import blocking_sigterm, sigterm_pending


class HeldThread:
    """A ``threading.Thread`` that is never started: what the caller did, alone."""

    made: ClassVar[list[HeldThread]] = []

    def __init__(self, *, target: Callable[[], None], name: str, daemon: bool) -> None:
        self.target = target
        HeldThread.made.append(self)

    def start(self) -> None:
        pass


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> list[HeldThread]:
    HeldThread.made = []
    monkeypatch.setattr(stopping.threading, "Thread", HeldThread)
    return HeldThread.made


@pytest.mark.slow
def test_the_first_signal_is_sent_before_the_stop_thread_runs(held: list[HeldThread]) -> None:
    done: list[Any] = []
    with blocking_sigterm() as identity:
        stopping.stop_in_background(
            identity, Stop(None, restart=False), JobConfig(grace_period_s=0.1),
            members=list, put=done.append,
        )  # fmt: skip
        assert sigterm_pending(identity.pid)
        assert done == []
        held[0].target()  # the grace, then SIGKILL
    (stop_done,) = done
    assert stop_done.result.got(identity) == [signal.SIGTERM, signal.SIGKILL]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["evidence first", "resumed"])
def test_evidence_first_or_a_resumed_stop_leave_the_signal_to_the_thread(
    held: list[HeldThread], how: str
) -> None:
    taken: list[bool] = []
    done: list[Any] = []
    with blocking_sigterm() as identity:
        stopping.stop_in_background(
            identity, Stop(None, restart=False), JobConfig(grace_period_s=0.1),
            members=list, put=done.append,
            first=(lambda: taken.append(sigterm_pending(identity.pid)))
            if how == "evidence first" else None,
            resumed_grace_s=0.1 if how == "resumed" else None,
        )  # fmt: skip
        assert not sigterm_pending(identity.pid)
        held[0].target()
    (stop_done,) = done
    if how == "evidence first":
        assert taken == [False]  # taken before the signal
        assert stop_done.result.got(identity) == [signal.SIGTERM, signal.SIGKILL]
    else:
        assert stop_done.result.got(identity) == [signal.SIGKILL]


def test_a_dry_run_in_watch_says_it_would_ask_for_a_restart_not_restart() -> None:
    """``watch`` relaunches nothing: its dry run said it would "restart it"."""
    job = JobConfig()
    assert stopping.dry_run_note(job, 42, "restart").endswith("roll back and restart it")
    watched = stopping.dry_run_note(job, 42, "restart", relaunches=False)
    assert watched.endswith("roll back and write verdict 91 (restart me) for whoever relaunches it")
    assert stopping.dry_run_note(job, 42, "stop", relaunches=False).endswith("and not restart it")
