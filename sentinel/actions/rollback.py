"""Rollback: move every checkpoint newer than the last clean one into a quarantine folder.

Nothing is ever deleted: a quarantined checkpoint is moved aside, within the same
filesystem, so a framework's "resume from latest" finds the clean one and a human
can still inspect (or restore) what was set aside.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from sentinel.sources.checkpoints import QUARANTINE_DIR, Checkpoint, last_clean, scan

log = logging.getLogger(__name__)

MAX_LABEL_CHARS = 120
_UNSAFE_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RollbackPlan:
    """Which checkpoint to resume from and which to set aside."""

    restore: Checkpoint | None
    quarantine: list[Checkpoint]
    onset_step: int | None


def plan_rollback(directory: Path, onset_step: int | None) -> RollbackPlan:
    """Plan a rollback over ``scan(directory)``: restore the last clean, quarantine the newer."""
    checkpoints = scan(directory, onset_step=onset_step)
    restore = last_clean(checkpoints, onset_step)
    quarantine = [c for c in checkpoints if restore is None or c.step > restore.step]
    return RollbackPlan(restore=restore, quarantine=quarantine, onset_step=onset_step)


def sanitize_label(label: str) -> str:
    """Return ``label`` as one safe path component (no separators, no leading dots)."""
    safe = _UNSAFE_LABEL_CHARS.sub("_", label).lstrip(".")[:MAX_LABEL_CHARS]
    return safe or "unlabelled"


def apply_rollback(
    plan: RollbackPlan, directory: Path, *, label: str, dry_run: bool = False
) -> list[Path]:
    """Move the plan's quarantined checkpoints to ``<directory>/quarantine/<label>/``.

    Returns the destinations used (or, with ``dry_run``, those that would be used).
    A checkpoint that vanished since the scan is logged and skipped; any other
    ``OSError`` propagates, so the caller does not restart over a half-done rollback.
    """
    target_dir = Path(os.path.abspath(directory)) / QUARANTINE_DIR / sanitize_label(label)
    if plan.quarantine and not dry_run:
        target_dir.mkdir(parents=True, exist_ok=True)
    taken: set[Path] = set()
    moved: list[Path] = []
    for checkpoint in plan.quarantine:
        if dry_run:
            destination = _free_destination(target_dir, checkpoint.path.name, taken)
            log.warning(
                "dry run: would quarantine %s (step %d, %s) to %s",
                checkpoint.path,
                checkpoint.step,
                checkpoint.status,
                destination,
            )
        else:
            try:
                destination = _move_to_free(checkpoint.path, target_dir, taken)
            except FileNotFoundError:
                log.warning(
                    "checkpoint %s vanished before it could be quarantined", checkpoint.path
                )
                continue
            log.info(
                "quarantined %s (step %d, %s%s) to %s",
                checkpoint.path,
                checkpoint.step,
                checkpoint.status,
                f": {checkpoint.reason}" if checkpoint.reason else "",
                destination,
            )
        taken.add(destination)
        moved.append(destination)
    return moved


def _free_destination(target_dir: Path, name: str, taken: set[Path]) -> Path:
    candidate = target_dir / name
    suffix = 0
    while candidate in taken or os.path.lexists(candidate):
        suffix += 1
        candidate = target_dir / f"{name}.{suffix}"
    return candidate


def _move_to_free(source: Path, target_dir: Path, taken: set[Path]) -> Path:
    """Move ``source`` into ``target_dir`` under a name nothing holds yet; return it."""
    while True:
        destination = _free_destination(target_dir, source.name, taken)
        try:
            _move(source, destination)
        except FileExistsError:
            taken.add(destination)  # appeared since the check: take the next suffix
            continue
        return destination


def _move(source: Path, destination: Path) -> None:
    # The destination was checked free just before; re-check to narrow the window,
    # since os.rename silently replaces an existing file.
    if os.path.lexists(destination):
        raise FileExistsError(errno.EEXIST, "quarantine destination exists", str(destination))
    try:
        os.rename(source, destination)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        # The checkpoint is a mount of its own: fall back to copy-then-remove.
        shutil.move(source, destination)
