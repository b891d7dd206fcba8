"""``sentinel status``: what the state dir says about the last run, the job and each target.

``gather`` reads ``state.db`` without writing to it (another sentinel may be
running): the last run id, the job's state as the supervisor last wrote it,
messages still owed, each target's last delivery success and failure (with the
masked error, as the notifier stored it: ``actions.target_results``), the
heartbeat's last ping, and the disk that rollback's quarantine and the kept
copies of overwritten checkpoints take in the checkpoint dir (kv ``checkpoints.dir``,
as the supervisor recorded it, else the configured one). Beside it: the last
incident (from the reports and the open incidents sentinel keeps), its report, and
the verdict (``verdict.json``, or the one the next attempt took).

Each part is read on its own: a part that cannot be read (a garbled ``state.db``, a
directory where a file belongs, a file sentinel may not open) is named in
``Status.unreadable`` with the reason, and the rest is still shown.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sentinel.checkpoints.disk import DiskUse, disk_use, human_bytes
from sentinel.evidence.report import REPORTS_DIR, report_path
from sentinel.model.secrets import mask_tokens_data
from sentinel.model.untrusted import clipped, finite_number, json_value, printable
from sentinel.notify.outbox_store import read_pending
from sentinel.notify.target_results import TargetResult, read_results
from sentinel.service.memory import MEMORY_KEY
from sentinel.store import lock
from sentinel.store import verdict as verdicts
from sentinel.store.verdict import Verdict, VerdictUnreadable

UNKNOWN = "unknown"
STATE_DB = "state.db"
#: kv key: the checkpoint dir of the run (absolute), written by the supervisor.
CHECKPOINTS_DIR_KEY = "checkpoints.dir"
#: The newest report files read for the last incident (a state dir of years holds many).
MAX_REPORTS_READ = 64
_T = TypeVar("_T")


class NoState(Exception):
    """The state dir holds nothing sentinel writes: sentinel never ran with it."""


@dataclass(frozen=True)
class LastIncident:
    """The newest incident the state dir records, and its report when one was written."""

    id: str
    rule: str
    severity: str
    #: The step its evidence starts at (None: not known).
    step: int | None
    opened_at: float | None
    resolved_at: float | None = None
    #: The markdown report's path; None for an incident with no report (not critical).
    report: str | None = None


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
    last_incident: LastIncident | None = None
    #: ``verdict.json`` as it is now (None: there is none).
    verdict: Verdict | None = None
    #: The last verdict an attempt took when it started (``verdict.consumed.json``).
    verdict_taken: Verdict | None = None
    #: Why ``verdict.json`` could not be read; None where it could or is not there.
    verdict_unreadable: str | None = None
    #: What could not be read, each "what: why".
    unreadable: list[str] = field(default_factory=list)
    #: Whether a sentinel holds the state dir now: if not, ``job.state`` is its last record
    #: (a ``watch`` ended while it waited still read WAITING).
    sentinel_running: bool = False

    @property
    def pending_total(self) -> int:
        return sum(self.pending.values())

    @property
    def disk_over_limit(self) -> bool:
        limit = self.warn_disk_bytes
        return self.disk is not None and limit is not None and self.disk.total_bytes > limit

    def to_json(self) -> dict[str, Any]:
        """As JSON, credential-shaped words masked: the verdict's stop quotes the job's
        crash line, which may hold a token it printed (shown in full before)."""
        masked: dict[str, Any] = mask_tokens_data(self._json())
        return masked

    def _json(self) -> dict[str, Any]:
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
            "last_incident": None if self.last_incident is None else asdict(self.last_incident),
            "verdict": None if self.verdict is None else self.verdict.to_json(),
            # Beside a null verdict: why it could not be read (a verdict may be there).
            "verdict_unreadable": self.verdict_unreadable,
            "verdict_taken": None if self.verdict_taken is None else self.verdict_taken.to_json(),
            "unreadable": self.unreadable,
            "sentinel_running": self.sentinel_running,
        }

    def lines(self) -> list[str]:
        """The status for people, one line each."""
        job = self.job
        restarts = "" if job.restarts == UNKNOWN else f", {job.restarts} restart(s)"
        pid = "" if job.pid == UNKNOWN else f", pid {job.pid}"
        updated = "" if job.updated_at is None else f", since {when(job.updated_at)}"
        if not self.sentinel_running:
            updated += "; sentinel is not running (its last record)"
        heartbeat = "never sent"
        if self.heartbeat_last_ok_at is not None:
            heartbeat = f"last ok {when(self.heartbeat_last_ok_at)}"
        if self.heartbeat_last_error:
            heartbeat += f"; last error: {self.heartbeat_last_error}"
        out = [
            f"state dir:  {printable(self.state_dir)}",
            *([f"unreadable: {printable('; '.join(self.unreadable))}"] if self.unreadable else []),
            f"last run:   {self.last_run_id or UNKNOWN}",
            f"job:        {job.state}{pid}{restarts}{updated}",
            *self._incident_lines(),
            f"verdict:    {self._verdict_text()}",
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

    def _incident_lines(self) -> list[str]:
        incident = self.last_incident
        if incident is None:
            return ["incident:   none recorded"]
        step = "step unknown" if incident.step is None else f"step {incident.step}"
        opened = "" if incident.opened_at is None else f", opened {when(incident.opened_at)}"
        closed = "" if incident.resolved_at is None else f", closed {when(incident.resolved_at)}"
        out = [
            f"incident:   {incident.severity} {printable(incident.rule)} at {step}{opened}"
            f"{closed} ({printable(incident.id)})"
        ]
        if incident.report is not None:
            out.append(f"report:     {printable(incident.report)}")
        return out

    def _verdict_text(self) -> str:
        if self.verdict is not None:
            return _verdict_words(self.verdict)
        if self.verdict_unreadable is not None:
            # Not "none": `sentinel verdict` says 94, a verdict may be there (it may be 90).
            return f"unreadable ({verdicts.VERDICT_NAME} above): a verdict may be there"
        if self.verdict_taken is not None:
            taken = _verdict_words(self.verdict_taken)
            return f"none now; the last, taken when the next attempt started: {taken}"
        return "none"

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


def _verdict_words(record: Verdict) -> str:
    """A verdict record in one line: its state and code, and what it was about."""
    head = record.state
    if record.code is not None:
        head += f" {record.code} {record.verdict or verdicts.CODES.get(record.code, ('?',))[0]}"
    about = []
    if record.rule:
        about.append(printable(str(record.rule)))
    if record.step is not None:
        about.append(f"at step {record.step}")
    if record.resume_from:
        about.append(f"resume from {printable(str(record.resume_from))}")
    if record.attempt is not None:
        about.append(f"attempt {record.attempt}")
    if record.time is not None:
        about.append(when(record.time))
    return head + (f" ({', '.join(about)})" if about else "")


def when(epoch_s: float | None) -> str:
    """An epoch time as UTC for people; "never" for None."""
    if epoch_s is None:
        return "never"
    try:
        return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{epoch_s!r} (not a time)"


def gather(
    state_dir: Path, *, checkpoints: Path | None = None, warn_disk_bytes: int | None = None
) -> Status:
    """Read what ``state_dir`` holds; ``NoState`` when it holds nothing sentinel writes.

    What cannot be read is named in ``Status.unreadable`` and the rest is read still.
    The disk figures are of the checkpoint dir the run recorded, else of ``checkpoints``.
    """
    if _quietly_exists(state_dir) and not state_dir.is_dir():
        raise NoState(f"{state_dir} is not a directory: no sentinel state there")
    unreadable: list[str] = []
    database = _read_database(state_dir, unreadable)
    kv = database.kv if database is not None else {}
    verdict, verdict_unreadable = _read_verdict(state_dir, verdicts.VERDICT_NAME)
    taken, taken_unreadable = _read_verdict(state_dir, verdicts.CONSUMED_NAME)
    for name, why in (
        (verdicts.VERDICT_NAME, verdict_unreadable),
        (verdicts.CONSUMED_NAME, taken_unreadable),
    ):
        if why is not None:
            unreadable.append(f"{name}: {why}")
    incident = _last_incident(state_dir, kv, unreadable)
    if database is None and not unreadable and (verdict, taken, incident) == (None, None, None):
        raise NoState(f"no sentinel state in {state_dir} (no {STATE_DB})")
    return Status(
        state_dir=str(state_dir),
        last_run_id=kv.get("last_run_id"),
        job=JobStatus(
            state=kv.get("job.state") or UNKNOWN,
            pid=kv.get("job.pid") or UNKNOWN,
            restarts=kv.get("job.restarts") or UNKNOWN,
            updated_at=_float(kv.get("job.updated_at")),
            lines_skipped=_int(kv.get("job.lines_skipped")),
            fp16_skipped_steps=_int(kv.get("job.fp16_skipped_steps")),
        ),
        pending=database.pending if database is not None else {},
        targets=database.targets if database is not None else [],
        heartbeat_last_ok_at=_float(kv.get("heartbeat.last_ok_at")),
        heartbeat_last_error=kv.get("heartbeat.last_error") or None,
        disk=_disk(kv.get(CHECKPOINTS_DIR_KEY) or checkpoints, unreadable),
        warn_disk_bytes=warn_disk_bytes,
        last_incident=incident,
        verdict=verdict,
        verdict_taken=taken,
        verdict_unreadable=verdict_unreadable,
        unreadable=unreadable,
        sentinel_running=_held(state_dir),
    )


def _held(state_dir: Path) -> bool:
    """Whether a sentinel holds ``state_dir`` (its lock), without taking it for long."""
    try:
        return lock.holder(state_dir) is not None
    except OSError:
        return False


@dataclass(frozen=True)
class _Database:
    kv: dict[str, str]
    pending: dict[str, int]
    targets: list[TargetResult]


def _why(error: BaseException) -> str:
    """An error's reason in a few words, without the path the caller names anyway."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error) or type(error).__name__


