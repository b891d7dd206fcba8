"""Rollback: move every checkpoint newer than the last clean one into a quarantine folder.

Nothing is ever deleted: a quarantined checkpoint is moved aside (renamed; from another
filesystem, copied whole before it is removed: cross_device.py), so a framework's "resume
from latest" finds the clean one and a human can still inspect (or restore,
``sentinel checkpoints --restore``) what was set aside. The quarantine folders and their
manifests take the checkpoint dir's owner and mode.
Each quarantine folder holds a manifest of where every item came from (the folder's
labels, moves and manifest: actions/quarantine.py).

A file the job overwrites at every save (``ckpt.pt``) has its clean versions kept
by the keeper (actions/keep.py); when the newest clean version before the onset is
a kept one, the poisoned file in place is quarantined and the kept version is put
back at its path, so the job resumes from the path it always reads.

A job restarted by someone else resumes from its framework's pointer (DeepSpeed's
``latest``, Megatron's tracker, Lightning's ``last.ckpt``): after the moves each one
that named a quarantined checkpoint is rewritten to name the clean one (actions/pointers.py),
and the manifest records how it read before.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.checkpoints.clone import clone
from sentinel.checkpoints.keep import KeptVersion, kept_versions, weights_problem
from sentinel.checkpoints.pointer_find import Form, find_pointers, hpc_above_clean
from sentinel.checkpoints.pointers import PointerChange, Rewrite, apply_rewrite, plan_rewrites
from sentinel.checkpoints.quarantine import (
    MANIFEST,
    free_destination,
    like_checkpoint_dir,
    make_folder,
    move_to_free,
    read_manifest,
    sanitize_label,
)
from sentinel.checkpoints.scan import (
    QUARANTINE_DIR,
    Checkpoint,
    CheckpointStatus,
    Onset,
    last_clean,
    scan,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RollbackPlan:
    """Which checkpoint to resume from and which to set aside."""

    restore: Checkpoint | None
    quarantine: list[Checkpoint]
    onset: Onset
    #: The kept version that goes back to ``restore.path`` once the file there is
    #: quarantined; None when the checkpoint to resume from is in place already.
    put_back: KeptVersion | None = None
    #: What happens to each resume pointer that names a quarantined checkpoint.
    rewrites: tuple[Rewrite, ...] = ()

    @property
    def onset_step(self) -> int | None:
        return self.onset.step


def plan_rollback(directory: Path, onset: Onset | int | None) -> RollbackPlan:
    """Plan a rollback: restore the last clean checkpoint, quarantine every newer one.

    The kept versions of overwritten files are candidates beside ``scan(directory)``.
    An int ``onset`` is an onset step.
    """
    if not isinstance(onset, Onset):
        onset = Onset(step=onset)
    checkpoints = scan(directory, onset=onset)
    restore = last_clean(checkpoints, onset)
    put_back: KeptVersion | None = None
    kept = _newest_clean_kept(directory, onset)
    if kept is not None and (restore is None or kept[1].is_newer_than(restore)):
        put_back, restore = kept
        if _in_place(put_back, restore.path):
            put_back = None  # the clean version is the file in place: nothing to put back
    quarantine = [
        c
        for c in checkpoints
        if restore is None
        or c.is_newer_than(restore)
        or (put_back is not None and c.path == restore.path)
    ]
    if (
        put_back is not None
        and restore is not None
        and not any(c.path == restore.path for c in quarantine)
    ):
        quarantine.extend(_unscanned(restore.path, put_back))
    quarantine.extend(hpc_above_clean(checkpoints, [c.path for c in quarantine]))
    rewrites = plan_rewrites(
        find_pointers(directory),
        restore.path if restore is not None else None,
        [c.path for c in quarantine],
    )
    return RollbackPlan(restore, quarantine, onset, put_back, tuple(rewrites))


def _newest_clean_kept(directory: Path, onset: Onset) -> tuple[KeptVersion, Checkpoint] | None:
    """The newest kept version that is intact, parses and was written before the onset.

    With it, the checkpoint it makes once put back at its original path.
    """
    root = Path(os.path.abspath(directory))
    best: tuple[KeptVersion, Checkpoint] | None = None
    for version in reversed(kept_versions(directory)):
        if onset.reaches(version.step, version.epoch, version.mtime):
            continue
        candidate = Checkpoint(
            root / version.original.name,
            version.step,
            CheckpointStatus.CLEAN,
            f"kept version {version.number} ({version.method})",
            version.mtime,
            version.epoch,
            placed_by=f"kept version {version.number}",
        )
        if best is not None and not candidate.is_newer_than(best[1]):
            continue
        if not version.intact():
            log.warning("kept %s changed since it was kept: not resuming from it", version.path)
            continue
        problem = weights_problem(version.path)
        if problem:
            log.warning("kept %s does not parse (%s): not resuming from it", version.path, problem)
            continue
        best = (version, candidate)
    return best


def _in_place(version: KeptVersion, path: Path) -> bool:
    try:
        stat = os.stat(path)
    except OSError:
        return False
    return (stat.st_size, stat.st_mtime_ns) == (version.size, version.mtime_ns)


def _unscanned(path: Path, version: KeptVersion) -> list[Checkpoint]:
    """The file in place that the scan did not list (none where nothing is there)."""
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return []
    reason = f"rewritten since kept version {version.number}"
    return [Checkpoint(path, None, CheckpointStatus.AFTER_ONSET, reason, mtime)]


def apply_rollback(
    plan: RollbackPlan, directory: Path, *, label: str, dry_run: bool = False
) -> list[Path]:
    """Move the plan's quarantined checkpoints to ``<directory>/quarantine/<label>/``.

    Then put the plan's kept version back, rewrite the resume pointers that named a
    quarantined checkpoint, and record where each item came from and how each pointer
    read before in the folder's manifest. Returns the destinations used (or, with ``dry_run``, those
    that would be used). A checkpoint that vanished since the scan is logged and
    skipped; any other ``OSError`` propagates, so the caller does not restart over a
    half-done rollback (the manifest still records what moved).
    """
    target_dir = Path(os.path.abspath(directory)) / QUARANTINE_DIR / sanitize_label(label)
    if plan.quarantine and not dry_run:
        make_folder(target_dir)
    taken: set[Path] = set()
    moved: list[Path] = []
    items: list[dict[str, Any]] = []
    changes: list[PointerChange] = []
    # A last.ckpt copy is set aside by its rewrite, so that its name is never absent.
    by_rewrite = {
        r.pointer.path
        for r in plan.rewrites
        if r.clean is not None and r.pointer.form is Form.COPY and not dry_run
    }
    try:
        for checkpoint in plan.quarantine:
            if checkpoint.path in by_rewrite:
                continue
            destination = _quarantine_one(checkpoint, target_dir, taken, dry_run=dry_run)
            if destination is None:
                continue
            taken.add(destination)
            moved.append(destination)
            items.append(_item(checkpoint, destination))
        if plan.put_back is not None and plan.restore is not None:
            _put_back(plan.put_back, plan.restore.path, dry_run=dry_run)
        for planned in plan.rewrites:
            if dry_run:
                log.warning("dry run: would rewrite %s: %s", planned.pointer.path, _would(planned))
                continue
            change = apply_rewrite(planned, target_dir, taken)
            if change is not None:
                changes.append(change)
                if change.set_aside:
                    moved.append(target_dir / change.set_aside)
    finally:
        if (items or changes) and not dry_run:
            _record(target_dir, label, plan, items, changes)
    return moved


def pointer_note(plan: RollbackPlan) -> str:
    """For the incident's timeline: which resume pointers the rollback rewrote, and which not."""
    done = [f"{r.pointer.path.name} -> {r.says}" for r in plan.rewrites if r.clean is not None]
    left = [f"{r.pointer.path.name} ({r.why})" for r in plan.rewrites if r.clean is None]
    parts = []
    if done:
        parts.append(f"resume pointers now name the clean checkpoint: {', '.join(done)}")
    if left:
        parts.append(f"resume pointers left as they were: {', '.join(left)}")
    return "; ".join(parts)


