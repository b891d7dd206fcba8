"""Find the metric files a training framework writes under a folder, as they appear.

A user who runs ``sentinel run -- python train.py`` rarely says where the job
writes its metrics, and many frameworks write them somewhere by default:
Lightning's ``CSVLogger`` to ``lightning_logs/version_N/metrics.csv``, its
``TensorBoardLogger`` and the HF Trainer to ``events.out.tfevents.*`` files,
MLflow to ``mlruns/``, Detectron2 and mmengine to JSON-lines files, the HF
Trainer its ``trainer_state.json`` into each ``checkpoint-N/`` (reported once it
parses, since it is read whole, not followed). A
:class:`MetricFileFinder` walks the folder (bounded: depth, folders, files),
reports each such file written since it started, and is woken by inotify when
a folder it watches gains a file or a file in it is closed after a write, so
it looks again only when something may have appeared.

Bounds, so a job started in a home directory costs little: at most
``MAX_DEPTH`` folders deep, ``MAX_DIRS`` folders watched and ``MAX_FILES``
files reported; hidden folders (``.git``, sentinel's ``.sentinel`` state),
rollback's ``quarantine`` folders, virtual environments and caches are never
entered. Only files written since ``since`` count: a ``version_0`` left by
yesterday's run is not today's.

The finder knows nothing of formats: which names are metric files, and which of
those cannot be read here, it asks the functions it is given (``sentinel.supervisor.metric_files``,
above both the sources and the parsers, decides).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from sentinel.checkpoints.scan import QUARANTINE_DIR
from sentinel.follow.inotify import IN_CREATE, IN_MOVED_TO, FileWatches

logger = logging.getLogger(__name__)

#: A file's path below the root has at most this many parts (``mlruns/0/<run>/metrics/loss``: 5).
MAX_DEPTH = 5
#: Folders walked and watched at most; a deeper or wider tree is not searched further.
MAX_DIRS = 512
#: Files reported at most.
MAX_FILES = 64
#: Folders never entered, besides hidden ones.
SKIPPED_DIRS = frozenset(
    {QUARANTINE_DIR, "__pycache__", "node_modules", "site-packages", "venv", "wandb"}
)
#: Files read whole, not followed: reported once complete (they parse), and not counted
#: in ``MAX_FILES`` (a long HF run writes one a checkpoint).
WHOLE_FILES = frozenset({"trainer_state.json"})
#: JSON-lines metric files by name: Detectron2's ``metrics.json``, mmengine's ``scalars.json``.
JSON_LINES_NAMES = frozenset({"metrics.json", "scalars.json"})
#: A ``.jsonl`` file is a metrics file when its name says so.
JSONL_NAME_WORDS = ("metric", "log", "train", "history", "progress", "scalar", "loss", "stats")
#: A file written this long before ``since`` still counts (coarse file-system clocks).
MTIME_SLACK_S = 2.0
#: Without events (no inotify, or a network file system), how often to look; with
#: them, a look this often anyway, for the events a full queue dropped.
RESCAN_INTERVAL_S = 10.0
#: Looks at most this often: a job writing many files wakes the finder once per this.
MIN_RESCAN_S = 0.5
#: ... and a look that took long waits this many times as long before the next: a busy
#: tree (a home directory) costs at most about 5% of a core.
RESCAN_COST_FACTOR = 20

#: inotify: a file open for writing was closed (a logger that opens, appends, closes).
IN_CLOSE_WRITE = 0x00000008
_DIR_MASK = IN_CREATE | IN_MOVED_TO | IN_CLOSE_WRITE


def json_lines(name: str) -> bool:
    """Whether a file so named is a JSON-lines metrics file (one record a line)."""
    if name in JSON_LINES_NAMES:
        return True
    lowered = name.lower()
    return lowered.endswith(".jsonl") and any(word in lowered for word in JSONL_NAME_WORDS)


class MetricFileFinder:
    """Reports the metric files written under ``root`` since ``since``, once each, from its
    own thread: ``on_found(path, skip)``, where ``skip`` is None or ``(device, inode,
    size)``: a JSON-lines file that was there, untouched, before ``since`` and is written
    again (a job that appends to yesterday's ``metrics.jsonl``); its first ``size`` bytes
    are not this run's.

    ``is_metric_file(path)``: whether a file so named is a metric file; ``unreadable(path)``:
    why a metric file cannot be read here (a missing extra), None when it can: such a file
    is not reported. ``skip``: folders never entered (the state dir). ``poll``: no inotify,
    look every ``poll_interval_s`` (network file systems).
    """

    def __init__(
        self,
        root: str | Path,
        on_found: Callable[[str, tuple[int, int, int] | None], None],
        *,
        since: float,
        is_metric_file: Callable[[str], bool],
        unreadable: Callable[[str], str | None] = lambda path: None,
        skip: Collection[str | Path] = (),
        poll: bool = False,
        poll_interval_s: float = RESCAN_INTERVAL_S,
        max_depth: int = MAX_DEPTH,
        max_dirs: int = MAX_DIRS,
        max_files: int = MAX_FILES,
    ) -> None:
        self.root = os.path.abspath(root)
        self._on_found = on_found
        self._since = since - MTIME_SLACK_S
        self._is_metric_file = is_metric_file
        self._unreadable = unreadable
        self._skip = frozenset(os.path.abspath(path) for path in skip)
        self._poll = poll
        self._interval_s = poll_interval_s if poll else RESCAN_INTERVAL_S
        self._max_depth = max_depth
        self._max_dirs = max_dirs
        self._max_files = max_files
        self._found: list[str] = []
        self._reported: set[str] = set()
        #: Files reported to be followed (``WHOLE_FILES`` are not).
        self._followed = 0
        #: JSON-lines files seen untouched since before ``since``: size by (device, inode).
        self._older: dict[tuple[int, int], int] = {}
        self._told: set[str] = set()
        self._watches: FileWatches | None = None
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._thread: threading.Thread | None = None

    @property
    def found(self) -> list[str]:
        """The files reported so far, in order."""
        return list(self._found)

    @property
    def running(self) -> bool:
        """Whether the finding thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Watch and look on a thread; the first look is at once."""
        if not self._poll:
            try:
                self._watches = FileWatches()
            except OSError as error:
                logger.info("no inotify (%s): looking for metric files every %g s",
                            error, self._interval_s)  # fmt: skip
        self._thread = threading.Thread(target=self._run, name="sentinel-discover", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop looking (files already reported stay followed by whoever took them)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"\0")
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        watches, self._watches = self._watches, None
        if watches is not None:
            watches.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def look(self) -> list[str]:
        """Walk the tree once (watching its folders); the files newly found, reported."""
        new: list[str] = []
        for path in self._walk():
            if path in self._reported:
                continue
            whole = os.path.basename(path) in WHOLE_FILES
            if whole and not _complete(path):
                continue  # being written: its close wakes the finder again
            if not whole and self._followed >= self._max_files:
                self._tell_once("files", "more than %d metric files under %s: no more followed",
                                self._max_files, self.root)  # fmt: skip
                continue
            self._reported.add(path)
            if not whole:
                self._followed += 1
            self._found.append(path)
            new.append(path)
            logger.info("%s %s (found under %s)", "reading" if whole else "following", path,
                        self.root)  # fmt: skip
            try:
                self._on_found(path, self._written_before(path))
            except Exception:
                logger.exception("cannot follow the metric file %s", path)
        return new

    def _run(self) -> None:
        next_look = 0.0
        while not self._stopping.is_set():
            wait_s = max(0.0, next_look - time.monotonic())
            if wait_s and self._stopping.wait(wait_s):
                return
            started = time.monotonic()
            try:
                self.look()
            except Exception:
                logger.exception("cannot look for metric files under %s", self.root)
            took_s = time.monotonic() - started
            next_look = started + max(MIN_RESCAN_S, RESCAN_COST_FACTOR * took_s)
            waited = [self._wake_read]
            watches = self._watches
            if watches is not None:
                waited.append(watches.fileno())
            readable, _, _ = select.select(waited, [], [], self._interval_s)
            if watches is not None and watches.fileno() in readable:
                watches.drain()

    def _walk(self) -> list[str]:
        """The metric files in the tree, breadth first, written since ``since``."""
        files: list[str] = []
        if not os.path.isdir(self.root):
            # Not made yet (``--discover runs`` before the job makes it): its making shows
            # in the nearest folder that exists.
            if self._watches is not None:
                self._watches.watch(_existing_ancestor(self.root), _DIR_MASK)
            return files
        folders = [(self.root, 0)]
        dirs = 0
        while folders:
            folder, depth = folders.pop(0)
            dirs += 1
            if dirs > self._max_dirs:
                self._tell_once("dirs", "more than %d folders under %s: the rest not searched",
                                self._max_dirs, self.root)  # fmt: skip
                break
            # The watch before the listing: a file created in between is then not missed.
            if self._watches is not None:
                self._watches.watch(folder, _DIR_MASK)
            try:
                with os.scandir(folder) as listing:
                    entries = sorted(listing, key=lambda entry: entry.name)
            except OSError:
                continue
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        if depth + 1 < self._max_depth and not self._skipped(entry):
                            folders.append((entry.path, depth + 1))
                    elif entry.is_file() and self._wanted(entry):
                        files.append(entry.path)
        return files

    def _skipped(self, entry: os.DirEntry[str]) -> bool:
        name = entry.name
        if name.startswith(".") or name in SKIPPED_DIRS or entry.path in self._skip:
            return True
        # A virtual environment by another name.
        return os.path.exists(os.path.join(entry.path, "pyvenv.cfg"))

    def _wanted(self, entry: os.DirEntry[str]) -> bool:
        if entry.path in self._reported or not self._is_metric_file(entry.path):
            return False
        status = entry.stat()
        if status.st_mtime < self._since:
            if json_lines(entry.name):
                self._older.setdefault((status.st_dev, status.st_ino), status.st_size)
            return False
        reason = self._unreadable(entry.path)
        if reason is not None:
            self._tell_once("unreadable", "%s is not followed: %s", entry.path, reason)
            return False
        return True

    def _written_before(self, path: str) -> tuple[int, int, int] | None:
        """``(device, inode, size)`` of the bytes of ``path`` written before ``since``."""
        try:
            status = os.stat(path)
        except OSError:
            return None
        size = self._older.get((status.st_dev, status.st_ino))
        return None if size is None else (status.st_dev, status.st_ino, size)

    def _tell_once(self, what: str, message: str, *args: object) -> None:
        if what not in self._told:
            self._told.add(what)
            logger.warning(message, *args)


def _existing_ancestor(path: str) -> str:
    """``path``'s nearest parent that exists."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _complete(path: str) -> bool:
    """Whether a whole-read JSON file is all there (it parses)."""
    try:
        with open(path, "rb") as stream:
            json.loads(stream.read())
    except (OSError, ValueError, RecursionError):
        return False
    return True
