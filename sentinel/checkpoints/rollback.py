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
back at its path, so the job resumes from the path it always reads. So is a
checkpoint named by its step (``model_step40.pt``, ``checkpoint-400/``) that the job
deleted as it saved the next: the kept copy goes back where the job wrote it.

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
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.checkpoints import atomic
from sentinel.checkpoints.clone import copy_tree
from sentinel.checkpoints.keep import (
    KeptVersion,
    checkpoint_problem,
    is_overwritten_file,
    kept_versions,
    version_of,
)
from sentinel.checkpoints.pointer_find import Form, find_pointers, hpc_above_clean
from sentinel.checkpoints.pointers import (
    PointerChange,
    Prepared,
    Rewrite,
    commit_rewrite,
    discard,
    plan_rewrites,
    prepare_rewrite,
)
from sentinel.checkpoints.quarantine import (
    MANIFEST,
    free_destination,
    like_checkpoint_dir,
    make_folder,
    move_to,
    read_manifest,
    sanitize_label,
)
from sentinel.checkpoints.scan import (
    QUARANTINE_DIR,
    Checkpoint,
    CheckpointStatus,
    Onset,
    checkpoint_folders,
    last_clean,
    own_root,
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

    The candidates are ``scan(directory)``'s (in ``lightning_logs``, those of every
    version's ``checkpoints/``: a clean one in an older version than the newest is found)
    and the kept versions of overwritten files. An int ``onset`` is an onset step.
    """
    if not isinstance(onset, Onset):
        onset = Onset(step=onset)
    checkpoints = scan(directory, onset=onset)
    restore = last_clean(checkpoints, onset)
    put_back: KeptVersion | None = None
    clean = {c.path for c in checkpoints if c.status == CheckpointStatus.CLEAN}
    kept = _newest_clean_kept(directory, onset, clean)
    if kept is not None and (
        restore is None or kept[1].is_newer_than(restore) or _same_save(kept[1], restore)
    ):
        put_back, restore = kept
        if _in_place(put_back, restore.path):
            put_back = None  # the clean version is the file in place: nothing to put back
    quarantine = [
        c
        for c in checkpoints
        if restore is None
        or (c.is_newer_than(restore) and not _same_clean_save(c, restore))
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
        stand_in=put_back.path if put_back is not None else None,
    )
    return RollbackPlan(restore, quarantine, onset, put_back, tuple(rewrites))


def _same_save(kept: Checkpoint, restore: Checkpoint) -> bool:
    """Whether a kept version and the last clean checkpoint on disk are two files the job
    overwrites at the same place in training (the PyTorch ImageNet example's
    ``checkpoint.pth.tar`` and its copy ``model_best.pth.tar``, both of epoch 3): the kept
    one goes back, so the name the job resumes from holds it. The copy, a few milliseconds
    newer, was resumed instead, and the job, finding no checkpoint.pth.tar, trained from
    scratch."""
    if not is_overwritten_file(restore.path.name) or kept.path == restore.path:
        return False
    if kept.step is not None or restore.step is not None:
        return kept.step == restore.step
    return kept.epoch is not None and kept.epoch == restore.epoch


def _same_clean_save(checkpoint: Checkpoint, restore: Checkpoint) -> bool:
    """A clean copy the job made of the restored save (``model_best.pth.tar`` beside the
    ``checkpoint.pth.tar`` it copied, milliseconds later): no newer, so left in place."""
    return checkpoint.status == CheckpointStatus.CLEAN and _same_save(restore, checkpoint)


def _newest_clean_kept(
    directory: Path, onset: Onset, clean: Collection[Path] = ()
) -> tuple[KeptVersion, Checkpoint] | None:
    """The newest kept version that is intact, parses and was written before the onset.

    With it, the checkpoint it makes once put back at its original path. Of two at the
    same step, a checkpoint named by its step wins over a file the job overwrites (the
    copy Lightning keeps as ``last.ckpt``): the job resumes from the name it wrote. Of two
    files the job overwrites at the same save (``_same_save``), the one whose name holds no
    clean checkpoint now (not in ``clean``) wins: its name is the one to fill.
    """
    best: tuple[KeptVersion, Checkpoint] | None = None
    kept = [
        (Path(os.path.abspath(folder)), version)
        for folder in checkpoint_folders(directory)
        for version in reversed(kept_versions(folder))
    ]
    for root, version in kept:
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
        if best is not None and not _better(candidate, version, best, clean):
            continue
        if not version.intact():
            log.warning("kept %s changed since it was kept: not resuming from it", version.path)
            continue
        problem = checkpoint_problem(version.path)
        if problem:
            log.warning("kept %s does not parse (%s): not resuming from it", version.path, problem)
            continue
        best = (version, candidate)
    return best


def _better(
    candidate: Checkpoint,
    version: KeptVersion,
    best: tuple[KeptVersion, Checkpoint],
    clean: Collection[Path] = (),
) -> bool:
    if _same_save(candidate, best[1]) and (candidate.path in clean) != (best[1].path in clean):
        return best[1].path in clean  # the name that lost its clean checkpoint is filled
    if candidate.is_newer_than(best[1]):
        return True
    return not best[1].is_newer_than(candidate) and version.stepped and not best[0].stepped


def _in_place(version: KeptVersion, path: Path) -> bool:
    found = version_of(path)
    return found is not None and found[:2] == (version.size, version.mtime_ns)


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
    """Move the plan's quarantined checkpoints to ``<directory>/quarantine/<label>/`` (from
    whichever of its ``checkpoint_folders`` each is in).

    Then put the plan's kept version back and rewrite the resume pointers that named a
    quarantined checkpoint. The folder's manifest records the whole plan before anything
    moves (each item's origin and its name in the folder), then each move, the put-back
    and each pointer's change as it is made, each write synced: a sentinel killed in the
    middle leaves a manifest that says what is where, and one that takes the rollback up
    (the same ``label``, planned again from what is still in place) adds to it. Returns
    the destinations used (or, with ``dry_run``, those that would be used). A checkpoint
    that vanished since the scan is logged and skipped; any other ``OSError`` propagates,
    so the caller does not restart over a half-done rollback.
    """
    target_dir = own_root(directory) / QUARANTINE_DIR / sanitize_label(label)
    # A last.ckpt copy is set aside by its rewrite, so that its name is never absent.
    by_rewrite = {
        r.pointer.path
        for r in plan.rewrites
        if r.clean is not None and r.pointer.form is Form.COPY and not dry_run
    }
    to_move = [c for c in plan.quarantine if c.path not in by_rewrite]
    if dry_run:
        return _dry_run(plan, to_move, target_dir)
    taken: set[Path] = set()
    moved: list[Path] = []
    if not to_move and not plan.rewrites and plan.put_back is None:
        return moved
    manifest = _Manifest(target_dir, label, plan, Path(os.path.abspath(directory)))
    planned = []
    for checkpoint in to_move:
        destination = free_destination(target_dir, checkpoint.path.name, taken)
        taken.add(destination)
        planned.append((checkpoint, destination))
    manifest.plan([_item(c, d) for c, d in planned])  # before the first move
    for folder in {r.pointer.path.parent for r in plan.rewrites}:
        atomic.sweep(folder)  # what a sentinel killed mid-rewrite left
    # The new pointers too, before the first move: a full disk stops the rollback here,
    # with nothing moved; the renames that follow need no space.
    prepared: list[Prepared] = []
    try:
        for rewrite in plan.rewrites:
            made = prepare_rewrite(rewrite, source=_copied_from(plan, rewrite))
            if made is not None:
                prepared.append(made)
        for checkpoint, destination in planned:
            done = _quarantine_one(checkpoint, destination, taken)
            if done is not None:
                moved.append(done)
                manifest.moved(checkpoint.path, done)
        back = plan.put_back
        if back is not None and plan.restore is not None and _put_back(back, plan.restore.path):
            manifest.put_back(back, plan.restore.path)
        for made in prepared:
            change = commit_rewrite(made, target_dir, taken)
            manifest.pointer(change)
            if change.set_aside:
                moved.append(target_dir / change.set_aside)
    finally:
        for made in prepared:
            discard(made.temp)  # what was not renamed into place
    manifest.complete()
    return moved


def _copied_from(plan: RollbackPlan, rewrite: Rewrite) -> Path | None:
    """What a ``last.ckpt`` copy is made of before the moves: the kept version, where the
    clean checkpoint is one still to be put back at its place (the file there now is not)."""
    back = plan.put_back
    if back is not None and plan.restore is not None and rewrite.clean == plan.restore.path:
        return back.path
    return None


def _dry_run(plan: RollbackPlan, to_move: list[Checkpoint], target_dir: Path) -> list[Path]:
    """What ``apply_rollback`` would do, logged; the destinations it would use."""
    taken: set[Path] = set()
    would = []
    for checkpoint in to_move:
        destination = free_destination(target_dir, checkpoint.path.name, taken)
        taken.add(destination)
        would.append(destination)
        log.warning(
            "dry run: would quarantine %s (step %s, %s) to %s",
            checkpoint.path,
            checkpoint.step,
            checkpoint.status,
            destination,
        )
    if plan.put_back is not None and plan.restore is not None:
        log.warning("dry run: would put kept version %s back at %s", plan.put_back.path,
                    plan.restore.path)  # fmt: skip
    for planned in plan.rewrites:
        log.warning("dry run: would rewrite %s: %s", planned.pointer.path, _would(planned))
    return would


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


def _quarantine_one(checkpoint: Checkpoint, destination: Path, taken: set[Path]) -> Path | None:
    """Move one checkpoint aside, to ``destination`` (the name the manifest planned) or,
    should something have taken it since, the next free name; None if it vanished."""
    try:
        destination = move_to(checkpoint.path, destination, taken)
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


def _put_back(version: KeptVersion, path: Path) -> bool:
    """Copy the kept ``version`` (a file, or a folder's files) to ``path`` atomically: a
    temp name beside it, then rename. False when it is there already (a rollback taken up
    after a sentinel died).

    A copy (or reflink), never a link: a job that rewrites the file in place would
    otherwise rewrite the kept version with it.
    """
    if _in_place(version, path):
        return False
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "not putting a kept version over a file", str(path))
    temp = path.with_name(f".{path.name}.sentinel-{os.getpid()}.tmp")
    if os.path.lexists(temp):
        raise FileExistsError(errno.EEXIST, "the temp name for a put-back is taken", str(temp))
    try:
        copy_tree(version.path, temp, link=False)
        if not temp.is_dir():
            os.utime(temp, ns=(version.mtime_ns, version.mtime_ns))
        os.rename(temp, path)
    except BaseException:
        # Our own copy, never the job's: made here under a name that was free.
        if temp.is_dir() and not temp.is_symlink():
            shutil.rmtree(temp)
        elif os.path.lexists(temp):
            os.unlink(temp)
        raise
    at = "" if version.step is None else f" (step {version.step})"
    log.info("put kept version %d of %s back%s", version.number, path, at)
    return True


def _item(checkpoint: Checkpoint, destination: Path) -> dict[str, Any]:
    return {
        "name": destination.name,
        "origin": str(Path(os.path.abspath(checkpoint.path))),
        "step": checkpoint.step,
        "status": str(checkpoint.status),
        "reason": checkpoint.reason,
        "moved": False,
    }


class _Manifest:
    """A quarantine folder's manifest as a rollback writes it: the plan first, then each
    step as it is done, every write a synced temp file renamed over the last."""

    def __init__(self, target_dir: Path, label: str, plan: RollbackPlan, directory: Path) -> None:
        self.folder = target_dir
        self.directory = directory
        make_folder(target_dir, directory)
        # A label used twice (a rollback taken up after a sentinel died) adds to its record.
        self.data = read_manifest(target_dir) or {
            "label": label,
            "items": [],
            "put_back": [],
            "pointers": [],
        }
        self.data["onset"] = {
            "step": plan.onset.step,
            "epoch": plan.onset.epoch,
            "time": plan.onset.time,
        }
        self.data["complete"] = False
        self._settle()

    def plan(self, items: list[dict[str, Any]]) -> None:
        known = {item.get("origin"): item for item in self.data["items"]}
        for item in items:
            earlier = known.get(item["origin"])
            if earlier is None:
                self.data["items"].append(item)
            else:  # planned before and still in place: this plan's name for it
                earlier.update(name=item["name"], moved=False)
        self._write()

    def moved(self, origin: Path, destination: Path) -> None:
        for item in self.data["items"]:
            if item.get("origin") == str(Path(os.path.abspath(origin))):
                item.update(name=destination.name, moved=True)
        self._write()

    def put_back(self, version: KeptVersion, path: Path) -> None:
        self.data["put_back"].append(
            {
                "path": str(path),
                "kept": str(version.path),
                "size": version.size,
                "mtime_ns": version.mtime_ns,
            }
        )
        self._write()

    def pointer(self, change: PointerChange) -> None:
        self.data["pointers"].append(change.to_json())
        self._write()

    def complete(self) -> None:
        self.data["complete"] = True
        self._write()

    def _settle(self) -> None:
        """Items an earlier try planned: moved, when they left their place for the folder
        before it could say so."""
        for item in self.data["items"]:
            if item.get("moved") is False and not os.path.lexists(str(item.get("origin"))):
                item["moved"] = os.path.lexists(self.folder / str(item.get("name")))

    def _write(self) -> None:
        self.data["time"] = time.time()
        text = json.dumps(self.data, indent=2) + "\n"

        def create(temp: Path) -> None:
            atomic.new_file(temp, text, 0o644)
            like_checkpoint_dir(temp, self.directory)

        atomic.replace(self.folder / MANIFEST, create)
