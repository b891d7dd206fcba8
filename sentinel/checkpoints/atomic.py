"""Replace a small file or a symlink in one step: the new one under a temp name, then rename(2).

Whoever reads the name meanwhile sees the old one or the new one, never neither and
never half of one. The temp name is hidden and holds neither "last", ".ckpt" nor
"hpc_ckpt_", so no framework's scan takes it for a checkpoint should sentinel die
before the rename.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_TEMP = re.compile(r"\.sentinel-replace-(\d+)(?:-[^/]*)?\.tmp")


def temp_beside(path: Path, tag: str = "") -> Path:
    """A name in ``path``'s folder (the same filesystem, so the rename is atomic); ``tag``
    tells apart the temps of several names in one folder made at once."""
    suffix = f"-{tag}" if tag else ""
    return path.with_name(f".sentinel-replace-{os.getpid()}{suffix}.tmp")


def sweep(directory: Path) -> None:
    """Remove the temp entries a sentinel that died before its rename left in ``directory``
    (their pid runs no more). Never anything else: only sentinel's own temp names."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        match = _TEMP.fullmatch(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        try:
            os.unlink(entry.path)
        except OSError as error:
            log.warning("could not remove %s, left by a sentinel that died: %s", entry.path, error)
        else:
            log.info("removed %s, left by a sentinel that died before its rename", entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_text(path: Path, text: str) -> None:
    """Replace the file ``path`` by one holding ``text``, with the old file's mode."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = 0o644
    replace(path, lambda temp: new_file(temp, text, mode))


def symlink(path: Path, link_text: str) -> None:
    """Replace ``path`` by a symlink holding ``link_text``."""
    replace(path, lambda temp: os.symlink(link_text, temp))


def replace(path: Path, create: Callable[[Path], None]) -> None:
    """Have ``create`` make the new entry under a temp name beside ``path``, then rename it over.

    On any failure the temp entry (sentinel's own) is removed and ``path`` is untouched.
    """
    temp = temp_beside(path)
    try:
        create(temp)
        os.replace(temp, path)
    except BaseException:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise
    sync_dir(path.parent)


def sync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable, where the filesystem allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is done
    finally:
        os.close(fd)


def new_file(temp: Path, text: str, mode: int) -> None:
    """Create ``temp`` holding ``text`` with ``mode``, synced."""
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(temp, mode)  # the umask may have narrowed it
