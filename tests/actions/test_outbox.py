"""The outbox in a real SQLite state DB: grouping, cancelling, the rate limit's digest, results.

Time is simulated: every call takes ``now``, so windows are crossed without waiting.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sentinel.model import secrets
from sentinel.model.records import Severity
from sentinel.notify.notices import JobInfo, Notice, NoticeKind
from sentinel.notify.outbox import Added, Batching, Outbox, Target
from sentinel.store.state import StateStore

T0 = 1_700_000_000.0
JOB = JobInfo("llama-ft", "gpu-node-7", "run-1")
SLACK = "json://127.0.0.1:1/slack"
PAGER = "json://127.0.0.1:1/pager"
GROUPED = Batching(group_wait_s=30.0, rate_limit=100, rate_window_s=3600.0)


def notice(
    kind: NoticeKind = NoticeKind.OPENED,
    incident: str = "run-1-1",
    rule: str = "nan_inf",
    severity: Severity = Severity.CRITICAL,
    at: float = T0,
) -> Notice:
    alert = {"rule": rule, "severity": str(severity), "message": f"{rule} {kind}", "time": at}
    return Notice(kind, incident, rule, severity, alert, at)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StateStore]:
    state = StateStore(tmp_path / "state")
    yield state
    state.close()


@pytest.fixture
def outbox(store: StateStore) -> Outbox:
    return Outbox(store, [Target(SLACK, "slack"), Target(PAGER, "pager")])


def kinds(outbox: Outbox, url: str = SLACK) -> list[list[str]]:
    """Each stored message of ``url``: its notices' kinds and rules."""
    return [
        [f"{n.kind}:{n.rule}" for n in message.envelope.notices] for message in outbox.messages(url)
    ]


def test_notices_within_group_wait_share_one_message(outbox: Outbox) -> None:
    assert outbox.add(notice(), JOB, [SLACK], T0, GROUPED) == {SLACK: Added.NEW}
    actions = notice(NoticeKind.ACTIONS, at=T0 + 29)
    assert outbox.add(actions, JOB, [SLACK], T0 + 29, GROUPED) == {SLACK: Added.JOINED}
    assert kinds(outbox) == [["opened:nan_inf", "actions:nan_inf"]]
    (message,) = outbox.messages(SLACK)
    assert message.next_attempt_at == T0 + 30
    assert message.envelope.job == JOB


def test_notice_after_the_group_window_starts_a_new_message(outbox: Outbox) -> None:
    outbox.add(notice(), JOB, [SLACK], T0, GROUPED)
    assert outbox.add(notice(NoticeKind.ACTIONS), JOB, [SLACK], T0 + 30, GROUPED) == {
        SLACK: Added.NEW
    }
    assert kinds(outbox) == [["opened:nan_inf"], ["actions:nan_inf"]]


def test_message_taken_for_sending_is_not_joined(outbox: Outbox) -> None:
    outbox.add(notice(), JOB, [SLACK], T0, Batching(group_wait_s=0.0))
    (taken,) = outbox.due(T0, limit=10)
    outbox.add(notice(NoticeKind.ACTIONS), JOB, [SLACK], T0, GROUPED)
    assert kinds(outbox) == [["opened:nan_inf"], ["actions:nan_inf"]]
    assert [n.kind for n in taken.envelope.notices] == [NoticeKind.OPENED]


def test_each_target_groups_on_its_own(outbox: Outbox) -> None:
    outbox.add(notice(), JOB, [SLACK, PAGER], T0, GROUPED)
    outbox.add(notice(NoticeKind.ACTIONS), JOB, [SLACK], T0 + 1, GROUPED)
    assert kinds(outbox, SLACK) == [["opened:nan_inf", "actions:nan_inf"]]
    assert kinds(outbox, PAGER) == [["opened:nan_inf"]]
    keys = {message.envelope.key for message in outbox.messages()}
    assert len(keys) == 2, "every message has a key of its own"


def test_a_full_message_starts_another(outbox: Outbox) -> None:
    small = Batching(group_wait_s=30.0, max_notices=2)
    added = [
        outbox.add(notice(incident=f"i-{n}"), JOB, [SLACK], T0, small)[SLACK] for n in range(3)
    ]
    assert added == [Added.NEW, Added.JOINED, Added.NEW]
    assert [len(m.envelope.notices) for m in outbox.messages(SLACK)] == [2, 1]


