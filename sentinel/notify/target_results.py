"""Each notification target's last delivery: written by the notifier, read by ``sentinel status``.

One row a target in ``state.db``'s ``notify_targets`` table, by the hash of its
URL (never the URL): when it was last tried, last succeeded, last failed, and
the last error, masked.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from sentinel.model.untrusted import finite_number
from sentinel.notify.outbox import target_hash
from sentinel.store.state import StateStore

_RESULTS_TABLE = """
CREATE TABLE IF NOT EXISTS notify_targets (
    target_hash TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    last_attempt_at REAL,
    last_success_at REAL,
    last_failure_at REAL,
    last_error TEXT
)
"""


@dataclass(frozen=True)
class TargetResult:
    """How delivery to one target last went (epoch seconds; the error is masked)."""

    name: str
    last_attempt_at: float | None = None
    last_success_at: float | None = None
    last_failure_at: float | None = None
    last_error: str | None = None


def record_result(store: StateStore, url: str, name: str, now: float, error: str | None) -> None:
    """Store the outcome of one delivery attempt to ``url`` (``error`` masked; None: success)."""
    outcome = (
        "last_success_at = :now" if error is None else "last_failure_at = :now, last_error = :error"
    )
    with store.transaction() as conn:
        conn.execute(_RESULTS_TABLE)
        conn.execute(
            "INSERT INTO notify_targets (target_hash, name) VALUES (:hash, :name)"
            " ON CONFLICT (target_hash) DO UPDATE SET name = excluded.name",
            {"hash": target_hash(url), "name": name},
        )
        conn.execute(
            f"UPDATE notify_targets SET last_attempt_at = :now, {outcome}"
            " WHERE target_hash = :hash",
            {"now": now, "error": error, "hash": target_hash(url)},
        )


def read_results(conn: sqlite3.Connection) -> dict[str, TargetResult]:
    """Every target's last delivery outcome as stored, by target hash."""
    try:
        rows: list[Any] = conn.execute(
            "SELECT target_hash, name, last_attempt_at, last_success_at, last_failure_at,"
            " last_error FROM notify_targets ORDER BY name"
        ).fetchall()
    except sqlite3.OperationalError as error:
        if "no such table" in str(error):  # no delivery was ever attempted
            return {}
        raise
    return {str(row[0]): _result(*row[1:]) for row in rows}


def _result(name: Any, attempt: Any, success: Any, failure: Any, error: Any) -> TargetResult:
    """A row as stored, where each field holds what it should; anything else (a row edited by
    hand: a time that is text, a name that is a number) reads as not known."""
    return TargetResult(
        name if isinstance(name, str) else "",
        finite_number(attempt),
        finite_number(success),
        finite_number(failure),
        error if isinstance(error, str) else None,
    )
