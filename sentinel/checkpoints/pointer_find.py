"""Resume pointers found: what each framework's "resume from latest" reads, and what it names.

DeepSpeed's ``latest``/``latest_universal`` (a tag, the folder beside it), Megatron's
``latest_checkpointed_iteration.txt`` (``40`` names ``iter_0000040``, or ``release``),
Lightning's ``last*.ckpt`` (a symlink or a copy, the newest mtime wins; one in each
version's ``checkpoints/`` of ``lightning_logs``) and on SLURM its ``hpc_ckpt_N.ckpt`` with
the highest N (a save counter, not a step), HF's ``checkpoint-N`` with the highest N.
Setting them right after a rollback is ``actions/pointers.py``'s.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sentinel.checkpoints.scan import Checkpoint, CheckpointStatus, checkpoint_folders

log = logging.getLogger(__name__)

DEEPSPEED_LATEST = "latest"
DEEPSPEED_LATEST_UNIVERSAL = "latest_universal"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_RELEASE = "release"
#: Lightning's HPC checkpoints: any name holding this, numbered after it.
LIGHTNING_HPC_KEY = "hpc_ckpt_"
#: Megatron's iteration folders, ``iter_0000040``.
MEGATRON_ITER = re.compile(r"^iter_(\d{7,})$")
# A pointer file holds a short name; anything longer is not one.
_MAX_POINTER_BYTES = 4096
# ModelCheckpoint._find_last_checkpoints: suffix ".ckpt", re.match on the stem.
_LIGHTNING_LAST = re.compile(r"^last(-(\d+))?")
# transformers.trainer_utils: _re_checkpoint = re.compile(r"^" + "checkpoint" + r"\-(\d+)$")
_HF_CHECKPOINT = re.compile(r"^checkpoint\-(\d+)$")


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

    def describe(self, directory: Path) -> str:
        """One line: the pointer, what it names, and whether that is there; each by its path
        in ``directory``, the checkpoint dir (``version_1/checkpoints/last.ckpt``)."""
        name = _shown(self.path, directory)
        if self.form is Form.HIGHEST:
            return f"{self.kind}: {name} (highest number)"
        if self.form is Form.COPY:
            return f"{self.kind}: {name} is a copy (a checkpoint of its own)"
        if self.target is None:
            return f"{self.kind}: {name} holds {self.says!r}, which names nothing"
        there = "" if os.path.lexists(self.target) else " (missing)"
        return f"{self.kind}: {name} -> {_shown(self.target, directory)}{there}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "path": str(self.path),
            "form": str(self.form),
            "says": self.says,
            "target": None if self.target is None else str(self.target),
            "exists": self.target is not None and os.path.lexists(self.target),
        }


def find_pointers(directory: Path) -> list[Pointer]:
    """The resume pointers of ``directory``, as each framework reads them: those directly in
    each of its ``checkpoint_folders`` (a ``last.ckpt`` in each Lightning version's)."""
    found: list[Pointer] = []
    for folder in checkpoint_folders(directory):
        found += _folder_pointers(folder)
    return found


def _folder_pointers(root: Path) -> list[Pointer]:
    """The resume pointers directly inside ``root``."""
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


def read_pointer(path: Path) -> str:
    """What a pointer file holds (its first few KB: a pointer holds one short name)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read(_MAX_POINTER_BYTES)


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _shown(path: Path, directory: Path) -> str:
    """``path`` as from ``directory`` when it is in it, else in full."""
    relative = os.path.relpath(path, os.path.abspath(directory))
    return str(path) if relative.split(os.sep, 1)[0] == os.pardir else relative
