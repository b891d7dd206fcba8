"""Resume pointers: what each framework's "resume from latest" reads, found and set right.

A job restarted by someone else (kubelet, systemd, Slurm, torchrun) resumes from its
framework's pointer: DeepSpeed's ``latest``/``latest_universal`` (a tag, the folder
beside it), Megatron's ``latest_checkpointed_iteration.txt`` (``40`` names
``iter_0000040``, or ``release``), Lightning's ``last*.ckpt`` (a symlink or a copy, the
newest mtime wins) and on SLURM its ``hpc_ckpt_N.ckpt`` with the highest N (a save
counter, not a step), HF's ``checkpoint-N`` with the highest N.

After a rollback each names the clean checkpoint. A pointer file or link is replaced
by a new one made under a temp name beside it and renamed over it (actions/atomic.py).
A ``last.ckpt`` copy is hard-linked into the quarantine, then replaced by a copy of the
clean one, never a link: a job that rewrites ``last.ckpt`` in place would write through
a link into the clean file. The quarantine's moves set the highest-N names right.
Nothing is deleted.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sentinel.actions import atomic
from sentinel.actions.clone import clone
from sentinel.sources.checkpoints import Checkpoint, CheckpointStatus

log = logging.getLogger(__name__)

DEEPSPEED_LATEST = "latest"
DEEPSPEED_LATEST_UNIVERSAL = "latest_universal"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_RELEASE = "release"
#: Lightning's HPC checkpoints: any name holding this, numbered after it.
LIGHTNING_HPC_KEY = "hpc_ckpt_"
# A pointer file holds a short name; anything longer is not one.
_MAX_POINTER_BYTES = 4096
# ModelCheckpoint._find_last_checkpoints: suffix ".ckpt", re.match on the stem.
_LIGHTNING_LAST = re.compile(r"^last(-(\d+))?")
# transformers.trainer_utils: _re_checkpoint = re.compile(r"^" + "checkpoint" + r"\-(\d+)$")
_HF_CHECKPOINT = re.compile(r"^checkpoint\-(\d+)$")
_MEGATRON_ITER = re.compile(r"^iter_(\d{7,})$")
_CANNOT_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


class PointerKind(StrEnum):
    """Which framework reads the pointer, and which of its pointers it is."""

    DEEPSPEED_LATEST = "deepspeed latest"
    DEEPSPEED_LATEST_UNIVERSAL = "deepspeed latest_universal"
    MEGATRON_TRACKER = "megatron tracker"
    LIGHTNING_LAST = "lightning last"
    LIGHTNING_HPC = "lightning hpc"
    HF_LAST = "hf last checkpoint"


class Form(StrEnum):
    """How a pointer names its checkpoint."""

    FILE = "file"  # a text file holding the name
    SYMLINK = "symlink"
    COPY = "copy"  # a copy of the checkpoint under the pointer's name
    HIGHEST = "highest number"  # the name with the highest number wins


@dataclass(frozen=True)
class Pointer:
    """One resume pointer in a checkpoint dir and the checkpoint it names.

    ``path`` is the pointer (for ``HIGHEST``, the entry that wins); ``says`` is what it
    holds (a tag, an iteration, a link's text, the winning name); ``target`` is the
    checkpoint that resolves to, None where it holds nothing the framework can use.
    """

    kind: PointerKind
    path: Path
    form: Form
    says: str
    target: Path | None

    def describe(self) -> str:
        """One line: the pointer, what it names, and whether that is there."""
        if self.form is Form.HIGHEST:
            return f"{self.kind}: {self.path.name} (highest number)"
        if self.form is Form.COPY:
            return f"{self.kind}: {self.path.name} is a copy (a checkpoint of its own)"
        if self.target is None:
            return f"{self.kind}: {self.path.name} holds {self.says!r}, which names nothing"
        there = "" if os.path.lexists(self.target) else " (missing)"
        return f"{self.kind}: {self.path.name} -> {_shown(self.target, self.path)}{there}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "path": str(self.path),
            "form": str(self.form),
            "says": self.says,
            "target": None if self.target is None else str(self.target),
            "exists": self.target is not None and os.path.lexists(self.target),
        }


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


def find_pointers(directory: Path) -> list[Pointer]:
    """The resume pointers directly inside ``directory``, as each framework reads them."""
    root = Path(os.path.abspath(directory))
    try:
        with os.scandir(root) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        log.warning("cannot list %s for resume pointers: %s", root, error)
        return []
    found: list[Pointer] = []
    for entry in entries:
        try:
            pointer = _pointer_file(root, entry)
        except FileNotFoundError:
            continue  # replaced between listing and reading: the job's own save
        except OSError as error:
            log.warning("cannot read the resume pointer %s: %s", root / entry.name, error)
            continue
        if pointer is not None:
            found.append(pointer)
    found.extend(_highest(root, entries))
    return found


def plan_rewrites(
    pointers: Collection[Pointer], clean: Path | None, quarantined: Collection[Path]
) -> list[Rewrite]:
    """The rewrites that make ``pointers`` name ``clean`` once ``quarantined`` is moved aside.

    A pointer file or link is rewritten when what it names is quarantined or missing; a
    copy when it is itself quarantined. One that names an older clean checkpoint stays.
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
            rewrites.append(_rewrite(pointer, clean))
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


def apply_rewrite(planned: Rewrite, quarantine_dir: Path, taken: set[Path]) -> PointerChange | None:
    """Carry out one planned rewrite (None where nothing fits); OSError propagates."""
    pointer, clean = planned.pointer, planned.clean
    if clean is None:
        log.warning("left %s as it is: %s", pointer.path, planned.why)
        return None
    if pointer.form is Form.COPY:
        return _replace_copy(pointer, clean, quarantine_dir, taken)
    if pointer.form is Form.SYMLINK:
        before = os.readlink(pointer.path)
        atomic.symlink(pointer.path, planned.says)
    else:
        before = read_pointer(pointer.path)
        atomic.write_text(pointer.path, planned.says)
    log.info("%s now names %s (was %s)", pointer.path, planned.says, before.strip())
    return PointerChange(
        str(pointer.kind), str(pointer.path), str(pointer.form), before, planned.says
    )


def _pointer_file(root: Path, entry: os.DirEntry[str]) -> Pointer | None:
    name = entry.name
    path = root / name
    if name in (DEEPSPEED_LATEST, DEEPSPEED_LATEST_UNIVERSAL) and _is_file(entry):
        # deepspeed/runtime/engine.py load_checkpoint: tag = fd.read().strip(), then
        # os.path.join(load_dir, tag).
        kind = (
            PointerKind.DEEPSPEED_LATEST
            if name == DEEPSPEED_LATEST
            else PointerKind.DEEPSPEED_LATEST_UNIVERSAL
        )
        tag = read_pointer(path).strip()
        return Pointer(kind, path, Form.FILE, tag, root / tag if tag else None)
    if name == MEGATRON_TRACKER and _is_file(entry):
        # megatron/training/checkpointing.py read_metadata + get_checkpoint_name.
        says = read_pointer(path).strip()
        return Pointer(
            PointerKind.MEGATRON_TRACKER, path, Form.FILE, says, _iteration_dir(root, says)
        )
    stem, suffix = os.path.splitext(name)
    if suffix == ".ckpt" and _LIGHTNING_LAST.match(stem):
        if entry.is_symlink():
            says = os.readlink(path)
            return Pointer(
                PointerKind.LIGHTNING_LAST,
                path,
                Form.SYMLINK,
                says,
                Path(os.path.normpath(root / says)),
            )
        if _is_file(entry):
            return Pointer(PointerKind.LIGHTNING_LAST, path, Form.COPY, name, path)
    return None


def _highest(root: Path, entries: list[os.DirEntry[str]]) -> Iterator[Pointer]:
    """The names whose highest number wins: HF's ``checkpoint-N``, Lightning's HPC saves."""
    hf = [(int(m.group(1)), e.name) for e in entries if (m := _HF_CHECKPOINT.search(e.name))]
    hf = [(n, name) for n, name in hf if (root / name).is_dir()]
    if hf:
        name = max(hf)[1]
        yield Pointer(PointerKind.HF_LAST, root / name, Form.HIGHEST, name, root / name)
    hpc = [(n, e.name) for e in entries if (n := hpc_number(e.name)) is not None]
    if hpc:
        name = max(hpc)[1]
        yield Pointer(PointerKind.LIGHTNING_HPC, root / name, Form.HIGHEST, name, root / name)


def hpc_number(name: str) -> int | None:
    """The N Lightning's SLURM resume reads from ``hpc_ckpt_N.ckpt``; None for other names.

    As CheckpointConnector.__max_ckpt_version_in_folder: any name holding the key,
    every digit after it.
    """
    if LIGHTNING_HPC_KEY not in name:
        return None
    digits = re.sub("[^0-9]", "", name.split(LIGHTNING_HPC_KEY)[-1])
    return int(digits) if digits else None


def hpc_above_clean(
    checkpoints: Sequence[Checkpoint], quarantined: Collection[Path]
) -> list[Checkpoint]:
    """The ``hpc_ckpt_N`` left above the highest clean one, to set aside as well.

    Lightning's SLURM resume loads the highest N whatever it holds, so one that is
    corrupt or unfinished must not stay above the clean one.
    """
    aside = set(quarantined)
    left = [
        (number, c)
        for c in checkpoints
        if c.path not in aside and (number := hpc_number(c.path.name)) is not None
    ]
    floor = max((n for n, c in left if c.status is CheckpointStatus.CLEAN), default=-1)
    return [c for n, c in left if n > floor]


def _iteration_dir(root: Path, says: str) -> Path | None:
    if says == MEGATRON_RELEASE:
        return root / MEGATRON_RELEASE
    try:
        iteration = int(says)
    except ValueError:
        return None
    return root / f"iter_{iteration:07d}" if iteration > 0 else None


def _rewrite(pointer: Pointer, clean: Path | None) -> Rewrite:
    """What ``pointer`` would say to name ``clean``, or why it cannot."""
    if clean is None:
        return Rewrite(pointer, None, why="no clean checkpoint to name")
    parent = pointer.path.parent
    kind = pointer.kind
    if kind in (PointerKind.DEEPSPEED_LATEST, PointerKind.DEEPSPEED_LATEST_UNIVERSAL):
        if clean.parent != parent or not clean.is_dir():
            return Rewrite(pointer, None, why=f"{clean.name} is not a DeepSpeed tag folder")
        if kind is PointerKind.DEEPSPEED_LATEST_UNIVERSAL and not (clean / "zero").is_dir():
            return Rewrite(pointer, None, why=f"{clean.name} is not a universal checkpoint")
        return Rewrite(pointer, clean, clean.name)
    if kind is PointerKind.MEGATRON_TRACKER:
        match = _MEGATRON_ITER.match(clean.name)
        if clean.parent == parent and match:
            return Rewrite(pointer, clean, str(int(match.group(1))))
        if clean.parent == parent and clean.name == MEGATRON_RELEASE:
            return Rewrite(pointer, clean, MEGATRON_RELEASE)
        return Rewrite(pointer, None, why=f"{clean.name} is not a Megatron iter_NNNNNNN folder")
    if not clean.is_file():
        return Rewrite(pointer, None, why=f"{clean.name} is not a checkpoint file")
    if pointer.form is Form.SYMLINK:
        # ModelCheckpoint._link_checkpoint: os.path.relpath(filepath, dirname(linkpath)).
        return Rewrite(pointer, clean, os.path.relpath(clean, parent))
    return Rewrite(pointer, clean, clean.name)


def _replace_copy(
    pointer: Pointer, clean: Path, quarantine_dir: Path, taken: set[Path]
) -> PointerChange:
    """Set the copy at ``pointer.path`` aside and put a copy of ``clean`` in its place."""
    path = pointer.path
    temp = atomic.temp_beside(path)
    aside: Path | None = None
    linked = False
    try:
        clone(clean, temp)
        os.utime(temp)  # the newest last*.ckpt wins for ckpt_path="last"
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
        if os.path.lexists(temp):
            os.unlink(temp)  # sentinel's own copy, never the job's file
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


def read_pointer(path: Path) -> str:
    """What a pointer file holds (its first few KB: a pointer holds one short name)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read(_MAX_POINTER_BYTES)


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _shown(target: Path, pointer: Path) -> str:
    return target.name if target.parent == pointer.parent else str(target)
