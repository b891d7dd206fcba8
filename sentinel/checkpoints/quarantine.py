"""The quarantine folder: labels for its subfolders, moves into them, their manifests.

Each rollback sets checkpoints aside in ``<dir>/quarantine/<label>/`` (actions/rollback.py),
under names nothing holds yet, and records there where each came from (``MANIFEST``,
read back by ``sentinel checkpoints --restore``, actions/restore.py).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from pathlib import Path
from typing import Any

from sentinel.checkpoints.cross_device import move_across
from sentinel.checkpoints.scan import QUARANTINE_DIR, own_root
from sentinel.model.untrusted import json_value

log = logging.getLogger(__name__)

MAX_LABEL_CHARS = 120
#: In each quarantine folder: where every item came from (``sentinel checkpoints --restore``).
MANIFEST = ".sentinel-manifest.json"
_UNSAFE_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_label(label: str) -> str:
    """Return ``label`` as one safe path component (no separators, no leading dots)."""
    safe = _UNSAFE_LABEL_CHARS.sub("_", label).lstrip(".")[:MAX_LABEL_CHARS]
    return safe or "unlabelled"


def fresh_label(directory: Path, label: str) -> str:
    """``label``, or ``label-2``, ``label-3``... : one no quarantine folder in ``directory`` has.

    Two rollbacks within the same second (a job that fails again at once) each get a folder
    of their own, so that each folder's manifest records one onset.
    """
    base = sanitize_label(label)
    parent = own_root(directory) / QUARANTINE_DIR
    candidate, n = base, 1
    while os.path.lexists(parent / candidate):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def make_folder(target_dir: Path, directory: Path) -> None:
    """Make the quarantine folder ``target_dir`` of the checkpoint dir ``directory`` where
    missing, with ``quarantine/`` above it and that one's own root (:func:`own_root`).

    Each folder made takes the checkpoint dir's owner and mode (``like_checkpoint_dir``).
    """
    for folder in (target_dir.parent.parent, target_dir.parent, target_dir):
        try:
            os.mkdir(folder)
        except FileExistsError:
            continue
        like_checkpoint_dir(folder, directory)


def like_checkpoint_dir(path: Path, directory: Path) -> None:
    """Give ``path`` (a quarantine folder, a manifest) the owner and mode of ``directory``.

    A folder takes the dir's mode bits, a file 0o644 of them: whoever can read the
    checkpoints can read what was set aside, and a sentinel running as root leaves it to
    the dir's owner, who can restore it or clean it up.
    """
    owner = os.stat(directory)
    made = os.lstat(path)
    if (made.st_uid, made.st_gid) != (owner.st_uid, owner.st_gid):
        try:
            os.chown(path, owner.st_uid, owner.st_gid)  # before chmod: chown clears set-id bits
        except PermissionError:
            log.debug("%s stays %d:%d (not root)", path, made.st_uid, made.st_gid)
    mode = stat.S_IMODE(owner.st_mode)
    os.chmod(path, mode if stat.S_ISDIR(made.st_mode) else 0o644 & mode)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A quarantine folder's manifest; None when it has none (or it does not parse)."""
    try:
        manifest = json_value((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning("quarantine manifest %s unreadable: %s", folder / MANIFEST, error)
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("items"), list):
        return None
    manifest.setdefault("put_back", [])
    manifest.setdefault("pointers", [])
    return manifest


def free_destination(target_dir: Path, name: str, taken: set[Path]) -> Path:
    candidate = target_dir / name
    suffix = 0
    while candidate in taken or os.path.lexists(candidate):
        suffix += 1
        candidate = target_dir / f"{name}.{suffix}"
    return candidate


def move_to_free(source: Path, target_dir: Path, taken: set[Path]) -> Path:
    """Move ``source`` into ``target_dir`` under a name nothing holds yet; return it."""
    while True:
        destination = free_destination(target_dir, source.name, taken)
        try:
            _move(source, destination)
        except FileExistsError:
            taken.add(destination)  # appeared since the check: take the next suffix
            continue
        return destination


def move_to(source: Path, destination: Path, taken: set[Path]) -> Path:
    """Move ``source`` to ``destination``, or, should that name be taken since it was
    chosen, to the next free name in its folder; the name used."""
    try:
        _move(source, destination)
    except FileExistsError:
        return move_to_free(source, destination.parent, {*taken, destination})
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
        # The checkpoint, or the quarantine, is a mount of its own: copy, then remove.
        log.info("%s is on another filesystem than %s: copying it", source, destination.parent)
        move_across(source, destination)
