"""Resume pointers set right: after a rollback, each one names the clean checkpoint.

A job restarted by someone else (kubelet, systemd, Slurm, torchrun) resumes from its
framework's pointer (``actions/pointer_find.py`` finds them). A pointer file or link is
replaced by a new one made under a temp name beside it and renamed over it
(actions/atomic.py). A ``last.ckpt`` copy is hard-linked into the quarantine, then replaced
by a copy of the clean one, never a link: a job that rewrites ``last.ckpt`` in place would
write through a link into the clean file. The quarantine's moves set the highest-N names
right. Nothing is deleted.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sentinel.checkpoints import atomic
from sentinel.checkpoints.clone import clone
from sentinel.checkpoints.pointer_find import (
    MEGATRON_ITER,
    MEGATRON_RELEASE,
    Form,
    Pointer,
    PointerKind,
    read_pointer,
)

log = logging.getLogger(__name__)

_CANNOT_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


@dataclass(frozen=True)
class Rewrite:
    """What a rollback does to one pointer: name ``clean``, saying ``says``.

    ``clean`` is None where no clean checkpoint fits the pointer; ``why`` says so and
    the pointer is left as it is.
    """

    pointer: Pointer
    clean: Path | None
    says: str = ""
    why: str = ""


@dataclass(frozen=True)
class PointerChange:
    """One pointer a rollback rewrote, as the quarantine's manifest records it.

    For a copy, ``set_aside`` is the old copy's name in the quarantine folder and
    ``size``/``mtime_ns`` identify the copy put in its place.
    """

    kind: str
    path: str
    form: str
    before: str
    after: str
    set_aside: str = ""
    size: int = 0
    mtime_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: Any) -> PointerChange | None:
        """The change a manifest records; None where the record is not one."""
        if not isinstance(record, dict):
            return None
        try:
            return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})
        except TypeError:
            return None


def plan_rewrites(
    pointers: Collection[Pointer],
    clean: Path | None,
    quarantined: Collection[Path],
    *,
    stand_in: Path | None = None,
) -> list[Rewrite]:
    """The rewrites that make ``pointers`` name ``clean`` once ``quarantined`` is moved aside.

    A pointer file or link is rewritten when what it names is quarantined or missing; a
    copy when it is itself quarantined. One that names an older clean checkpoint stays.
    ``stand_in`` is where ``clean`` is until the rollback puts it in place (a kept copy
    of a checkpoint the job deleted): what it is (a file, a folder) is read there.
    """
    aside = {Path(os.path.abspath(p)) for p in quarantined}
    rewrites = []
    for pointer in pointers:
        if pointer.form is Form.HIGHEST or (clean is not None and pointer.path == clean):
            continue
        if pointer.form is Form.COPY:
            stale = pointer.path in aside
        else:
            target = pointer.target
            stale = target is not None and (target in aside or not os.path.lexists(target))
        if stale:
            rewrites.append(_rewrite(pointer, clean, stand_in or clean))
    return rewrites


def rewrite(
    pointers: Collection[Pointer],
    clean_checkpoint: Path | None,
    quarantine_dir: Path,
    *,
    quarantined: Collection[Path] = (),
) -> list[PointerChange]:
    """Make each stale pointer name ``clean_checkpoint``; the changes made."""
    taken: set[Path] = set()
    changes = []
    for planned in plan_rewrites(pointers, clean_checkpoint, quarantined):
        change = apply_rewrite(planned, quarantine_dir, taken)
        if change is not None:
            changes.append(change)
    return changes


@dataclass(frozen=True)
class Prepared:
    """A rewrite whose new pointer is made, under a temp name beside the old one, and not yet
    renamed over it: made before a rollback's first move, so that a full disk stops the
    rollback before anything moved; renaming it needs no space."""

    planned: Rewrite
    temp: Path
    before: str


def prepare_rewrite(planned: Rewrite, *, source: Path | None = None) -> Prepared | None:
    """Make ``planned``'s new pointer under a temp name (None where nothing fits the pointer).
    ``source``: what a copy is copied from, when the clean checkpoint is not in place yet (a
    kept version still to be put back). OSError propagates, and nothing is left behind."""
    pointer, clean = planned.pointer, planned.clean
    if clean is None:
        log.warning("left %s as it is: %s", pointer.path, planned.why)
        return None
    # Tagged by a digest of the name: never "last" or ".ckpt" in a temp name, which a
    # framework's scan would take for a checkpoint.
    tag = hashlib.sha1(pointer.path.name.encode()).hexdigest()[:8]
    temp = atomic.temp_beside(pointer.path, tag=tag)
    try:
        if pointer.form is Form.COPY:
            clone(source or clean, temp)
            os.utime(temp)  # the newest last*.ckpt wins for ckpt_path="last"
            before = ""
        elif pointer.form is Form.SYMLINK:
            before = os.readlink(pointer.path)
            os.symlink(planned.says, temp)
        else:
            before = read_pointer(pointer.path)
            mode = os.stat(pointer.path).st_mode & 0o7777
            atomic.new_file(temp, planned.says, mode)
    except BaseException:
        discard(temp)
        raise
    return Prepared(planned, temp, before)


def commit_rewrite(prepared: Prepared, quarantine_dir: Path, taken: set[Path]) -> PointerChange:
    """Rename the prepared pointer over the old one (a copy: the old one set aside first)."""
    pointer, planned = prepared.planned.pointer, prepared.planned
    if pointer.form is Form.COPY:
        assert planned.clean is not None
        return _replace_copy(pointer, planned.clean, prepared.temp, quarantine_dir, taken)
    os.replace(prepared.temp, pointer.path)
    atomic.sync_dir(pointer.path.parent)
    log.info("%s now names %s (was %s)", pointer.path, planned.says, prepared.before.strip())
    return PointerChange(
        str(pointer.kind), str(pointer.path), str(pointer.form), prepared.before, planned.says
    )


def discard(temp: Path) -> None:
    """Remove a prepared pointer that will not be used (sentinel's own temp, never the job's)."""
    if os.path.lexists(temp):
        os.unlink(temp)


def apply_rewrite(planned: Rewrite, quarantine_dir: Path, taken: set[Path]) -> PointerChange | None:
    """Carry out one planned rewrite at once (None where nothing fits); OSError propagates."""
    prepared = prepare_rewrite(planned)
    if prepared is None:
        return None
    try:
        return commit_rewrite(prepared, quarantine_dir, taken)
    finally:
        discard(prepared.temp)


def _rewrite(pointer: Pointer, clean: Path | None, shape: Path | None) -> Rewrite:
    """What ``pointer`` would say to name ``clean`` (a file or a folder as ``shape`` is),
    or why it cannot."""
    if clean is None or shape is None:
        return Rewrite(pointer, None, why="no clean checkpoint to name")
    parent = pointer.path.parent
    kind = pointer.kind
    if kind in (PointerKind.DEEPSPEED_LATEST, PointerKind.DEEPSPEED_LATEST_UNIVERSAL):
        if clean.parent != parent or not shape.is_dir():
            return Rewrite(pointer, None, why=f"{clean.name} is not a DeepSpeed tag folder")
        if kind is PointerKind.DEEPSPEED_LATEST_UNIVERSAL and not (shape / "zero").is_dir():
            return Rewrite(pointer, None, why=f"{clean.name} is not a universal checkpoint")
        return Rewrite(pointer, clean, clean.name)
    if kind is PointerKind.MEGATRON_TRACKER:
        match = MEGATRON_ITER.match(clean.name)
        if clean.parent == parent and match:
            return Rewrite(pointer, clean, str(int(match.group(1))))
        if clean.parent == parent and clean.name == MEGATRON_RELEASE:
            return Rewrite(pointer, clean, MEGATRON_RELEASE)
        return Rewrite(pointer, None, why=f"{clean.name} is not a Megatron iter_NNNNNNN folder")
    if not shape.is_file():
        return Rewrite(pointer, None, why=f"{clean.name} is not a checkpoint file")
    if pointer.form is Form.SYMLINK:
        # ModelCheckpoint._link_checkpoint: os.path.relpath(filepath, dirname(linkpath)).
        return Rewrite(pointer, clean, os.path.relpath(clean, parent))
    return Rewrite(pointer, clean, clean.name)


def _replace_copy(
    pointer: Pointer, clean: Path, temp: Path, quarantine_dir: Path, taken: set[Path]
) -> PointerChange:
    """Set the copy at ``pointer.path`` aside and put the prepared copy of ``clean`` (at
    ``temp``) in its place."""
    path = pointer.path
    aside: Path | None = None
    linked = False
    try:
        stat = os.stat(temp)
        quarantine_dir.mkdir(parents=True, exist_ok=True)
        aside = _free(quarantine_dir, path.name, taken)
        try:
            os.link(path, aside)  # the old copy is in the quarantine before its name moves on
            linked = True
        except OSError as error:
            if error.errno not in _CANNOT_LINK:
                raise
            os.rename(path, aside)  # no hard links here: absent until the rename below
        os.replace(temp, path)
    except BaseException:
        discard(temp)  # sentinel's own copy, never the job's file
        if aside is not None and linked:
            os.unlink(aside)  # sentinel's second name for the job's file, which stays
        elif aside is not None and os.path.lexists(aside) and not os.path.lexists(path):
            os.rename(aside, path)  # the job's copy back under its name
        raise
    taken.add(aside)
    log.info("set the copy %s aside to %s; it is now a copy of %s", path, aside, clean.name)
    return PointerChange(
        str(pointer.kind),
        str(path),
        str(pointer.form),
        "",
        clean.name,
        set_aside=aside.name,
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
    )


def _free(folder: Path, name: str, taken: set[Path]) -> Path:
    candidate, suffix = folder / name, 0
    while candidate in taken or os.path.lexists(candidate):
        suffix += 1
        candidate = folder / f"{name}.{suffix}"
    return candidate
