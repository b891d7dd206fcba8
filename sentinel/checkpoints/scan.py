"""Checkpoint directory scanning: find checkpoints, place them in training, judge them.

A checkpoint is an entry of the checkpoint directory: a weights file
(``model_step40.pt``, ``ckpt.pt``, ``last.ckpt``, ``model.safetensors``) or a folder
whose name carries a step or epoch (``checkpoint-40``, ``global_step40``,
``iter_0000040``) or that directly holds weights or DCP metadata. Hidden entries,
``quarantine`` and temporary names (``tmp-checkpoint-40``) never are.

Lightning's default layout is one pool: in ``lightning_logs/`` each start of the job
writes to a new ``version_<N>/checkpoints/``, so after a restart the last clean
checkpoint is in an older version's folder than the newest ones. Where the checkpoint
directory holds such folders, the checkpoints of every one of them are its checkpoints
(``checkpoint_folders``).

Its place in training comes from its name (:mod:`checkpoint_names`), else from its
content read without executing it (:mod:`checkpoint_files`), else from its
modification time. Its status comes from what it holds (:mod:`checkpoint_layouts`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from sentinel.checkpoints.files import Content, check_weights, read_content
from sentinel.checkpoints.layouts import (
    ACCELERATE_SAVES,
    CheckpointStatus,
    counts_saves,
    dir_content,
    holds_checkpoint,
    judge_dir,
    judge_file,
    layout_of,
    walk_files,
)
from sentinel.checkpoints.names import (
    CHECKPOINT_SUFFIXES,
    NamePosition,
    checkpoint_suffix,
    is_in_progress,
    is_shard,
    position_of,
    step_of,
)

__all__ = [
    "LIGHTNING_CHECKPOINTS",
    "QUARANTINE_DIR",
    "WEIGHT_SUFFIXES",
    "Checkpoint",
    "CheckpointStatus",
    "Onset",
    "check_weights",
    "checkpoint_folders",
    "last_clean",
    "own_root",
    "scan",
    "step_of",
]

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"
#: The folder beside a checkpoint dir that holds sentinel's own folders where the dir cannot.
OWN_SUFFIX = ".sentinel"
#: Where Lightning's ``ModelCheckpoint`` saves by default, in each logger version's folder.
LIGHTNING_CHECKPOINTS = "checkpoints"
# TensorBoardLogger and CSVLogger: version_<N>, N one more than the highest there at each start.
_LIGHTNING_VERSION = re.compile(r"^version_(\d+)$")
# The last suffix of a weights file's name (a ".pth.tar" file's Path.suffix is ".tar").
WEIGHT_SUFFIXES = frozenset({"." + s.rsplit(".", 1)[-1] for s in CHECKPOINT_SUFFIXES})
# Files a framework writes beside its checkpoints that hold no training state.
_NOT_CHECKPOINTS = frozenset({"training_args.bin"})


@dataclass(frozen=True)
class Onset:
    """Where an incident's evidence begins: its first step, epoch and time, as far as known.

    ``epoch`` is the log's own (HF's fractional 2.97, or a loop's 0-based index).
    """

    step: int | None = None
    epoch: float | None = None
    time: float | None = None

    def reaches(self, step: int | None, epoch: int | None, mtime: float) -> str:
        """Why a checkpoint at this step, epoch and mtime is at or after the onset, else ""."""
        if step is not None and self.step is not None:
            return f"step {step} >= onset step {self.step}" if step >= self.step else ""
        if epoch is not None and self.epoch is not None:
            # epoch_3.pt may be the end of loop index 3 or of the third epoch: only an
            # epoch before the onset's own is surely before it; its own is told by time.
            onset_epoch = math.floor(self.epoch)
            if epoch != onset_epoch:
                return f"epoch {epoch} > onset epoch {self.epoch:g}" if epoch > onset_epoch else ""
            if self.time is None:
                return f"epoch {epoch} is the onset's epoch ({self.epoch:g})"
        if self.time is not None:
            return "written at or after the onset's time" if mtime >= self.time else ""
        if self.step is None and self.epoch is None:
            return ""
        return "nothing places it before the onset (no step or epoch, no onset time)"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint (a file or a directory) found in the checkpoint directory.

    ``step`` and ``epoch`` are None where neither its name nor its content says;
    ``placed_by`` says where they came from ("name", "content: ...", or "time").
    ``mtime`` is the newest modification time of anything in it.
    """

    path: Path
    step: int | None
    status: CheckpointStatus
    reason: str
    mtime: float
    epoch: int | None = None
    layout: str = ""
    placed_by: str = "name"

    def is_newer_than(self, other: Checkpoint) -> bool:
        """Whether this checkpoint was written later in training than ``other``."""
        return _compare(self, other, strict_step=True) > 0


