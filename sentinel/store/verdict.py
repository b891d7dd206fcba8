"""What sentinel decided about a job, for the orchestrator: exit codes and ``verdict.json``.

Two phases (docs/watch.md, "Verdicts"). Before its first signal sentinel marks
``<state-dir>/verdict.json`` ``"state": "deciding"`` (``mark_deciding``: best
effort, it never raises and does not sync, so the signal is not held up);
once the job is gone and the rollback is done, or has failed, it writes the
final record (``write_final``) and, with ``--verdict-file``, the bare code on
one line. ``clear`` sets the record aside when the next attempt starts (as
``verdict.consumed.json``: who asks later hears that the verdict was taken, not
that there was none). Every write is a temp file renamed over the old one, so a
reader sees a whole record or the one before it, never half of one.

``read`` is the loop's own, forgiving read; ``read_strict`` is the wrapper's, for which a
record that exists but cannot be read (permissions, a corrupt file) is an answer of its
own (``VerdictUnreadable``, exit 94): it may be a 90, so nothing should restart on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from sentinel.model.untrusted import finite_number, json_value
from sentinel.store.state import open_private, private_dir

_T = TypeVar("_T")

log = logging.getLogger(__name__)

#: Give up: the same failure came back at the same step, or the restart budget is
#: spent. An orchestrator should not retry.
EXIT_GIVE_UP = 90
#: Rolled back: the resume pointers name the last clean checkpoint. Restart the job.
EXIT_ROLLED_BACK = 91
#: A hardware or node fault (GPU XID, ECC): retry on another node.
EXIT_NODE_FAULT = 92
#: ``sentinel verdict`` only: a verdict exists or may exist but cannot be read (permissions,
#: a corrupt record). It may be a 90: do not retry until a person looks.
EXIT_UNREADABLE = 94

#: Each verdict code, its name in the record, and what it means.
CODES: dict[int, tuple[str, str]] = {
    EXIT_GIVE_UP: ("give_up", "give up, do not retry: same failure again, or restarts spent"),
    EXIT_ROLLED_BACK: ("rolled_back", "rolled back, restart me: pointers name a clean checkpoint"),
    EXIT_NODE_FAULT: ("node_fault", "hardware or node fault (GPU XID, ECC): retry elsewhere"),
}

VERDICT_NAME = "verdict.json"
#: The last record an attempt took when it started (``clear``).
CONSUMED_NAME = "verdict.consumed.json"
DECIDING = "deciding"
FINAL = "final"


@dataclass(frozen=True)
class Verdict:
    """A ``verdict.json`` record; ``code`` and ``verdict`` are None while deciding."""

    state: str
    code: int | None = None
    verdict: str | None = None
    rule: str | None = None
    step: int | None = None
    resume_from: str | None = None
    attempt: int | None = None
    time: float | None = None
    #: The stop this verdict is about, as ``stop_intent`` records it (None: none recorded).
    stop: dict[str, Any] | None = None

    @property
    def final(self) -> bool:
        return self.state == FINAL and self.code is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "verdict": self.verdict,
            "rule": self.rule,
            "step": self.step,
            "resume_from": self.resume_from,
            "attempt": self.attempt,
            "time": self.time,
            "state": self.state,
            **({} if self.stop is None else {"stop": self.stop}),
        }


class VerdictUnreadable(Exception):
    """A verdict record exists, or may exist, but cannot be read; the message says why."""


def verdict_path(state_dir: Path) -> Path:
    return state_dir / VERDICT_NAME


def mark_deciding(
    state_dir: Path,
    *,
    rule: str | None,
    step: int | None,
    attempt: int | None,
    time: float,
    stop: dict[str, Any] | None = None,
) -> bool:
    """Mark that sentinel is about to stop the job; False (logged) when the write failed.

    Called right before the first signal: it never raises and does not sync, so
    a full or read-only disk costs the mark, never the signal. ``stop``: what was decided
    (``stop_intent``), for a sentinel that starts after this one died.
    """
    record = Verdict(DECIDING, rule=rule, step=step, attempt=attempt, time=time, stop=stop)
    try:
        _replace(verdict_path(state_dir), _dumps(record), sync=False)
    except (OSError, ValueError) as error:
        log.warning("could not mark the verdict as deciding in %s: %s", state_dir, error)
        return False
    return True


def write_deciding(
    state_dir: Path,
    *,
    rule: str | None,
    step: int | None,
    attempt: int | None,
    time: float,
    stop: dict[str, Any],
) -> None:
    """The "deciding" record with the stop as it now stands, synced. Raises ``OSError``."""
    record = Verdict(DECIDING, rule=rule, step=step, attempt=attempt, time=time, stop=stop)
    _replace(verdict_path(state_dir), _dumps(record), sync=True)


def update_stop(state_dir: Path, stop: dict[str, Any]) -> None:
    """The record as it is, deciding or final, with ``stop`` as it now stands, synced.
    Raises ``OSError`` (and ``VerdictUnreadable`` when there is no record to update)."""
    record = read_strict(state_dir)
    if record is None:
        raise VerdictUnreadable(f"no {VERDICT_NAME} in {state_dir} to update")
    _replace(verdict_path(state_dir), _dumps(replace(record, stop=stop)), sync=True)


def write_final(
    state_dir: Path,
    code: int,
    verdict: str | None,
    rule: str | None,
    step: int | None,
    resume_from: str | Path | None,
    attempt: int | None,
    time: float,
    verdict_file: Path | None = None,
    stop: dict[str, Any] | None = None,
) -> Verdict:
    """Write the final record (and the bare code to ``verdict_file``), each synced.

    ``verdict`` defaults to the code's name (``CODES``). Raises ``OSError`` when a
    write fails: the caller logs it and still exits with ``code``. ``stop``: the stop as
    it ends (``stop_intent``: a rollback's restart still to come).
    """
    if code not in CODES:
        raise ValueError(f"not a verdict code: {code} (one of {sorted(CODES)})")
    record = Verdict(
        FINAL,
        code=code,
        verdict=verdict or CODES[code][0],
        rule=rule,
        step=step,
        resume_from=None if resume_from is None else os.path.abspath(resume_from),
        attempt=attempt,
        time=time,
        stop=stop,
    )
    _replace(verdict_path(state_dir), _dumps(record), sync=True)
    if verdict_file is not None:
        _replace(verdict_file, f"{code}\n", sync=True, private=False)
    return record


def clear(state_dir: Path) -> None:
    """Set the record aside as consumed (the next attempt has started); a failure is logged,
    not raised."""
    try:
        os.rename(verdict_path(state_dir), state_dir / CONSUMED_NAME)
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("could not clear the verdict in %s: %s", state_dir, error)


def read_strict(state_dir: Path, name: str = VERDICT_NAME) -> Verdict | None:
    """The record ``name`` in ``state_dir``; None when there is surely none (no such file in
    a folder that can be read); ``VerdictUnreadable`` when one may exist but cannot be read."""
    path = state_dir / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise VerdictUnreadable(f"cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:  # not UTF-8
        raise VerdictUnreadable(f"{path} is not a verdict record: {error}") from None
    try:
        return _parse(json_value(text))
    except (TypeError, ValueError) as error:
        raise VerdictUnreadable(f"{path} is not a verdict record: {error}") from None


def consumed(state_dir: Path) -> Verdict | None:
    """The last record an attempt took when it started, when there is one to read."""
    try:
        return read_strict(state_dir, CONSUMED_NAME)
    except VerdictUnreadable:
        return None


def read(state_dir: Path) -> Verdict | None:
    """The record in ``state_dir``; None when there is none or it cannot be read (logged)."""
    path = verdict_path(state_dir)
    try:
        data = json_value(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("could not read %s: %s", path, error)
        return None
    try:
        return _parse(data)
    except (TypeError, ValueError) as error:
        log.warning("%s is not a verdict record: %s", path, error)
        return None


def _parse(data: Any) -> Verdict:
    if not isinstance(data, dict) or data.get("state") not in (DECIDING, FINAL):
        raise ValueError("no state of deciding or final")
    code = data.get("code")
    if data["state"] == FINAL and (isinstance(code, bool) or code not in CODES):
        raise ValueError(f"a final record with code {code!r}")
    return Verdict(
        state=data["state"],
        code=code,
        verdict=_of(str, data.get("verdict")),
        rule=_of(str, data.get("rule")),
        step=_of(int, data.get("step")),
        resume_from=_of(str, data.get("resume_from")),
        attempt=_of(int, data.get("attempt")),
        time=finite_number(data.get("time")),
        stop=data.get("stop") if isinstance(data.get("stop"), dict) else None,
    )


def _of(kind: type[_T], value: Any) -> _T | None:
    """A field of the record as its type says (a bool is no int); None where it holds
    something else (a record edited by hand: a step that is text)."""
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    return None


def _dumps(record: Verdict) -> str:
    return json.dumps(record.to_json(), allow_nan=False) + "\n"


def replace_file(path: Path, text: str) -> None:
    """``path`` holds ``text``, written whole (a temp file renamed over it), private."""
    _replace(path, text, sync=False)


def _replace(path: Path, text: str, *, sync: bool, private: bool = True) -> None:
    """Write ``text`` to a temp file beside ``path`` and rename it over ``path``."""
    if private:
        private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    fd = open_private(tmp, flags) if private else os.open(tmp, flags, 0o644)
    try:
        try:
            os.write(fd, text.encode())
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    if sync:
        _sync_dir(path.parent)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