def _regular_file(path: Path, what: str, unreadable: list[str]) -> bool:
    """Whether ``path`` is a regular file; False, saying why, when it is something else or
    cannot be looked at; False, silently, when it does not exist."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as error:
        unreadable.append(f"{what}: {_why(error)}")
        return False
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        unreadable.append(f"{what}: {kind}, not a file")
        return False
    return True


def _read_database(state_dir: Path, unreadable: list[str]) -> _Database | None:
    """state.db's kv, pending messages and target results; None when there is none to read."""
    path = state_dir / STATE_DB
    if not _regular_file(path, STATE_DB, unreadable):
        return None
    try:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            kv = _kv(conn)
            pending: dict[str, int] = _or_empty(lambda: read_pending(conn), {})
            results = list(read_results(conn).values())
    except (sqlite3.Error, OSError) as error:
        unreadable.append(f"{STATE_DB}: {_why(error)}")
        return None
    return _Database(kv, pending, results)


def _read_verdict(state_dir: Path, name: str) -> tuple[Verdict | None, str | None]:
    """The verdict record ``name`` holds, or None and why it could not be read (None: it is
    not there)."""
    try:
        return verdicts.read_strict(state_dir, name), None
    except VerdictUnreadable:
        pass
    except (NotADirectoryError, OSError):  # the state dir itself is not a folder
        return None, None
    try:
        (state_dir / name).read_text(encoding="utf-8")
    except IsADirectoryError:
        return None, "a directory, not a file"
    except OSError as error:
        return None, _why(error)
    except ValueError:
        return None, "not UTF-8 text"
    return None, "not a verdict record"


