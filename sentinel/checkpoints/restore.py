"""Undo a rollback: move a quarantine folder's items back to where they came from.

For the false alarm that stopped a healthy run. The folder's manifest (written by
``apply_rollback``) names each item's origin. Nothing is overwritten: if any origin
is taken, nothing moves. Nothing leaves the checkpoint dir either: an origin is refused
when it lies outside the dir (or names ``..``), or when a folder on its way from the dir
is a symbolic link (whoever can write the checkpoint dir could point one anywhere, and a
restore may run as root); so is a quarantine folder that is itself a link. A pointer goes
back only into a folder of the dir's own (``scan.checkpoint_folders``: the dir, or a
Lightning version's ``checkpoints/`` in it). The one file
that may stand in the way is sentinel's own: the kept version a rollback put back, which
goes (the kept copy stays) when it is still exactly that version.

The resume pointers the rollback rewrote are put back as they read before, each
only if it still reads as the rollback left it (the resumed job may have saved since).
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.checkpoints import atomic
from sentinel.checkpoints.cross_device import move_across
from sentinel.checkpoints.pointer_find import Form, read_pointer
from sentinel.checkpoints.pointers import PointerChange
from sentinel.checkpoints.quarantine import MANIFEST, read_manifest
from sentinel.checkpoints.scan import QUARANTINE_DIR, checkpoint_folders, own_root

log = logging.getLogger(__name__)


class RestoreRefused(Exception):
    """The quarantine cannot be put back as asked; nothing was moved."""


@dataclass(frozen=True)
class Move:
    """One quarantined item and where it goes back to."""

    source: Path
    destination: Path


def find_quarantine(directory: Path, incident: str) -> Path:
    """The quarantine folder named ``incident``, or the one folder whose name starts with it.

    ``incident`` may also be the folder's path, as the rollback message prints it.
    """
    root = own_root(directory) / QUARANTINE_DIR
    if os.path.islink(root):
        raise RestoreRefused(f"{root} is a symbolic link, not sentinel's quarantine: nothing moved")
    incident = Path(incident).name if os.sep in incident else incident  # the folder, pasted
    try:
        names = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    except FileNotFoundError:
        raise RestoreRefused(f"no quarantine in {directory}") from None
    found = _named(root, incident, names)
    if os.path.islink(found):
        raise RestoreRefused(f"{found} is a symbolic link, not a quarantine: nothing moved")
    return found


def _named(root: Path, incident: str, names: list[str]) -> Path:
    if incident in names:
        return root / incident
    matches = [name for name in names if incident and name.startswith(incident)]
    if len(matches) == 1:
        return root / matches[0]
    if not matches:
        have = ", ".join(names) or "none"
        raise RestoreRefused(f"no quarantine {incident!r} in {root} (there: {have})")
    raise RestoreRefused(f"{incident!r} names {len(matches)} quarantines: {', '.join(matches)}")


def plan_restore(directory: Path, incident: str) -> list[Move]:
    """What ``restore_quarantine`` would move; RestoreRefused where it would refuse."""
    return _plan(directory, incident)[2]


def restore_quarantine(directory: Path, incident: str) -> list[Move]:
    """Move every item of the quarantine ``incident`` back to its origin; the moves made."""
    folder, manifest, moves = _plan(directory, incident)
    root = Path(os.path.abspath(directory))
    changes = _pointer_changes(folder, manifest)
    for move in moves:
        if os.path.lexists(move.destination) and _own_put_back(move.destination, manifest):
            os.unlink(move.destination)  # a copy of a kept version, which stays kept
            log.info("removed the kept version put back at %s", move.destination)
        _move_back(move, root)
        log.info("restored %s to %s", move.source, move.destination)
    for change in reversed(changes):
        _undo(change, folder)
        if change.set_aside:
            moves.append(Move(folder / change.set_aside, Path(change.path)))
    (folder / MANIFEST).unlink()
    try:
        folder.rmdir()
    except OSError:
        log.info("%s is not empty: left in place", folder)
    return moves


def _plan(directory: Path, incident: str) -> tuple[Path, dict[str, Any], list[Move]]:
    root = Path(os.path.abspath(directory))
    folder = find_quarantine(root, incident)
    manifest = read_manifest(folder)
    if manifest is None:
        raise RestoreRefused(f"{folder} has no {MANIFEST}: move its items back by hand")
    # An item a rollback planned but never moved (it stopped before) stayed where it was.
    items = [
        item
        for item in manifest["items"]
        if not (isinstance(item, dict) and item.get("moved") is False)
        or os.path.lexists(folder / str(item.get("name")))
    ]
    moves = [_move_of(root, folder, item) for item in items]
    for move in moves:
        if os.path.lexists(move.destination) and not _own_put_back(move.destination, manifest):
            raise RestoreRefused(f"{move.destination} exists; not overwriting it, nothing moved")
    _pointer_changes(folder, manifest)  # refuses before anything moves
    return folder, manifest, moves


def _pointer_changes(folder: Path, manifest: dict[str, Any]) -> list[PointerChange]:
    """The pointers the rollback rewrote; RestoreRefused if one cannot be put back."""
    changes = []
    for record in manifest.get("pointers", []):
        change = PointerChange.from_json(record)
        if change is None or Path(change.set_aside).name != change.set_aside:
            raise RestoreRefused(f"{folder / MANIFEST}: a pointer record unreadable: {record!r}")
        if Path(change.path).parent not in checkpoint_folders(folder.parent.parent):
            raise RestoreRefused(f"{folder / MANIFEST}: a pointer outside its dir: {change.path}")
        problem = _undo_problem(change, folder)
        if problem:
            raise RestoreRefused(f"{problem}; nothing moved")
        changes.append(change)
    return changes


def _undo_problem(change: PointerChange, folder: Path) -> str:
    """Why ``change`` cannot be undone ("" when it can): the pointer moved on since."""
    path = Path(change.path)
    try:
        if change.form == Form.COPY:
            if not os.path.lexists(folder / change.set_aside):
                return f"{folder / change.set_aside} is no longer in the quarantine"
            stat = os.stat(path, follow_symlinks=False)
            if (stat.st_size, stat.st_mtime_ns) != (change.size, change.mtime_ns):
                return f"{path} changed since the rollback; not overwriting it"
        elif change.form == Form.SYMLINK:
            if os.readlink(path) != change.after:
                return f"{path} points elsewhere since the rollback; not overwriting it"
        elif read_pointer(path) != change.after:
            return f"{path} was rewritten since the rollback; not overwriting it"
    except OSError as error:
        return f"{path}: {error.strerror or error}"
    return ""


def _undo(change: PointerChange, folder: Path) -> None:
    """Put one pointer back as it read before the rollback, by a rename over it."""
    path = Path(change.path)
    if change.form == Form.COPY:
        os.rename(folder / change.set_aside, path)  # over sentinel's copy, in one step
    elif change.form == Form.SYMLINK:
        atomic.symlink(path, change.before)
    else:
        atomic.write_text(path, change.before)
    log.info("put the resume pointer %s back as it was before the rollback", path)


def _move_of(root: Path, folder: Path, item: Any) -> Move:
    name = str(item.get("name", "")) if isinstance(item, dict) else ""
    origin = Path(str(item.get("origin", ""))) if isinstance(item, dict) else Path()
    if not name or Path(name).name != name or name in (".", ".."):
        raise RestoreRefused(f"{folder / MANIFEST}: an item without a plain name: {item!r}")
    # ``..`` is refused outright: ``root/../etc`` shares ``root``'s name but leads out.
    if (
        not origin.is_absolute()
        or ".." in origin.parts
        or os.path.commonpath([origin, root]) != str(root)
    ):
        raise RestoreRefused(f"{folder / MANIFEST}: {name} came from outside {root}: {origin}")
    link = _link_on_the_way(root, origin)
    if link is not None:
        raise RestoreRefused(
            f"{folder / MANIFEST}: {name} would go back through the symbolic link {link}"
            f" (to {os.readlink(link)}), which may lead out of {root}; nothing moved"
        )
    source = folder / name
    if not os.path.lexists(source):
        raise RestoreRefused(f"{source} is no longer in the quarantine; nothing moved")
    return Move(source, origin)


def _link_on_the_way(root: Path, path: Path) -> Path | None:
    """The first folder between ``root`` and ``path`` (both excluded) that is a symbolic
    link, or None. ``path`` is under ``root`` by its name; a link on the way may lead out."""
    here = root
    for part in path.relative_to(root).parts[:-1]:
        here = here / part
        if os.path.islink(here):
            return here
    return None


def _own_put_back(path: Path, manifest: dict[str, Any]) -> bool:
    """Whether ``path`` is still the kept version a rollback put back, and that stays kept."""
    try:
        stat = os.stat(path)
    except OSError:
        return False
    for record in manifest.get("put_back", []):
        if not isinstance(record, dict) or record.get("path") != str(path):
            continue
        identity = (record.get("size"), record.get("mtime_ns"))
        try:
            kept = os.stat(str(record.get("kept")))
        except OSError:
            continue
        if (stat.st_size, stat.st_mtime_ns) == (kept.st_size, kept.st_mtime_ns) == identity:
            return True
    return False


def _move_back(move: Move, root: Path) -> None:
    link = _link_on_the_way(root, move.destination)
    if link is not None:
        raise RestoreRefused(f"{link} became a symbolic link during the restore; stopped")
    if os.path.lexists(move.destination):
        raise FileExistsError(errno.EEXIST, "restore destination exists", str(move.destination))
    move.destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(move.source, move.destination)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        log.info("%s is on another filesystem than %s: copying it", move.source, move.destination)
        move_across(move.source, move.destination)