def _would(planned: Rewrite) -> str:
    if planned.clean is None:
        return f"left as it is ({planned.why})"
    if planned.pointer.form is Form.COPY:
        return f"set the copy aside, copy {planned.clean.name} in its place"
    return f"would name {planned.says} (was {planned.pointer.says})"


def _quarantine_one(
    checkpoint: Checkpoint, target_dir: Path, taken: set[Path], *, dry_run: bool
) -> Path | None:
    """Move one checkpoint aside; its destination (None if it vanished)."""
    if dry_run:
        destination = free_destination(target_dir, checkpoint.path.name, taken)
        log.warning(
            "dry run: would quarantine %s (step %s, %s) to %s",
            checkpoint.path,
            checkpoint.step,
            checkpoint.status,
            destination,
        )
        return destination
    try:
        destination = move_to_free(checkpoint.path, target_dir, taken)
    except FileNotFoundError:
        log.warning("checkpoint %s vanished before it could be quarantined", checkpoint.path)
        return None
    log.info(
        "quarantined %s (step %s, %s%s) to %s",
        checkpoint.path,
        checkpoint.step,
        checkpoint.status,
        f": {checkpoint.reason}" if checkpoint.reason else "",
        destination,
    )
    return destination


def _put_back(version: KeptVersion, path: Path, *, dry_run: bool) -> None:
    """Copy the kept ``version`` to ``path`` atomically: a temp name beside it, then rename.

    A copy (or reflink), never a link: a job that rewrites the file in place would
    otherwise rewrite the kept version with it.
    """
    if dry_run:
        log.warning("dry run: would put kept version %s back at %s", version.path, path)
        return
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "not putting a kept version over a file", str(path))
    temp = path.with_name(f".{path.name}.sentinel-{os.getpid()}.tmp")
    clone(version.path, temp)
    try:
        os.utime(temp, ns=(version.mtime_ns, version.mtime_ns))
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)  # our own copy, never the job's file
        raise
    log.info("put kept version %d of %s back (step %s)", version.number, path, version.step)


