"""Move a checkpoint to another filesystem, where rename(2) cannot (EXDEV), never half done.

A checkpoint that is a mount of another disk, or a quarantine folder that is one, cannot be
renamed into place; it is copied, then removed. Such a move is made so that no failure
leaves it half done: the destination's free space is checked before a byte is written; a
sparse file's holes stay holes (a 5 GB sparse checkpoint is not written out densely until
the disk is full); a copy that fails or is interrupted is removed (sentinel's own copy,
never the source); and the source is removed only once the whole copy is on disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from sentinel.checkpoints.atomic import sync_dir
from sentinel.checkpoints.disk import human_bytes

log = logging.getLogger(__name__)

#: Room left over beyond what the copy allocates: the destination's own metadata.
HEADROOM_BYTES = 4 * 1024 * 1024
#: Copied per system call: an interrupt or a full disk is noticed within this much.
CHUNK_BYTES = 8 * 1024 * 1024
#: What copy_file_range(2) says where the kernel cannot copy between these two files.
_CANNOT_COPY_RANGE = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM}
)


def move_across(source: Path, destination: Path) -> None:
    """Move ``source`` (a file, a symlink or a folder of them) to ``destination`` by copying.

    ``destination`` must not exist; its folder is on another filesystem than ``source``.
    OSError ENOSPC, before anything is written, when that filesystem has less room free
    than the copy will take. Any failure (or interrupt) during the copy removes the
    partial copy and re-raises; ``source`` is removed once the copy is complete and synced.
    """
    _check_room(source, destination.parent)
    _create(source, destination)  # FileExistsError: nothing of ours to remove
    try:
        _fill(source, destination)
        sync_dir(destination.parent)
    except BaseException:
        _remove_copy(destination)
        raise
    try:
        if os.path.isdir(source) and not os.path.islink(source):
            shutil.rmtree(source)
        else:
            os.unlink(source)
    except OSError:
        log.error("%s is copied whole to %s but could not be removed after", source, destination)
        raise
    sync_dir(source.parent)


def _check_room(source: Path, folder: Path) -> None:
    """OSError ENOSPC unless ``folder``'s filesystem has room for a copy of ``source``."""
    allocated, entries = _allocated(source)
    fs = os.statvfs(folder)
    # Each entry may end in a part-block of the destination's own block size.
    needed = allocated + entries * fs.f_frsize + HEADROOM_BYTES
    free = fs.f_bavail * fs.f_frsize
    if free < needed:
        raise OSError(
            errno.ENOSPC,
            f"not moving {source} to {folder}: the copy needs {needed} bytes"
            f" ({human_bytes(needed)}), {free} bytes ({human_bytes(free)}) are free there",
            str(source),
        )


def _allocated(source: Path) -> tuple[int, int]:
    """The bytes ``source``'s entries take on disk (holes are free), and how many there are.

    Refuses (OSError) a tree holding anything but files, folders and symlinks.
    """
    found = os.lstat(source)
    if stat.S_IFMT(found.st_mode) not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
        raise OSError(errno.EINVAL, "not a file, folder or symlink: cannot copy it", str(source))
    allocated, entries = found.st_blocks * 512, 1
    if stat.S_ISDIR(found.st_mode):
        for name in sorted(os.listdir(source)):
            child_bytes, child_entries = _allocated(source / name)
            allocated += child_bytes
            entries += child_entries
    return allocated, entries


def _create(source: Path, destination: Path) -> None:
    """Make ``destination`` empty, of ``source``'s kind; FileExistsError if it exists."""
    mode = os.lstat(source).st_mode
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(source), destination)
    elif stat.S_ISDIR(mode):
        os.mkdir(destination, 0o700)
    else:
        os.close(os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _fill(source: Path, destination: Path) -> None:
    """Copy ``source``'s content, owner, mode and times into the ``destination`` just created."""
    found = os.lstat(source)
    if stat.S_ISDIR(found.st_mode):
        for name in sorted(os.listdir(source)):
            _create(source / name, destination / name)
            _fill(source / name, destination / name)
    elif stat.S_ISREG(found.st_mode):
        _copy_file(source, destination, found.st_size)
    _take_owner(destination, found)
    shutil.copystat(source, destination, follow_symlinks=False)
    if stat.S_ISDIR(found.st_mode):
        sync_dir(destination)
    elif stat.S_ISREG(found.st_mode):
        fd = os.open(destination, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _take_owner(destination: Path, found: os.stat_result) -> None:
    """Give the copy the source's owner where sentinel may (as root); else keep its own."""
    copy = os.lstat(destination)
    if (copy.st_uid, copy.st_gid) == (found.st_uid, found.st_gid):
        return
    with contextlib.suppress(PermissionError):  # not root: the copy stays sentinel's user's
        os.chown(destination, found.st_uid, found.st_gid, follow_symlinks=False)


def _copy_file(source: Path, destination: Path, size: int) -> None:
    """Copy the data of the file ``source`` into ``destination``, holes left as holes."""
    src = os.open(source, os.O_RDONLY)
    try:
        dst = os.open(destination, os.O_WRONLY)
        try:
            copy_range = True
            for start, end in _data_extents(src, size):
                copy_range = _copy_extent(src, dst, start, end, copy_range=copy_range)
            os.ftruncate(dst, size)  # a hole at the end stays a hole
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each run of data in the first ``size`` bytes of the file ``fd``.

    The whole file where the filesystem cannot tell data from holes.
    """
    if not hasattr(os, "SEEK_DATA"):
        yield 0, size
        return
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as error:
            if error.errno == errno.ENXIO:
                return  # no data after offset: the rest is a hole
            if error.errno != errno.EINVAL:
                raise
            yield offset, size  # SEEK_DATA not supported here: copy the rest as it reads
            return
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)  # the file's end counts as a hole
        yield start, end
        offset = end


def _copy_extent(src: int, dst: int, start: int, end: int, *, copy_range: bool) -> bool:
    """Copy bytes ``start`` to ``end`` of ``src`` to the same place in ``dst``.

    By copy_file_range(2) while ``copy_range`` holds and the kernel can, else by reads and
    writes; returns whether copy_file_range may still be tried.
    """
    offset = start
    while offset < end:
        count = min(CHUNK_BYTES, end - offset)
        copied = 0
        if copy_range:
            try:
                copied = os.copy_file_range(src, dst, count, offset, offset)
            except OSError as error:
                if error.errno not in _CANNOT_COPY_RANGE:
                    raise
                copy_range = False
        if copied == 0:
            data = os.pread(src, count, offset)
            if not data:
                return copy_range  # the file shrank while it was copied: the rest is a hole
            copied = os.pwrite(dst, data, offset)
        offset += copied
    return copy_range


def _remove_copy(destination: Path) -> None:
    """Remove the partial copy at ``destination`` (sentinel's own); log if it cannot."""
    try:
        if os.path.isdir(destination) and not os.path.islink(destination):
            shutil.rmtree(destination)
        else:
            os.unlink(destination)
    except OSError as error:
        log.error("could not remove the partial copy %s: %s", destination, error)
    else:
        log.warning("removed the partial copy %s", destination)
