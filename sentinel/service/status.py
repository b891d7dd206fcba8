"""``sentinel status``: what the state dir says about the last run, the job and each target.

``gather`` reads ``state.db`` without writing to it (another sentinel may be
running): the last run id, the job's state as the supervisor last wrote it,
messages still owed, each target's last delivery success and failure (with the
masked error, as the notifier stored it: ``actions.target_results``), the
heartbeat's last ping, and the disk that rollback's quarantine and the kept
copies of overwritten checkpoints take in the checkpoint dir (kv ``checkpoints.dir``,
as the supervisor recorded it, else the configured one).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sentinel.checkpoints.disk import DiskUse, disk_use, human_bytes
from sentinel.notify.outbox_store import read_pending
from sentinel.notify.target_results import TargetResult, read_results

UNKNOWN = "unknown"
#: kv key: the checkpoint dir of the run (absolute), written by the supervisor.
CHECKPOINTS_DIR_KEY = "checkpoints.dir"
_T = TypeVar("_T")


class NoState(Exception):
    """The state dir holds no state.db: sentinel never ran with it."""


@dataclass(frozen=True)
class JobStatus:
    """The job as the supervisor last recorded it (kv ``job.*``); "unknown" when it did not."""

    state: str = UNKNOWN
    pid: str = UNKNOWN
    restarts: str = UNKNOWN
    updated_at: float | None = None
    #: Output lines left unparsed to keep up with a flood (``sentinel.supervisor.shedding``).
    lines_skipped: int = 0
    #: Steps the fp16 loss scaler skipped in this attempt (``detectors.skipped``).
    fp16_skipped_steps: int = 0


@dataclass(frozen=True)
class Status:
    """Everything ``sentinel status`` shows."""

    state_dir: str
    last_run_id: str | None
    job: JobStatus
    #: Undelivered messages, by target name.
    pending: dict[str, int]
    targets: list[TargetResult] = field(default_factory=list)
    heartbeat_last_ok_at: float | None = None
    heartbeat_last_error: str | None = None
    #: Quarantine and kept copies in the checkpoint dir; None when no dir is known.
    disk: DiskUse | None = None
    #: ``[keep] warn_disk_bytes``: warn above this many bytes.
    warn_disk_bytes: int | None = None

    @property
    def pending_total(self) -> int:
        return sum(self.pending.values())

    @property
    def disk_over_limit(self) -> bool:
        limit = self.warn_disk_bytes
        return self.disk is not None and limit is not None and self.disk.total_bytes > limit

    def to_json(self) -> dict[str, Any]:
        return {
            "state_dir": self.state_dir,
            "last_run_id": self.last_run_id,
            "job": asdict(self.job),
            "pending_messages": self.pending_total,
            "pending_by_target": self.pending,
            "targets": [asdict(target) for target in self.targets],
            "heartbeat": {
                "last_ok_at": self.heartbeat_last_ok_at,
                "last_error": self.heartbeat_last_error,
            },
            "disk": None
            if self.disk is None
            else {
                "checkpoints": str(self.disk.directory),
                "quarantine_bytes": self.disk.quarantine_bytes,
                "kept_bytes": self.disk.kept_bytes,
                "total_bytes": self.disk.total_bytes,
                "warn_disk_bytes": self.warn_disk_bytes,
                "over_limit": self.disk_over_limit,
            },
        }

    def lines(self) -> list[str]:
        """The status for people, one line each."""
        job = self.job
        restarts = "" if job.restarts == UNKNOWN else f", {job.restarts} restart(s)"
        pid = "" if job.pid == UNKNOWN else f", pid {job.pid}"
        updated = "" if job.updated_at is None else f", since {when(job.updated_at)}"
        heartbeat = "never sent"
        if self.heartbeat_last_ok_at is not None:
            heartbeat = f"last ok {when(self.heartbeat_last_ok_at)}"
        if self.heartbeat_last_error:
            heartbeat += f"; last error: {self.heartbeat_last_error}"
        out = [
            f"state dir:  {self.state_dir}",
            f"last run:   {self.last_run_id or UNKNOWN}",
            f"job:        {job.state}{pid}{restarts}{updated}",
            *(
                [f"output:     {job.lines_skipped} line(s) skipped to keep up with a flood"]
                if job.lines_skipped
                else []
            ),
            *(
                [f"fp16:       {job.fp16_skipped_steps} step(s) the loss scaler skipped (counted)"]
                if job.fp16_skipped_steps
                else []
            ),
            f"messages:   {self.pending_total} pending",
            f"heartbeat:  {heartbeat}",
            *self._disk_lines(),
            "targets:" if self.targets or self.pending else "targets:    none tried yet",
        ]
        names = {target.name for target in self.targets} | set(self.pending)
        results = {target.name: target for target in self.targets}
        for name in sorted(names):
            result = results.get(name, TargetResult(name))
            out.append(f"  {name}")
            out.append(
                f"    last success: {when(result.last_success_at)}"
                f"   last failure: {when(result.last_failure_at)}"
                f"   pending: {self.pending.get(name, 0)}"
            )
            if result.last_error:
                out.append(f"    last error:   {result.last_error}")
        return out

    def _disk_lines(self) -> list[str]:
        disk = self.disk
        if disk is None:
            return ["disk:       no checkpoint dir known"]
        out = [
            f"disk:       quarantine {human_bytes(disk.quarantine_bytes)},"
            f" kept copies {human_bytes(disk.kept_bytes)} (in {disk.directory})"
        ]
        if self.disk_over_limit and self.warn_disk_bytes is not None:
            out.append(
                f"warning:    quarantine and kept copies take {human_bytes(disk.total_bytes)},"
                f" over the {human_bytes(self.warn_disk_bytes)} of [keep] warn_disk_bytes;"
                " nothing is deleted by itself"
            )
        return out


def when(epoch_s: float | None) -> str:
    """An epoch time as UTC for people; "never" for None."""
    if epoch_s is None:
        return "never"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def gather(
    state_dir: Path, *, checkpoints: Path | None = None, warn_disk_bytes: int | None = None
) -> Status:
    """Read the status from ``state_dir``'s state.db; raise ``NoState`` when there is none.

    The disk figures are of the checkpoint dir the run recorded, else of ``checkpoints``.
    """
    path = state_dir / "state.db"
    if not path.is_file():
        raise NoState(f"no sentinel state in {state_dir} (no state.db)")
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
        kv = _kv(conn)
        pending: dict[str, int] = _or_empty(lambda: read_pending(conn), {})
        results = list(read_results(conn).values())
    return Status(
        state_dir=str(state_dir),
        last_run_id=kv.get("last_run_id"),
        job=JobStatus(
            state=kv.get("job.state") or UNKNOWN,
            pid=kv.get("job.pid") or UNKNOWN,
            restarts=kv.get("job.restarts") or UNKNOWN,
            updated_at=_float(kv.get("job.updated_at")),
            lines_skipped=int(kv.get("job.lines_skipped") or 0),
            fp16_skipped_steps=int(kv.get("job.fp16_skipped_steps") or 0),
        ),
        pending=pending,
        targets=results,
        heartbeat_last_ok_at=_float(kv.get("heartbeat.last_ok_at")),
        heartbeat_last_error=kv.get("heartbeat.last_error") or None,
        disk=_disk(kv.get(CHECKPOINTS_DIR_KEY) or checkpoints),
        warn_disk_bytes=warn_disk_bytes,
    )


def _disk(directory: str | Path | None) -> DiskUse | None:
    if directory is None or not Path(directory).is_dir():
        return None
    return disk_use(Path(directory))


def _kv(conn: sqlite3.Connection) -> dict[str, str]:
    rows: list[Any] = _or_empty(lambda: conn.execute("SELECT key, value FROM kv").fetchall(), [])
    return {str(key): str(value) for key, value in rows}


def _or_empty(read: Callable[[], _T], empty: _T) -> _T:
    """``read()``, or ``empty`` when its table does not exist (sentinel never got that far)."""
    try:
        return read()
    except sqlite3.OperationalError as error:
        if "no such table" in str(error):
            return empty
        raise


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None