def _item(checkpoint: Checkpoint, destination: Path) -> dict[str, Any]:
    return {
        "name": destination.name,
        "origin": str(Path(os.path.abspath(checkpoint.path))),
        "step": checkpoint.step,
        "status": str(checkpoint.status),
        "reason": checkpoint.reason,
    }


def _record(
    target_dir: Path,
    label: str,
    plan: RollbackPlan,
    items: list[dict[str, Any]],
    changes: list[PointerChange],
) -> None:
    """Add ``items`` and ``changes`` to the folder's manifest (a label may be used twice).

    Written to a temp file, then renamed over.
    """
    path = target_dir / MANIFEST
    make_folder(target_dir)
    manifest = read_manifest(target_dir) or {
        "label": label,
        "items": [],
        "put_back": [],
        "pointers": [],
    }
    manifest["items"].extend(items)
    manifest["pointers"].extend(change.to_json() for change in changes)
    manifest["onset"] = {
        "step": plan.onset.step,
        "epoch": plan.onset.epoch,
        "time": plan.onset.time,
    }
    manifest["time"] = time.time()
    version = plan.put_back
    if version is not None and plan.restore is not None and os.path.lexists(plan.restore.path):
        manifest["put_back"].append(
            {
                "path": str(plan.restore.path),
                "kept": str(version.path),
                "size": version.size,
                "mtime_ns": version.mtime_ns,
            }
        )
    temp = path.with_name(f"{MANIFEST}.tmp")
    temp.write_text(json.dumps(manifest, indent=2) + "\n")
    like_checkpoint_dir(temp, target_dir.parent.parent)
    os.replace(temp, path)