def test_zero_group_wait_sends_each_notice_alone_at_once(outbox: Outbox) -> None:
    at_once = Batching(group_wait_s=0.0)
    outbox.add(notice(), JOB, [SLACK], T0, at_once)
    outbox.add(notice(NoticeKind.ACTIONS), JOB, [SLACK], T0, at_once)
    assert kinds(outbox) == [["opened:nan_inf"], ["actions:nan_inf"]]
    assert len(outbox.due(T0)) == 2


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ([], []),
        ([("opened", "i-1")], [["opened:stall"]]),
    ],
    ids=["resolve-alone", "resolve-after-its-open"],
)
def test_reopen_cancels_a_resolve_still_waiting(
    outbox: Outbox, before: list[tuple[str, str]], after: list[list[str]]
) -> None:
    for kind, incident in before:
        outbox.add(notice(NoticeKind(kind), incident, "stall"), JOB, [SLACK], T0, GROUPED)
    outbox.add(notice(NoticeKind.RESOLVED, "i-1", "stall"), JOB, [SLACK], T0 + 1, GROUPED)
    reopened = outbox.add(notice(NoticeKind.OPENED, "i-2", "stall"), JOB, [SLACK], T0 + 2, GROUPED)
    assert reopened == {SLACK: Added.CANCELLED}
    assert kinds(outbox) == after


def test_reopen_of_another_rule_cancels_nothing(outbox: Outbox) -> None:
    outbox.add(notice(NoticeKind.RESOLVED, "i-1", "stall"), JOB, [SLACK], T0, GROUPED)
    outbox.add(notice(NoticeKind.OPENED, "i-2", "nan_inf"), JOB, [SLACK], T0 + 1, GROUPED)
    assert kinds(outbox) == [["resolved:stall", "opened:nan_inf"]]


def test_resolve_already_sent_is_not_cancelled(outbox: Outbox) -> None:
    outbox.add(notice(NoticeKind.RESOLVED, "i-1", "stall"), JOB, [SLACK], T0, GROUPED)
    outbox.due(T0 + 30)
    added = outbox.add(notice(NoticeKind.OPENED, "i-2", "stall"), JOB, [SLACK], T0 + 31, GROUPED)
    assert added == {SLACK: Added.NEW}


LIMITED = Batching(group_wait_s=0.0, rate_limit=3, rate_window_s=100.0, digest_notices=2)


def test_rate_limit_folds_the_rest_into_one_digest_due_when_the_window_allows(
    outbox: Outbox,
) -> None:
    rules = ["stall", "nan_inf", "stall", "loss_spike", "stall", "stall", "nan_inf"]
    added = [
        outbox.add(notice(incident=f"i-{n}", rule=rule), JOB, [SLACK], T0 + n, LIMITED)[SLACK]
        for n, rule in enumerate(rules)
    ]
    assert added == [Added.NEW] * 3 + [Added.FOLDED] * 4
    *sent, digest = outbox.messages(SLACK)
    assert len(sent) == 3 and digest.digest
    # The first of the three leaves the window at T0 + 100: the digest may go then.
    assert digest.next_attempt_at == T0 + 100
    assert len(digest.envelope.notices) == 2
    counted = [n.rule for n in digest.envelope.notices]
    for rule, count in digest.envelope.folded.items():
        counted += [rule] * count
    assert sorted(counted) == sorted(rules[3:])


def test_digest_keeps_the_most_severe_notices_in_full(outbox: Outbox) -> None:
    levels = [Severity.WARNING] * 5 + [Severity.CRITICAL] + [Severity.WARNING] * 2
    for n, severity in enumerate(levels):
        outbox.add(notice(incident=f"i-{n}", severity=severity), JOB, [SLACK], T0, LIMITED)
    digest = outbox.messages(SLACK)[-1]
    assert [(n.incident_id, n.severity) for n in digest.envelope.notices] == [
        ("i-3", Severity.WARNING),
        ("i-5", Severity.CRITICAL),
    ]
    assert digest.envelope.folded == {"nan_inf": 3}


def test_after_the_window_messages_flow_again(outbox: Outbox) -> None:
    for n in range(4):
        outbox.add(notice(incident=f"i-{n}"), JOB, [SLACK], T0, LIMITED)
    outbox.due(T0 + 100)  # the three and the digest go
    assert outbox.add(notice(incident="i-9"), JOB, [SLACK], T0 + 201, LIMITED) == {SLACK: Added.NEW}