def scan(
    directory: Path, *, onset: Onset | None = None, onset_step: int | None = None
) -> list[Checkpoint]:
    """List the checkpoints of ``directory`` (in each of its ``checkpoint_folders``) with a
    status each.

    Sorted by step, then (those without) by epoch, then (those without either) by time.

    ``onset_step`` is the older spelling of ``onset=Onset(step=...)``. A missing or
    unreadable directory gives an empty list.
    """
    if onset is None and onset_step is not None:
        onset = Onset(step=onset_step)
    folders = checkpoint_folders(directory)
    # A link to a checkpoint in any of them is a pointer (Lightning's last.ckpt), not one more.
    linked = {*folders, *(Path(os.path.realpath(folder)) for folder in folders)}
    found: list[Checkpoint] = []
    for folder in folders:
        found += _scan_folder(folder, onset or Onset(), linked)
    found.sort(key=_listing_order)
    return found


def checkpoint_folders(directory: Path) -> list[Path]:
    """The folders whose checkpoints are ``directory``'s: itself and, in Lightning's default
    layout (``lightning_logs``), each ``version_<N>/checkpoints/`` in it, by N.

    A version folder reached through a symbolic link is not one of them: a restore would
    refuse to put its checkpoints back through the link."""
    root = Path(os.path.abspath(directory))
    try:
        with os.scandir(root) as entries:
            names = [entry.name for entry in entries]
    except OSError:
        names = []  # scan says why, of the directory itself
    versions: list[tuple[int, Path]] = []
    for name in names:
        match = _LIGHTNING_VERSION.match(name)
        folder = root / name / LIGHTNING_CHECKPOINTS
        if match and folder.is_dir() and not (folder.is_symlink() or folder.parent.is_symlink()):
            versions.append((int(match.group(1)), folder))
    return [root, *(folder for _, folder in sorted(versions))]


def own_root(directory: Path) -> Path:
    """Where sentinel's own folders (``quarantine/``, ``.sentinel-kept/``) are for the
    checkpoint dir ``directory``: in it, or beside it in ``<dir>.sentinel/``.

    In it, where every framework resumes by the names it knows and passes over any other.
    Beside it where the framework takes every entry for a checkpoint of its own: accelerate's
    automatic checkpoint naming sorts all of ``checkpoints/`` by the number in each name,
    and a ``quarantine/`` or ``.sentinel-kept/`` there crashed the job's next ``save_state``
    (with ``total_limit``) and ``load_state()`` on an IndexError. Once ``<dir>.sentinel/``
    exists it is the place whatever the dir holds (a rollback may have moved out every
    checkpoint). Not where ``directory`` is a mount point: a kept version is a hard link,
    which cannot cross it, so the folders stay in it and a warning says what that breaks.
    """
    directory = Path(os.path.abspath(directory))
    beside = directory.with_name(directory.name + OWN_SUFFIX)
    if os.path.isdir(beside):
        return beside
    if not _counts_saves_inside(directory):
        return directory
    try:
        mounted = os.stat(directory).st_dev != os.stat(directory.parent).st_dev
    except OSError:
        mounted = True  # cannot tell: stay where sentinel's folders always were
    if mounted:
        _warn_mounted(directory)
        return directory
    return beside


#: How old a dir's mtime must be before an answer given at it is trusted again.
SETTLED_NS = 2_000_000_000
#: ``_counts_saves_inside``'s answers, by dir, with the dir's mtime they were given at (the
#: keeper asks at every look; a dir of many ``checkpoint_<i>`` folders is one scan each).
_SAVES_INSIDE: dict[Path, tuple[int, bool]] = {}


def _counts_saves_inside(directory: Path) -> bool:
    """Whether ``directory`` holds folders named as accelerate's ``checkpoint_<i>`` (a new
    entry changes the dir's mtime, and the answer is looked for again)."""
    try:
        mtime = os.stat(directory).st_mtime_ns
    except OSError:
        return False
    known = _SAVES_INSIDE.get(directory)
    # An mtime of the last moments may not have moved yet for an entry made since (the
    # clock a filesystem stamps with ticks every few ms): trusted once it is older.
    if known is not None and known[0] == mtime and time.time_ns() - mtime > SETTLED_NS:
        return known[1]
    found = _scan_for_saves(directory)
    if len(_SAVES_INSIDE) > 64:
        _SAVES_INSIDE.clear()
    _SAVES_INSIDE[directory] = (mtime, found)
    return found


