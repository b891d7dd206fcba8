"""Keep a clean copy of each checkpoint file the job overwrites at every save.

A file whose name carries no step (nanoGPT's ``ckpt.pt``, ``last.pt``) is rewritten
by the job at every save, so the clean version is gone once the rewrite after the
onset begins. The keeper looks at such files once a clock tick (a stat each) and,
when a new version has stopped changing between two looks and parses, keeps it under
``<dir>/.sentinel-kept/<name>/<number>/<name>`` beside a ``kept.json`` sidecar: a
reflink where the filesystem can, a hard link where the job replaces the file by
rename (a link to the new inode is then never written again), otherwise a copy.
The last ``versions`` versions of each file are kept: one written after the onset
is kept before sentinel knows it is poisoned, so the one before it must survive.

Keeping reads gigabytes, so it runs on a worker thread of its own: a look never
waits for a copy, and the supervisor's loop never waits for either.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sentinel.checkpoints.clone import CANNOT_REFLINK, Method, clone, link_or_clone, reflink
from sentinel.checkpoints.files import check_weights, read_content
from sentinel.checkpoints.names import checkpoint_suffix, is_in_progress, is_shard, position_of
from sentinel.checkpoints.scan import QUARANTINE_DIR

log = logging.getLogger(__name__)

KEPT_DIR = ".sentinel-kept"
SIDECAR = "kept.json"
DEFAULT_MAX_BYTES = 4 * 1024**3
DEFAULT_VERSIONS = 2
#: A version is complete once its size and mtime held this long (two looks apart).
SETTLE_S = 2.0

_STAGING_PREFIX = ".staging-"


@dataclass(frozen=True)
class KeptVersion:
    """One kept version of a checkpoint file, as its sidecar records it."""

    #: The kept file, ``<dir>/.sentinel-kept/<name>/<number>/<name>``.
    path: Path
    #: Where the job wrote it (absolute).
    original: Path
    number: int
    step: int | None
    epoch: int | None
    mtime: float
    mtime_ns: int
    size: int
    #: The inode the job's version had when it was kept.
    inode: int
    method: str
    kept_at: float

    def intact(self) -> bool:
        """Whether the kept file still is the version kept (a link the job rewrote is not)."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return False
        return (stat.st_size, stat.st_mtime_ns) == (self.size, self.mtime_ns)

    def to_json(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["path"] = str(self.path)
        fields["original"] = str(self.original)
        return fields


def is_overwritten_file(name: str) -> bool:
    """Whether ``name`` is a weights file whose name carries no step or epoch.

    Such a file (``ckpt.pt``, ``last.pt``) is rewritten at every save.
    """
    if name.startswith(".") or name == QUARANTINE_DIR or is_in_progress(name) or is_shard(name):
        return False
    position = position_of(name)
    placed = position.step is not None or position.epoch is not None or position.keyed
    return bool(checkpoint_suffix(name)) and not placed  # keyed: hpc_ckpt_N, a new name each save


def kept_versions(directory: Path, name: str | None = None) -> list[KeptVersion]:
    """The versions kept in ``directory`` (of file ``name``, or of every file), oldest first.

    Only finished versions count: a staging folder or a sidecar that does not parse is
    skipped. A missing directory gives an empty list.
    """
    root = Path(os.path.abspath(directory)) / KEPT_DIR
    names = [name] if name is not None else _listdir(root)
    found: list[KeptVersion] = []
    for file_name in names:
        for entry in _listdir(root / file_name):
            if not entry.isdigit():
                continue
            version = _read_sidecar(root / file_name / entry, file_name)
            if version is not None:
                found.append(version)
    found.sort(key=lambda v: (v.original.name, v.number))
    return found


@dataclass
class _Tracked:
    """What the keeper knows of one file: its last look and the last version it handled."""

    #: (size, mtime_ns, inode) at the last look, and since when it has been unchanged.
    seen: tuple[int, int, int] | None = None
    seen_since: float = 0.0
    #: The last version handed to the worker (kept, or judged not worth keeping).
    handled: tuple[int, int, int] | None = None
    #: The job replaced the file by rename at its last save (a new inode).
    replaces_by_rename: bool = False
    warned_too_big: bool = False


@dataclass(frozen=True)
class _Job:
    path: Path
    seen: tuple[int, int, int]
    link_ok: bool


class Keeper:
    """Keep the clean versions of the checkpoint files a job rewrites in place.

    ``poll(now)`` costs a directory listing and a stat per tracked file; keeping runs
    on a worker thread, which ``flush`` waits for (before a rollback) and ``close`` ends.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        versions: int = DEFAULT_VERSIONS,
        settle_s: float = SETTLE_S,
        check: Callable[[Path], str] | None = None,
        position_reader: Callable[[Path], tuple[int | None, int | None]] | None = None,
    ) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.max_bytes = max_bytes
        self.versions_kept = max(versions, 2)
        self.settle_s = settle_s
        self._check = check or weights_problem
        self._read_position = position_reader or read_position
        self._tracked: dict[str, _Tracked] = {}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._reflink = True
        #: Versions handed over and not yet done with, under ``_idle``.
        self._pending = 0
        self._idle = threading.Condition()

    def poll(self, now: float) -> None:
        """Look at the tracked files once; hand each new, settled version to the worker."""
        if self.max_bytes <= 0:
            return
        try:
            names = [n for n in os.listdir(self.directory) if is_overwritten_file(n)]
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in names:
            path = self.directory / name
            linked = os.path.islink(path)
            if linked and os.path.dirname(os.path.realpath(path)) == str(self.directory):
                continue  # a pointer (Lightning's last.ckpt link): its target is kept as itself
            tracked = self._tracked.setdefault(name, _Tracked())
            # A hard link to a symbolic link is one more name for the link, not the version.
            self._look(path, tracked, now, link_ok=not linked)

    def versions(self, path: Path) -> list[KeptVersion]:
        """The kept versions of the file at ``path``, oldest first."""
        return kept_versions(self.directory, Path(path).name)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every version handed over is kept; False if ``timeout_s`` ran out."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the versions handed over, then stop the worker."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout_s)
            self._worker = None

    def _look(self, path: Path, tracked: _Tracked, now: float, *, link_ok: bool = True) -> None:
        try:
            stat = os.stat(path)
        except OSError:
            tracked.seen = None
            return
        seen = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        if seen == tracked.handled:
            return
        if seen != tracked.seen:
            tracked.seen, tracked.seen_since = seen, now
            return
        if now - tracked.seen_since < self.settle_s:
            return  # unchanged at two looks, but not for long enough: the write may go on
        previous = tracked.handled
        tracked.handled = seen
        if previous is not None:
            tracked.replaces_by_rename = previous[2] != seen[2]
        if stat.st_size > self.max_bytes:
            if not tracked.warned_too_big:
                log.warning(
                    "not keeping versions of %s: %d bytes is over [keep] max_bytes (%d);"
                    " once the job rewrites it, no clean copy is left",
                    path,
                    stat.st_size,
                    self.max_bytes,
                )
                tracked.warned_too_big = True
            return
        self._submit(_Job(path, seen, link_ok and tracked.replaces_by_rename))

    def _submit(self, job: _Job) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="keeper", daemon=True)
            self._worker.start()
        with self._idle:
            self._pending += 1
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                self._keep(job)
            except Exception:  # a keeper that fails must not take the watchdog with it
                log.exception("could not keep a version of %s", job.path if job else "?")
            finally:
                if job is not None:
                    with self._idle:
                        self._pending -= 1
                        self._idle.notify_all()

    def _keep(self, job: _Job) -> None:
        size, mtime_ns, inode = job.seen
        name = job.path.name
        existing = kept_versions(self.directory, name)
        if any((v.size, v.mtime_ns) == (size, mtime_ns) for v in existing):
            return  # this version is kept already (or was put back from a kept one)
        problem = self._check(job.path)
        if problem:
            log.info("not keeping %s: %s", job.path, problem)
            return
        number = max((v.number for v in existing), default=0) + 1
        folder = self.directory / KEPT_DIR / name
        staging = folder / f"{_STAGING_PREFIX}{number:06d}"
        if staging.exists():
            shutil.rmtree(staging)  # a staging folder of ours left by a crash
        staging.mkdir(parents=True)
        kept = staging / name
        method = self._clone(job, kept)
        after = _identity(job.path)
        if after != job.seen or os.stat(kept).st_size != size:
            log.info("not keeping %s: it changed while being kept", job.path)
            shutil.rmtree(staging)
            return
        if method is not Method.LINK:
            os.utime(kept, ns=(mtime_ns, mtime_ns))
        step, epoch = self._read_position(kept)
        version = KeptVersion(
            path=folder / f"{number:06d}" / name,
            original=job.path,
            number=number,
            step=step,
            epoch=epoch,
            mtime=mtime_ns / 1e9,
            mtime_ns=mtime_ns,
            size=size,
            inode=inode,
            method=str(method),
            kept_at=time.time(),
        )
        (staging / SIDECAR).write_text(json.dumps(version.to_json(), indent=2) + "\n")
        os.rename(staging, folder / f"{number:06d}")
        log.info("kept version %d of %s (%s, %d bytes)", number, job.path, method, size)
        self._prune(name)

    def _clone(self, job: _Job, destination: Path) -> Method:
        if self._reflink:
            try:
                reflink(job.path, destination)
                return Method.REFLINK
            except OSError as error:
                if error.errno not in CANNOT_REFLINK:
                    raise
                self._reflink = False  # the filesystem cannot: no ioctl per version from now on
        if job.link_ok:
            return link_or_clone(job.path, destination)
        return clone(job.path, destination, try_reflink=False)

    def _prune(self, name: str) -> None:
        versions = kept_versions(self.directory, name)
        for old in versions[: max(len(versions) - self.versions_kept, 0)]:
            # Only the keeper's own folder goes: a link's inode lives on in the job's file.
            shutil.rmtree(old.path.parent)
            log.debug("dropped kept version %d of %s", old.number, old.original)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino)


def weights_problem(path: Path) -> str:
    """What is wrong with one weights file ("" when it parses), as the scan judges it."""
    try:
        return check_weights(path)
    except OSError as error:
        return f"unreadable: {error.strerror or error}"


def read_position(path: Path) -> tuple[int | None, int | None]:
    """The step and epoch a weights file holds (``iter_num``...), read without unpickling it."""
    try:
        content = read_content(path)
    except OSError:
        return None, None
    return content.step, content.epoch


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read_sidecar(folder: Path, name: str) -> KeptVersion | None:
    try:
        raw = json.loads((folder / SIDECAR).read_text())
        return KeptVersion(
            path=folder / name,
            original=Path(raw["original"]),
            number=int(folder.name),
            step=None if raw.get("step") is None else int(raw["step"]),
            epoch=None if raw.get("epoch") is None else int(raw["epoch"]),
            mtime=float(raw["mtime"]),
            mtime_ns=int(raw["mtime_ns"]),
            size=int(raw["size"]),
            inode=int(raw["inode"]),
            method=str(raw["method"]),
            kept_at=float(raw["kept_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("skipping kept version %s: unreadable sidecar (%s)", folder, error)
        return None
