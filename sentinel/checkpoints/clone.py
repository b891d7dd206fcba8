"""Copy a file or a folder as cheaply as the filesystem allows: a reflink, a hard link, else bytes.

Only ever reads the source and creates the destination (which must not exist):
the job's own file is never opened for writing.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

#: ioctl(dest_fd, FICLONE, src_fd): share the source's extents, copy on write (Linux).
FICLONE = 0x40049409
#: What an ioctl or link says when the filesystem (or the pair of them) cannot.
CANNOT_REFLINK = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS}
)
_CANNOT_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


class Method(StrEnum):
    """How a version was kept."""

    REFLINK = "reflink"
    LINK = "link"
    COPY = "copy"


def clone(source: Path, destination: Path, *, try_reflink: bool = True) -> Method:
    """Copy ``source`` to the new file ``destination``: a reflink where it can, else bytes."""
    if try_reflink:
        try:
            reflink(source, destination)
            return Method.REFLINK
        except OSError as error:
            if error.errno not in CANNOT_REFLINK:
                raise
            log.debug("no reflink for %s (%s): copying", source, os.strerror(error.errno or 0))
    if os.path.lexists(destination):
        raise FileExistsError(errno.EEXIST, "copy destination exists", str(destination))
    shutil.copyfile(source, destination)
    return Method.COPY


def link_or_clone(source: Path, destination: Path, *, try_reflink: bool = False) -> Method:
    """Hard-link ``source`` at ``destination``; where the filesystem cannot link, a reflink
    (with ``try_reflink``) or a copy."""
    try:
        os.link(source, destination)
        return Method.LINK
    except OSError as error:
        if error.errno not in _CANNOT_LINK:
            raise
    return clone(source, destination, try_reflink=try_reflink)


#: The methods from the cheapest to the costliest.
_COST = (Method.LINK, Method.REFLINK, Method.COPY)


def copy_tree(
    source: Path,
    destination: Path,
    *,
    link: bool,
    try_reflink: bool = True,
    only_links: bool = False,
) -> Method:
    """Make the new ``destination`` hold what ``source`` holds: the file, or each file of the
    folder at the same place below it (a symbolic link as a link).

    Each file is hard-linked (with ``link``), else reflinked (with ``try_reflink``), else
    copied; a copy keeps its source's mtime. With ``only_links`` a file that cannot be
    linked raises (OSError) instead: nothing is ever copied. Returns the costliest method
    used (a folder with no file: a link). ``FileNotFoundError`` when the source went while
    copied.
    """
    if only_links:
        link, try_reflink = True, False
    if not source.is_dir() or source.is_symlink():
        return _copy_file(source, destination, link=link, try_reflink=try_reflink, only=only_links)
    used = {Method.LINK}
    destination.mkdir()
    for folder, dirnames, filenames in os.walk(source):
        here = Path(folder)
        there = destination / here.relative_to(source)
        for name in sorted(dirnames):
            if (here / name).is_symlink():
                os.symlink(os.readlink(here / name), there / name)
            else:
                (there / name).mkdir()
        for name in sorted(filenames):
            if (here / name).is_symlink():
                os.symlink(os.readlink(here / name), there / name)
                continue
            used.add(
                _copy_file(
                    here / name, there / name, link=link, try_reflink=try_reflink, only=only_links
                )
            )
    return max(used, key=_COST.index)


def _copy_file(
    source: Path, destination: Path, *, link: bool, try_reflink: bool, only: bool = False
) -> Method:
    if only:
        os.link(source, destination)
        return Method.LINK
    if link:
        method = link_or_clone(source, destination, try_reflink=try_reflink)
    else:
        method = clone(source, destination, try_reflink=try_reflink)
    if method is not Method.LINK:
        mtime_ns = os.stat(source).st_mtime_ns
        os.utime(destination, ns=(mtime_ns, mtime_ns))
    return method


def reflink(source: Path, destination: Path) -> None:
    """Clone ``source`` to the new file ``destination``; OSError (CANNOT_REFLINK) if it cannot."""
    with open(source, "rb") as src:
        fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.ioctl(fd, FICLONE, src.fileno())
        except OSError:
            os.close(fd)
            os.unlink(destination)  # the empty file just created here, nothing else
            raise
        os.close(fd)