def _scan_for_saves(directory: Path) -> bool:
    """By the name alone: the keeper stages a new save at its first look, before accelerate
    has written its ``random_states``, and a ``.sentinel-kept/`` made inside then stays."""
    try:
        with os.scandir(directory) as entries:
            return any(
                ACCELERATE_SAVES.fullmatch(entry.name) is not None and entry.is_dir()
                for entry in entries
            )
    except OSError:
        return False


@functools.cache
def _warn_mounted(directory: Path) -> None:
    log.warning(
        "%s is a mount point and holds accelerate's checkpoint_<i> folders: sentinel's"
        " quarantine/ and .sentinel-kept/ must stay in it, where accelerate's load_state()"
        " and save_state(total_limit) take them for checkpoints and fail; mount the folder"
        " above it instead",
        directory,
    )


def _scan_folder(root: Path, onset: Onset, linked: Collection[Path]) -> list[Checkpoint]:
    """The checkpoints directly inside ``root``, unsorted; a link to a checkpoint in one of
    the ``linked`` folders is not one."""
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        log.warning("cannot list checkpoint dir %s: %s", root, exc)
        return []
    found: list[Checkpoint] = []
    for entry in entries:
        name = entry.name
        if name.startswith(".") or name == QUARANTINE_DIR or is_in_progress(name):
            continue
        path = root / name
        try:
            if entry.is_symlink() and _points_into(path, linked):
                continue  # a pointer to another entry (Lightning's last.ckpt link)
            checkpoint = _examine(path, entry.is_dir(), position_of(name), onset)
        except FileNotFoundError:
            continue  # removed between listing and reading (the job's own rotation)
        except OSError as exc:
            checkpoint = _unreadable(path, exc)
        if checkpoint is not None:
            found.append(checkpoint)
    return found


#: A file of a save that holds the optimizer's state, not the weights.
_OPTIMIZER_STATE = re.compile(
    r"(?<![a-z])(?:optim(?:izer)?|scheduler|rng_state|random_states)(?![a-z])", re.IGNORECASE
)

#: Folders ``elsewhere`` looks into at most, so a give-up never waits on a huge tree.
ELSEWHERE_FOLDERS = 64


def elsewhere(directory: Path, limit: int = 3) -> list[Path]:
    """Folders beside ``directory`` (or one level inside one of them) that hold checkpoints:
    where they are when ``directory`` holds none (a typo in ``--checkpoints``)."""
    root = Path(os.path.abspath(directory))
    try:
        siblings = sorted(p for p in root.parent.iterdir() if p.is_dir() and p != root)
    except OSError:
        return []
    found: list[Path] = []
    looked = 0
    for folder in siblings:
        try:
            inner = sorted(p for p in folder.iterdir() if p.is_dir())
        except OSError:
            inner = []
        for candidate in (folder, *inner):
            if _sentinels_own(candidate.name) or looked >= ELSEWHERE_FOLDERS:
                continue
            looked += 1
            if scan(candidate):
                found.append(candidate)
                break
        if len(found) >= limit:
            break
    return found


def _sentinels_own(name: str) -> bool:
    return name == QUARANTINE_DIR or name.startswith(".") or name.endswith(OWN_SUFFIX)


class EmptyDir:
    """A ``--checkpoints`` folder that stays empty while a folder beside it gains checkpoints:
    a typo that would leave a rollback nothing to resume from, said once while there is time
    to fix it. Looked at every ``every_s`` (a scan of the folders beside it), until the
    folder holds a checkpoint or the warning is given."""

    def __init__(self, directory: Path, every_s: float = 60.0) -> None:
        self.directory = directory
        self.every_s = every_s
        self._next = 0.0
        self._done = False
        #: The checkpoints seen beside it at the first look, by folder.
        self._first: dict[Path, set[str]] | None = None

    def look(self, now: float) -> str:
        """The warning's text once a folder beside it gained a checkpoint; else ""."""
        if self._done or now < self._next:
            return ""
        self._next = now + self.every_s
        if scan(self.directory):
            self._done = True  # it fills: no typo
            return ""
        seen = {folder: {c.path.name for c in scan(folder)} for folder in elsewhere(self.directory)}
        if self._first is None:
            self._first = seen
            return ""
        gained = [
            (folder, sorted(names - self._first.get(folder, set())))
            for folder, names in seen.items()
            if names - self._first.get(folder, set())
        ]
        if not gained:
            return ""
        self._done = True
        folder, names = gained[0]
        return (
            f"--checkpoints {self.directory} holds no checkpoint, while {folder} beside it"
            f" gained {', '.join(names[:3])}: a typo? A rollback would have nothing to resume"
            f" from; give --checkpoints {folder}"
        )