def _last_incident(
    state_dir: Path, kv: dict[str, str], unreadable: list[str]
) -> LastIncident | None:
    """The newest incident opened: of those with a report, and of those open when sentinel
    last saved what it knew (a warning has no report)."""
    found = [*_reported(state_dir, unreadable), *_remembered(kv, unreadable)]
    if not found:
        return None
    newest = max(found, key=lambda data: _float(str(data.get("opened_at"))) or 0.0)
    incident_id = str(newest.get("id"))
    report = report_path(state_dir, incident_id)
    step = newest.get("onset_step")
    return LastIncident(
        id=incident_id,
        rule=str(newest.get("rule")),
        severity=str(newest.get("severity")),
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        opened_at=_float(str(newest.get("opened_at"))),
        resolved_at=_float(str(newest.get("resolved_at"))),
        report=str(report) if _quietly_a_file(report) else None,
    )


def _reported(state_dir: Path, unreadable: list[str]) -> Iterable[dict[str, Any]]:
    """The incidents of the newest report files (``reports/<id>.json``)."""
    folder = state_dir / REPORTS_DIR
    try:
        with os.scandir(folder) as listing:
            listed = list(listing)
    except (FileNotFoundError, NotADirectoryError) as error:
        if isinstance(error, NotADirectoryError) and _quietly_exists(folder):
            unreadable.append(f"{REPORTS_DIR}/: not a directory")
        return []
    except OSError as error:
        unreadable.append(f"{REPORTS_DIR}/: {_why(error)}")
        return []
    found: list[dict[str, Any]] = []
    bad: list[str] = []
    entries = []
    for entry in listed:
        if not entry.name.endswith(".json"):
            continue  # a report's .md is looked at where it is shown
        try:
            entries.append((entry.stat().st_mtime, entry.path))
        except OSError as error:  # this file (a symlink loop), not the folder
            bad.append(f"{REPORTS_DIR}/{entry.name}: {_why(error)}")
    newest = sorted(entries, reverse=True)
    for _, path in newest[:MAX_REPORTS_READ]:
        try:
            data = json_value(Path(path).read_text(encoding="utf-8"))
        except OSError as error:
            bad.append(f"{REPORTS_DIR}/{Path(path).name}: {_why(error)}")
            continue
        except ValueError:  # not UTF-8, or not JSON
            bad.append(f"{REPORTS_DIR}/{Path(path).name}: not an incident report")
            continue
        if isinstance(data, dict) and "id" in data and "rule" in data:
            found.append(data)
        else:
            bad.append(f"{REPORTS_DIR}/{Path(path).name}: not an incident report")
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        unreadable.append(bad[0] + more)
    return found


