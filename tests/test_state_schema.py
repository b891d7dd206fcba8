"""The state dir's schema version: an older one is migrated, one sentinel cannot read is
moved aside whole (never deleted) and sentinel starts afresh, saying so in one line."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.model.untrusted import json_value
from sentinel.process.relayed import CURRENT, JobRecord, jobs_dir
from sentinel.service.memory import MEMORY_KEY, load_memory
from sentinel.store.state import SCHEMA_VERSION, StateStore
from sentinel.store.stop_intent import DRY_RUN_NAME, dry_run_stop
from tests.helpers.env import clean_env


def _unversioned(state: Path) -> None:
    """A state dir as sentinel 0.1 left it: the same tables, no version mark."""
    state.mkdir(mode=0o700)
    with sqlite3.connect(state / "state.db") as conn:
        conn.executescript(
            "CREATE TABLE offsets (dev INTEGER NOT NULL, inode INTEGER NOT NULL,"
            " path TEXT NOT NULL, offset INTEGER NOT NULL, head_hash TEXT NOT NULL,"
            " tail_hash TEXT NOT NULL, PRIMARY KEY (dev, inode));"
            "CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "INSERT INTO kv VALUES ('restarts.count', '2');"
        )


def test_a_new_state_dir_carries_the_schema_version(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.schema_version == SCHEMA_VERSION
    store.close()
    with sqlite3.connect(tmp_path / "state" / "state.db") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_an_older_state_dir_is_migrated_and_keeps_what_it_knew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _unversioned(tmp_path / "state")
    with caplog.at_level(logging.INFO, logger="sentinel.store.state"):
        store = StateStore(tmp_path / "state")
    assert store.schema_version == SCHEMA_VERSION
    assert store.get("restarts.count") == "2"
    assert f"migrated the state from schema 0 to {SCHEMA_VERSION}" in caplog.text
    store.close()


@pytest.mark.parametrize("written_by", ["newer", "garbage"])
def test_a_state_db_it_cannot_read_is_moved_aside_and_sentinel_starts_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, written_by: str
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    if written_by == "newer":
        with sqlite3.connect(state / "state.db") as conn:
            conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("INSERT INTO kv VALUES ('restarts.count', '5')")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        why = f"written by a newer sentinel (schema {SCHEMA_VERSION + 1}"
    else:
        (state / "state.db").write_bytes(b"not a database, " * 512)
        why = "is not a sentinel state database"
    before = (state / "state.db").read_bytes()
    with caplog.at_level(logging.WARNING, logger="sentinel.store.state"):
        store = StateStore(state)
    assert store.get("restarts.count") is None, "started afresh"
    store.put("restarts.count", "1")
    assert store.schema_version == SCHEMA_VERSION
    store.close()
    aside = [p for p in state.iterdir() if p.name.startswith("state.db.unreadable-")]
    assert len(aside) == 1, sorted(p.name for p in state.iterdir())
    assert aside[0].read_bytes() == before, "the old database is kept, byte for byte"
    (record,) = [r for r in caplog.records if "afresh" in r.getMessage()]
    assert why in record.getMessage() and "started afresh" in record.getMessage()


def test_a_table_of_the_same_name_with_other_columns_is_set_aside_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``kv`` made by hand with other columns: every later read and write failed (oos47b)."""
    state = tmp_path / "state"
    StateStore(state).close()
    with sqlite3.connect(state / "state.db") as conn:
        conn.execute("DROP TABLE kv")
        conn.execute("CREATE TABLE kv (a TEXT, b TEXT)")
    with caplog.at_level(logging.WARNING, logger="sentinel.store.state"):
        store = StateStore(state)
    store.put("restarts.count", "1")
    assert store.get("restarts.count") == "1"
    store.close()
    assert "a table kv without sentinel's columns (key, value)" in caplog.text
    assert [p for p in state.iterdir() if p.name.startswith("state.db.unreadable-")]


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("state.db", lambda path: path.mkdir()),
        ("state.db", lambda path: os.symlink(path.name, path)),  # a loop
        ("state.db-shm", lambda path: path.mkdir()),
        ("lock", lambda path: path.mkdir()),
        ("lock", lambda path: os.symlink(path.name, path)),
        ("alerts.jsonl", lambda path: path.mkdir()),
        ("alerts.jsonl", lambda path: os.symlink(path.name, path)),
    ],
    ids=["db-is-a-dir", "db-symlink-loop", "shm-is-a-dir", "lock-is-a-dir", "lock-symlink-loop",
         "journal-is-a-dir", "journal-symlink-loop"],
)  # fmt: skip
@pytest.mark.slow
def test_a_state_file_sentinel_cannot_use_is_one_line_and_exit_2_before_the_job(
    tmp_path: Path, name: str, make: Callable[[Path], object]
) -> None:
    """Each ended ``run`` and ``watch`` in a traceback (oos47b)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    make(state / name)
    marker = tmp_path / "job-ran"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--",
         sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("sentinel: ")]
    assert f"the state dir's {name} cannot be used" in line, result.stderr
    assert not marker.exists(), "the job never started"


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "edit",
    ["memory-deep", "memory-a-list", "job-record-deep", "dry-run-stop-deep"],
)
def test_a_state_file_nested_too_deep_or_of_another_shape_reads_as_none(
    tmp_path: Path, edit: str
) -> None:
    """Each of these ended ``run`` or ``checkpoints`` in a traceback (RecursionError,
    AttributeError) where the reader meant to say "unreadable" and go on (oos47b)."""
    store = StateStore(tmp_path)
    if edit.startswith("memory"):
        store.put(MEMORY_KEY, DEEP if edit == "memory-deep" else "[1, 2]")
        assert load_memory(store) is None
    elif edit == "job-record-deep":
        jobs_dir(tmp_path).mkdir(parents=True)
        (jobs_dir(tmp_path) / CURRENT).write_text(DEEP)
        assert JobRecord.load(tmp_path) is None
    else:
        (tmp_path / DRY_RUN_NAME).write_text(DEEP)
        assert dry_run_stop(tmp_path) is None
    store.close()


def test_json_nested_too_deep_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deep"):
        json_value(DEEP)
    assert json_value('{"a": [1]}') == {"a": [1]}


@pytest.mark.slow
def test_a_state_dir_that_is_a_symlink_loop_is_one_line_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    os.symlink(state.name, state)
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(state), "--", "true"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"sentinel: the state dir {state} cannot be used" in result.stderr