def test_release_on_stop_makes_grouping_messages_due_but_not_a_digest(outbox: Outbox) -> None:
    limited = Batching(group_wait_s=30.0, rate_limit=1, rate_window_s=100.0)
    outbox.add(notice(incident="i-1"), JOB, [SLACK], T0, limited)
    outbox.add(notice(incident="i-2"), JOB, [SLACK], T0 + 40, limited)  # the digest
    assert outbox.due(T0 + 1) == []
    assert outbox.release_groups(T0 + 1) == 1
    (due,) = outbox.due(T0 + 1)
    assert due.envelope.notices[0].incident_id == "i-1"


def test_key_is_stable_across_attempts_and_reopening(store: StateStore, outbox: Outbox) -> None:
    outbox.add(notice(), JOB, [SLACK], T0, Batching())
    (first,) = outbox.due(T0)
    outbox.mark_failed(first, "Connection refused", next_attempt_at=T0 + 5)
    assert outbox.due(T0 + 4) == []
    (again,) = Outbox(store, [Target(SLACK, "slack")]).due(T0 + 5)
    assert again.envelope.key == first.envelope.key
    assert again.attempts == 1


def test_rows_of_targets_no_longer_configured_are_neither_sent_nor_counted(
    store: StateStore, outbox: Outbox
) -> None:
    outbox.add(notice(), JOB, [SLACK, PAGER], T0, Batching())
    only_pager = Outbox(store, [Target(PAGER, "pager")])
    assert [d.name for d in only_pager.due(T0)] == ["pager"]
    assert only_pager.pending_count() == 1
    assert outbox.pending_count() == 2


def test_urls_are_never_stored(store: StateStore) -> None:
    secret_url = "json://user:s3cr3t-T0KEN@127.0.0.1:1/hook"
    outbox = Outbox(store, [Target(secret_url, "json://user:****@127.0.0.1:1/hook")])
    outbox.add(notice(), JOB, [secret_url], T0, Batching())
    (delivery,) = outbox.due(T0)
    outbox.mark_failed(delivery, "refused", T0 + 1)
    with sqlite3.connect(store.path) as db:
        dump = "\n".join(db.iterdump())
    assert "s3cr3t-T0KEN" not in dump
    assert "json://user:****@127.0.0.1:1/hook" in dump


def test_a_secret_quoted_by_an_alert_is_stored_masked(store: StateStore, outbox: Outbox) -> None:
    """A job that prints a known token into the line an alert quotes leaves no copy on disk."""
    token = "qu0ted-T0KEN-7c1e"
    secrets.register([token])
    quoted = replace(notice(), alert={**notice().alert, "message": f"loss nan; url=/x/{token}"})
    outbox.add(quoted, JOB, [SLACK], T0, Batching())
    with sqlite3.connect(store.path) as db:
        dump = "\n".join(db.iterdump())
    assert token not in dump
    (message,) = outbox.messages(SLACK)
    assert message.envelope.notices[0].alert["message"] == "loss nan; url=/x/****"


def test_depth_counts_again_after_each_write_of_the_outbox_and_only_then(
    store: StateStore, outbox: Outbox
) -> None:
    """The depth a clock tick reports is counted once per write of the outbox, not per tick:
    a row written behind its back (the state dir is the outbox's alone) shows at its next
    write, while ``pending_count`` always counts."""
    assert outbox.depth() == 0
    outbox.add(notice(), JOB, [SLACK, PAGER], T0, Batching())
    assert outbox.depth() == 2
    slack, pager = sorted(outbox.due(T0), key=lambda d: d.name, reverse=True)
    outbox.mark_delivered(slack, T0 + 1)
    assert outbox.depth() == 1
    outbox.mark_failed(pager, "Connection refused", next_attempt_at=T0 + 5)
    assert outbox.depth() == 1

    behind = Outbox(store, [Target(SLACK, "slack")])
    behind.add(notice(incident="run-1-2"), JOB, [SLACK], T0 + 2, Batching())
    assert outbox.pending_count() == 2
    assert outbox.depth() == 1, "counted again without a write of its own"
    outbox.release_groups(T0 + 3)
    assert outbox.depth() == 2
