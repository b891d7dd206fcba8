"""The outbox's policy as pure functions: where a notice goes, and when the rate limit holds."""

from __future__ import annotations

import pytest

from sentinel.model.records import Severity
from sentinel.notify.notices import NoticeKind
from sentinel.notify.outbox import Added, Batching, fold, limited_until, place
from sentinel.notify.outbox_store import OpenMessage
from tests.helpers.notices import T0, notice

BATCHING = Batching(group_wait_s=30.0, rate_limit=2, rate_window_s=60.0, max_notices=2)


def message(
    row_id: int, *kinds: NoticeKind, digest: bool = False, group_until: float = T0 + 30
) -> OpenMessage:
    return OpenMessage(row_id, [notice(kind).to_json() for kind in kinds], {}, digest, group_until)


def test_a_notice_joins_the_newest_open_message() -> None:
    newest, older = message(2, NoticeKind.OPENED), message(1, NoticeKind.OPENED)
    placed = place(notice(NoticeKind.ESCALATED), [newest, older], T0, BATCHING)
    assert placed is not None and placed == (Added.JOINED, newest)
    assert [item["kind"] for item in newest.notices] == ["opened", "escalated"]
    assert len(older.notices) == 1


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param([], id="no-open-message"),
        pytest.param([message(1, NoticeKind.OPENED, group_until=T0)], id="group-closed"),
        pytest.param([message(1, NoticeKind.OPENED, NoticeKind.ESCALATED)], id="full"),
    ],
)
def test_a_notice_needs_a_message_of_its_own(rows: list[OpenMessage]) -> None:
    assert place(notice(NoticeKind.ESCALATED), rows, T0, BATCHING) is None


def test_a_reopen_cancels_its_pending_resolve() -> None:
    row = message(1, NoticeKind.RESOLVED)
    placed = place(notice(NoticeKind.OPENED), [row], T0, BATCHING)
    assert placed == (Added.CANCELLED, row)
    assert row.notices == []  # the store deletes a message left empty


def test_a_pending_digest_takes_what_the_open_messages_cannot() -> None:
    digest = message(1, NoticeKind.OPENED, digest=True, group_until=T0)
    placed = place(notice(NoticeKind.ESCALATED), [digest], T0, BATCHING)
    assert placed == (Added.FOLDED, digest)


def test_a_digest_keeps_the_worst_and_counts_the_rest() -> None:
    digest = message(1, digest=True)
    for rule, severity in [("a", Severity.WARNING), ("b", Severity.CRITICAL), ("c", Severity.INFO)]:
        fold(digest, notice(NoticeKind.OPENED, rule=rule, severity=severity), keep=2)
    assert [item["rule"] for item in digest.notices] == ["a", "b"]
    assert digest.folded == {"c": 1}


@pytest.mark.parametrize(
    ("recent_due", "until"),
    [
        pytest.param([], None, id="none-sent"),
        pytest.param([T0 - 10], None, id="under-the-limit"),
        pytest.param([T0 - 10, T0 - 50], T0 + 10, id="at-the-limit-until-the-oldest-leaves"),
    ],
)
def test_the_rate_limit(recent_due: list[float], until: float | None) -> None:
    assert limited_until(recent_due, T0, BATCHING) == until