def _remembered(kv: dict[str, str], unreadable: list[str]) -> list[dict[str, Any]]:
    """The open incidents in what sentinel last saved of the run."""
    text = kv.get(MEMORY_KEY)
    if not text:
        return []
    try:
        memory = json_value(text)
        incidents = memory["incidents"]
        return [data for data in incidents if isinstance(data, dict) and "id" in data]
    except (ValueError, TypeError, KeyError) as error:
        unreadable.append(f"{STATE_DB} {MEMORY_KEY}: {_why(error)}")
        return []


def _quietly_a_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):  # ValueError: a NUL in a name read from the state
        return False


def _quietly_exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except (OSError, ValueError):
        return False
    return True


def _disk(directory: str | Path | None, unreadable: list[str]) -> DiskUse | None:
    if directory is None:
        return None
    named = printable(clipped(str(directory), 200))
    try:
        if not Path(directory).is_dir():
            return None
        return disk_use(Path(directory))
    except ValueError:  # a NUL in the name the state holds
        unreadable.append(f"checkpoint dir {named}: not a path")
        return None
    except OSError as error:
        unreadable.append(f"checkpoint dir {named}: {_why(error)}")
        return None


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
    """A number the state holds; None where it holds none, or one no time or count is
    (``nan``, ``inf``: not even JSON)."""
    try:
        return None if value is None else finite_number(float(value))
    except ValueError:
        return None


def _int(value: str | None) -> int:
    try:
        return 0 if value is None else int(value)
    except ValueError:
        return 0