def last_clean(
    checkpoints: Sequence[Checkpoint],
    onset: Onset | int | None = None,
    *,
    onset_step: int | None = None,
) -> Checkpoint | None:
    """Return the newest clean checkpoint from before ``onset`` (any if None).

    An int ``onset`` (or ``onset_step``) is an onset step.
    """
    if isinstance(onset, int):
        onset = Onset(step=onset)
    if onset is None:
        onset = Onset(step=onset_step)
    candidates = [
        c
        for c in checkpoints
        if c.status is CheckpointStatus.CLEAN and not onset.reaches(c.step, c.epoch, c.mtime)
    ]
    best = max(candidates, key=functools.cmp_to_key(_compare), default=None)
    if best is None or best.step is None or not _OPTIMIZER_STATE.search(best.path.name):
        return best
    # A save of several files at one step (``model_000130.safetensors`` and the optimizer's
    # ``optim_000130.pt``, written after it): the weights are the one a resume names.
    weights = [
        c
        for c in candidates
        if c.step == best.step and c.epoch == best.epoch
        and not _OPTIMIZER_STATE.search(c.path.name)
    ]  # fmt: skip
    return max(weights, key=functools.cmp_to_key(_compare), default=best)


def _examine(path: Path, is_dir: bool, position: NamePosition, onset: Onset) -> Checkpoint | None:
    if is_dir:
        if not position.keyed and not holds_checkpoint(path):
            return None  # "runs", "version_0": no step keyword and nothing a checkpoint holds
        mtime = max([path.stat().st_mtime, *(f.stat().st_mtime for f in walk_files(path))])
    else:
        if path.name in _NOT_CHECKPOINTS or is_shard(path.name):
            return None
        if not checkpoint_suffix(path.name) and not position.keyed:
            return None  # "latest", "notes.txt"
        mtime = path.stat().st_mtime
    step, epoch, placed_by = position.step, position.epoch, "name"
    if is_dir and step is not None and counts_saves(path):
        step, placed_by = None, "time"  # accelerate's checkpoint_<i>: the i-th save, no step
    content: Content | None = None
    if step is None and epoch is None:
        content = dir_content(path) if is_dir else read_content(path)
        step, epoch = content.step, content.epoch
        placed_by = f"content: {content.where}" if content.where else "time"
    elif not is_dir and step is not None and (not position.keyed or position.generic):
        # A file's bare number, or one after ``checkpoint``: its step, unless it holds an
        # epoch and no step. A loop's checkpoint_3.pth holding {"epoch": 4} counts epochs:
        # read as step 3, before an onset at step 160, its NaN weights were resumed (and it
        # was listed as the last clean one after the give-up).
        content = read_content(path)
        if content.step is None and content.epoch is not None:
            step, epoch = None, content.epoch
            placed_by = f"content: {content.where}"
    after = onset.reaches(step, epoch, mtime)
    if after:
        status, reason, layout = CheckpointStatus.AFTER_ONSET, after, layout_of(path)
    else:
        verdict = judge_dir(path) if is_dir else judge_file(path, content)
        status, reason, layout = verdict.status, verdict.reason, verdict.layout
    return Checkpoint(path, step, status, reason, mtime, epoch, layout, placed_by)


def _points_into(link: Path, folders: Collection[Path]) -> bool:
    target = Path(os.path.realpath(link))
    return target != link and target.parent in folders and target.exists()


def _unreadable(path: Path, exc: OSError) -> Checkpoint | None:
    try:
        mtime = path.lstat().st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        mtime = 0.0
    position = position_of(path.name)
    reason = f"cannot read {exc.filename or path}: {exc.strerror or exc}"
    return Checkpoint(
        path, position.step, CheckpointStatus.UNREADABLE, reason, mtime, position.epoch, ""
    )


def _listing_order(c: Checkpoint) -> tuple[bool, int, bool, int, float, str]:
    """Stepped checkpoints by step, then epoch-only ones by epoch, then the rest by time."""
    return (c.step is None, c.step or 0, c.epoch is None, c.epoch or 0, c.mtime, c.path.name)


def _compare(a: Checkpoint, b: Checkpoint, *, strict_step: bool = False) -> int:
    """Order two checkpoints by step where both have one, else epoch, else time."""
    if a.step is not None and b.step is not None and (a.step != b.step or strict_step):
        return (a.step > b.step) - (a.step < b.step)
    if a.epoch is not None and b.epoch is not None and a.epoch != b.epoch:
        return (a.epoch > b.epoch) - (a.epoch < b.epoch)
    if a.mtime != b.mtime:
        return (a.mtime > b.mtime) - (a.mtime < b.mtime)
    return (a.path.name > b.path.name) - (a.path.name < b.path.name)
