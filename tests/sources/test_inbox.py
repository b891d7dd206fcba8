"""Inbox: events from real threads, taken by one owner in batches, in order."""

from __future__ import annotations

import threading
import time

from sentinel.supervisor.inbox import Inbox

DEADLINE_S = 10.0
#: How long a take waits in the cases where it must wait the time out.
WAIT_S = 0.05


def test_take_returns_every_waiting_event_oldest_first() -> None:
    inbox: Inbox[int] = Inbox()
    for event in range(5):
        inbox.put(event)
    assert len(inbox) == 5
    assert inbox.take(0) == [0, 1, 2, 3, 4]
    assert len(inbox) == 0


def test_take_on_an_empty_inbox_gives_nothing_when_the_time_is_up() -> None:
    inbox: Inbox[int] = Inbox()
    assert inbox.take(0.01) == []
    assert inbox.take(0) == []


def test_a_put_from_another_thread_wakes_a_waiting_take() -> None:
    inbox: Inbox[str] = Inbox()
    taken: list[list[str]] = []
    waiter = threading.Thread(target=lambda: taken.append(inbox.take(None)))
    waiter.start()
    inbox.put("line")
    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert taken == [["line"]]


def test_events_put_while_the_owner_is_busy_come_in_one_take() -> None:
    inbox: Inbox[int] = Inbox()
    first_taken = threading.Event()
    puts_done = threading.Event()
    takes: list[list[int]] = []

    def owner() -> None:
        takes.append(inbox.take(DEADLINE_S))
        first_taken.set()
        puts_done.wait(DEADLINE_S)  # busy with the first event
        takes.append(inbox.take(DEADLINE_S))

    thread = threading.Thread(target=owner)
    thread.start()
    inbox.put(0)
    assert first_taken.wait(DEADLINE_S)
    producers = [threading.Thread(target=inbox.put, args=(n,)) for n in (1, 2, 3)]
    for producer in producers:
        producer.start()
        producer.join()
    puts_done.set()
    thread.join(DEADLINE_S)
    assert takes == [[0], [1, 2, 3]]


def test_an_event_that_can_wait_wakes_nobody_and_is_taken_when_the_time_is_up() -> None:
    inbox: Inbox[str] = Inbox()
    inbox.put("reading", wake=False)
    started = time.monotonic()
    taken = inbox.take(WAIT_S)
    # A lower bound only: had the put woken the taker, it would have returned at once.
    assert time.monotonic() - started >= WAIT_S * 0.9
    assert taken == ["reading"]


def test_an_event_that_wakes_brings_those_that_waited_before_it_in_order() -> None:
    inbox: Inbox[str] = Inbox()
    taken: list[list[str]] = []
    waiter = threading.Thread(target=lambda: taken.append(inbox.take(10 * DEADLINE_S)))
    waiter.start()
    inbox.put("reading", wake=False)
    inbox.put("line")
    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert taken == [["reading", "line"]]


def test_a_wake_given_while_the_owner_is_busy_is_not_lost() -> None:
    inbox: Inbox[str] = Inbox()
    inbox.put("line")  # nobody waits yet: the next take must not wait for it
    taken: list[list[str]] = []
    waiter = threading.Thread(target=lambda: taken.append(inbox.take(10 * DEADLINE_S)))
    waiter.start()
    waiter.join(DEADLINE_S)
    assert not waiter.is_alive()
    assert taken == [["line"]]


class _ByLength:
    """A bound on string events: each weighs its length; a shrunk one is its first letter."""

    limit = 10

    def __init__(self) -> None:
        self.shrunk: list[str] = []

    def weight(self, event: str) -> int:
        return 0 if event.startswith("exit") else len(event)

    def shrink(self, event: str) -> str:
        self.shrunk.append(event)
        return event[:1]


def test_a_bounded_inbox_shrinks_its_oldest_events_and_never_the_newest() -> None:
    bound = _ByLength()
    inbox: Inbox[str] = Inbox(bound)
    for event in ("aaaa", "exit 1", "bbbb"):
        inbox.put(event)
    assert bound.shrunk == []  # 8 <= 10: nothing shrunk yet
    inbox.put("cccc")  # 12 > 10: the oldest shrink until half the limit is left
    assert bound.shrunk == ["aaaa", "bbbb"]
    assert inbox.take(0) == ["a", "exit 1", "b", "cccc"]


def test_an_event_that_weighs_nothing_is_never_shrunk_and_a_take_starts_afresh() -> None:
    bound = _ByLength()
    inbox: Inbox[str] = Inbox(bound)
    inbox.put("exit 143")
    inbox.put("x" * 50)  # over the limit alone, but the newest: kept whole
    assert bound.shrunk == []
    assert inbox.take(0) == ["exit 143", "x" * 50]
    inbox.put("dddddddd")
    assert bound.shrunk == []  # what was taken no longer counts
    assert inbox.take(0) == ["dddddddd"]
