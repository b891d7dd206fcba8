"""Linux inotify for one thing: waking the tailer's own thread when a followed file is written.

watchdog hands every event through threads of its own (three per watched directory
here), so a log written a line at a time cost three thread wake-ups a line: most of
what tailing it cost (4% of a core at 100 lines a second on a VM). A watch on each
followed file itself (``IN_MODIFY``), read on the tailer's thread, wakes that thread
alone, and the kernel merges the events that pile up while the tailer gathers a
batch. watchdog still watches the directories, for files that appear, move or go,
which are rare.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys

logger = logging.getLogger(__name__)

#: inotify's event for "the file was written" (appended, truncated).
IN_MODIFY = 0x00000002
#: In a watched directory: a file was created in it, or renamed into it.
IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080


class FileWatches:
    """``IN_MODIFY`` watches on files by path, on one inotify descriptor to ``select`` on.

    A path is watched through the file it names when ``watch`` is called; after a
    rotation, ``watch`` again moves the watch to the new file.
    """

    def __init__(self) -> None:
        """Open an inotify descriptor; OSError where there is none (not Linux, no quota)."""
        if sys.platform != "linux":
            raise OSError(errno.ENOSYS, "inotify is Linux's")
        self._libc = ctypes.CDLL(None, use_errno=True)
        fd = int(self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            raise _last_error("inotify_init1")
        self._fd = fd
        #: path -> (device, inode, watch descriptor) of the file it named when watched.
        self._watched: dict[str, tuple[int, int, int]] = {}
        self._failed: set[str] = set()

    def fileno(self) -> int:
        """The descriptor that is readable once a watched file was written."""
        return self._fd

    def watch(self, path: str, mask: int = IN_MODIFY) -> bool:
        """Watch the file (or directory) ``path`` names now for ``mask``'s events, unless it
        is watched already; whether it is watched."""
        try:
            status = os.stat(path)
        except OSError:
            return False  # not there (yet): the directory watch tells when it comes
        known = self._watched.get(path)
        if known is not None and known[:2] == (status.st_dev, status.st_ino):
            return True
        wd = int(self._libc.inotify_add_watch(self._fd, os.fsencode(path), mask))
        if wd < 0:
            if path not in self._failed:
                self._failed.add(path)
                error = _last_error("inotify_add_watch")
                logger.warning("cannot watch %s for writes (%s): polled instead", path, error)
            return False
        self._failed.discard(path)
        self._watched[path] = (status.st_dev, status.st_ino, wd)
        if known is not None:
            self._remove(known[2])
        return True

    def unwatch(self, path: str) -> None:
        """Stop watching ``path`` (nothing if it was not watched)."""
        known = self._watched.pop(path, None)
        if known is not None:
            self._remove(known[2])

    def drain(self) -> None:
        """Read the waiting events: they only woke the reader, what changed is re-read."""
        try:
            while os.read(self._fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Close the descriptor (the kernel drops its watches with it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._watched.clear()

    def _remove(self, wd: int) -> None:
        # Two paths naming one file (a symlink and its target) share a watch descriptor.
        if all(known[2] != wd for known in self._watched.values()):
            # Fails harmlessly (EINVAL) for a file deleted since: the kernel dropped it.
            self._libc.inotify_rm_watch(self._fd, wd)


def _last_error(call: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{call}: {os.strerror(number)}")
