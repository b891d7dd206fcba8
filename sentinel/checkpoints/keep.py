"""Keep clean copies of the checkpoints a job will lose: those it overwrites, those it deletes.

A file whose name carries no step (nanoGPT's ``ckpt.pt``, ``last.pt``) is rewritten
by the job at every save, so the clean version is gone once the rewrite after the
onset begins. A checkpoint named by its place in training (``model_step40.pt``,
Lightning's ``epoch=0-step=50.ckpt``, HF's ``checkpoint-400/``) is deleted by a job that
keeps only its newest few (Lightning's ``save_top_k=1``, HF's ``save_total_limit``), so
after a blow-up the one left may be the one written after the onset.

The keeper looks at such checkpoints once a clock tick (a stat each; a folder's files
listed) and, when a new version has stopped changing between two looks and parses,
keeps it under ``<dir>/.sentinel-kept/<name>/<number>/<name>`` beside a ``kept.json``
sidecar. An overwritten file: a reflink where the filesystem can, a hard link where the
job replaces the file by rename (a link to the new inode is then never written again),
otherwise a copy; the last ``versions`` versions of each file are kept. A checkpoint
named by its step: a hard link (of each file, for a folder, so that it survives the
folder's deletion), which costs nothing until the job deletes its own name, else a
reflink or a copy; the last ``versions`` checkpoints of the dir are kept. Never one:
the checkpoint written after the onset is kept before sentinel knows it is poisoned,
so the one before it must survive. While a warning is open (``keep_before``), the newest
version from before its onset is kept beyond ``versions`` too: a job that saves several
times between the first warning and the stop would otherwise rotate out every version
from before the onset, and leave nothing clean to roll back to. A job that saves more
often than a version settles (a small model's Trainer with ``save_total_limit=1`` saving
every second) deletes each checkpoint before it could be judged settled: so a new
checkpoint named by its step is hard-linked (staged) at each look that finds it changed,
and one the job deletes, or that leaves the newest, is kept from its staged links once
they parse (the job has moved on to a later save, so the links hold the finished files).

Keeping reads gigabytes, so it runs on a worker thread of its own: a look never
waits for a copy, and the supervisor's loop never waits for either.
"""

from __future__ import annotations

import contextlib
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

from sentinel.checkpoints.clone import (
    CANNOT_REFLINK,
    Method,
    clone,
    copy_tree,
    link_or_clone,
    reflink,
)
from sentinel.checkpoints.files import check_weights, read_content, says_whole
from sentinel.checkpoints.layouts import (
    CheckpointStatus,
    counts_saves,
    dir_content,
    holds_checkpoint,
    judge_dir,
    judge_file,
)
from sentinel.checkpoints.names import checkpoint_suffix, is_in_progress, is_shard, position_of
from sentinel.checkpoints.scan import QUARANTINE_DIR, Onset, checkpoint_folders, own_root
from sentinel.model.untrusted import json_value

log = logging.getLogger(__name__)

KEPT_DIR = ".sentinel-kept"
SIDECAR = "kept.json"
DEFAULT_MAX_BYTES = 4 * 1024**3
DEFAULT_VERSIONS = 2
#: A version is complete once its size and mtime held this long (two looks apart), or at
#: the second look that finds it unchanged where its format says it is whole.
SETTLE_S = 2.0

_STAGING_PREFIX = ".staging-"


@dataclass(frozen=True)
class KeptVersion:
    """One kept version of a checkpoint, as its sidecar records it.

    For a folder, ``size`` and ``mtime_ns`` are its files' bytes and the newest of their
    mtimes, ``inode`` the folder's own.
    """

    #: The kept file or folder, ``<dir>/.sentinel-kept/<name>/<number>/<name>``.
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

    @property
    def stepped(self) -> bool:
        """Whether it is a checkpoint named by its step (a new name each save), not a file
        the job overwrites."""
        return not is_overwritten_file(self.original.name)

    def intact(self) -> bool:
        """Whether the kept copy still is the version kept (a link the job rewrote is not)."""
        found = version_of(self.path)
        return found is not None and found[:2] == (self.size, self.mtime_ns)

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


def is_stepped_checkpoint(name: str, *, is_dir: bool) -> bool:
    """Whether ``name`` is a checkpoint named by its place in training (``model_step40.pt``,
    ``epoch=0-step=50.ckpt``, a ``checkpoint-400`` folder): a new name at each save, which
    a job that keeps only its newest checkpoints deletes later.

    A folder so named is one only if it holds what a checkpoint holds (the keeper looks).
    """
    if name.startswith(".") or name == QUARANTINE_DIR or is_in_progress(name) or is_shard(name):
        return False
    if not is_dir and not checkpoint_suffix(name):
        return False
    position = position_of(name)
    return position.step is not None or position.epoch is not None or position.keyed


def version_of(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of a checkpoint from another: a file's size, mtime_ns and
    inode; a folder's bytes (of its files, at any depth), their newest mtime_ns and their
    count. None where it is gone (or a folder changed while listed)."""
    try:
        stat = os.stat(path)
        if not os.path.isdir(path):
            return (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        size = newest = count = 0
        for folder, _dirnames, filenames in os.walk(path):
            for name in filenames:
                file_stat = os.stat(os.path.join(folder, name))
                size += file_stat.st_size
                newest = max(newest, file_stat.st_mtime_ns)
                count += 1
    except OSError:
        return None
    return (size, newest, count)


def kept_versions(directory: Path, name: str | None = None) -> list[KeptVersion]:
    """The versions kept in ``directory`` (of file ``name``, or of every file), oldest first.

    Only finished versions count: a staging folder or a sidecar that does not parse is
    skipped. A missing directory gives an empty list.
    """
    root = own_root(directory) / KEPT_DIR
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
    """What the keeper knows of one checkpoint: its last look and the last version it handled."""

    #: ``version_of`` at the last look, and since when it has been unchanged.
    seen: tuple[int, int, int] | None = None
    seen_since: float = 0.0
    #: The last version handed to the worker (kept, or judged not worth keeping).
    handled: tuple[int, int, int] | None = None
    #: The job replaced the file by rename at its last save (a new inode).
    replaces_by_rename: bool = False
    warned_too_big: bool = False
    #: A checkpoint named by its step whose files a look linked (``Keeper._stage_now``).
    staged: bool = False


@dataclass(frozen=True)
class _Job:
    path: Path
    seen: tuple[int, int, int]
    link_ok: bool
    #: A checkpoint named by its step (kept by link where it can), not an overwritten file.
    stepped: bool = False
    #: Keep what the last look linked of a checkpoint the job deleted or that left the
    #: newest (``Keeper._stage_now``), or the job's own where it is still there.
    finish: bool = False


#: How a listing orders checkpoints named by their step: step, epoch, then mtime_ns.
_Order = tuple[int, int, int]


class Keeper:
    """Keep the clean versions of the checkpoints a job rewrites in place or deletes.

    ``poll(now)`` costs a directory listing, a stat per checkpoint and a listing of the
    newest checkpoint folders; keeping runs on a worker thread, which ``flush`` waits for
    (before a rollback) and ``close`` ends.
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
        #: The checkpoints named by their step that are among the newest, by name.
        self._stepped: dict[str, _Tracked] = {}
        #: Those listed at the last look, with their order.
        self._listed: dict[str, _Order] = {}
        self._said_too_big = False
        self._said_rotation = False
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._reflink = True
        #: Versions handed over and not yet done with, under ``_idle``.
        self._pending = 0
        self._idle = threading.Condition()
        #: Whether a checkpoint named by its step is linked at each look (until a link
        #: cannot be made here: then staging would copy gigabytes a look).
        self._stage = True
        #: ``poll`` (the loop's tick) and ``flush`` (a rollback's thread) both look.
        self._looking = threading.Lock()
        #: Whether the first look dropped an earlier sentinel's stale staging.
        self._swept = False
        #: The onset of the earliest open warning (``keep_before``); read by the worker.
        self._onset: Onset | None = None

    def keep_before(self, onset: Onset | None) -> None:
        """Keep the newest version from before ``onset`` (an open warning's) beyond the last
        ``versions``, until it is lifted (None: no warning open). The rollback that may follow
        goes to it."""
        self._onset = onset

    def poll(self, now: float) -> None:
        """Look at the checkpoints once; hand each new, settled version to the worker."""
        if self.max_bytes <= 0:
            return
        with self._looking:
            self._poll(now)

    def _poll(self, now: float) -> None:
        if not self._swept:
            self._swept = True
            self._sweep_staging()
        try:
            with os.scandir(self.directory) as listing:
                entries = [(entry.name, _kind(entry)) for entry in listing]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as error:
            log.warning("cannot list %s for checkpoints to keep: %s", self.directory, error)
            return
        for name, kind in entries:
            if kind == "dir" or not is_overwritten_file(name):
                continue
            path = self.directory / name
            if kind == "link" and os.path.dirname(os.path.realpath(path)) == str(self.directory):
                continue  # a pointer (Lightning's last.ckpt link): its target is kept as itself
            tracked = self._tracked.setdefault(name, _Tracked())
            # A hard link to a symbolic link is one more name for the link, not the version.
            self._look(path, tracked, now, link_ok=kind != "link")
        stepped = [
            name
            for name, kind in entries
            if kind != "link" and is_stepped_checkpoint(name, is_dir=kind == "dir")
        ]
        self._poll_stepped(stepped, now)

    def versions(self, path: Path) -> list[KeptVersion]:
        """The kept versions of the file at ``path``, oldest first."""
        return kept_versions(self.directory, Path(path).name)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every version handed over is kept; False if ``timeout_s`` ran out.

        A staged checkpoint the job deleted since the last look is handed over first: a
        rollback right after the job's last save still finds it.
        """
        with self._looking:
            for name, tracked in self._stepped.items():
                if not os.path.lexists(self.directory / name):
                    self._finish(name, tracked)
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def set_aside(self, names: list[str], timeout_s: float | None = None) -> None:
        """Forget the checkpoints named by their step that a rollback set aside (``names``,
        in the keeper's dir): they were written after the onset. What a look staged of
        one is never kept (its links would be kept as "deleted by the job" once it is gone
        from its place), and the versions kept of them are dropped: counted among the last
        ``versions``, they would push out the clean ones that a rollback further back (the
        restart did not restore health) needs. The job's own are in the quarantine."""
        with self._looking:
            for name in names:
                tracked = self._stepped.pop(name, None)
                if tracked is not None and tracked.staged:
                    _discard(self._stepped_staging(name))
        with self._idle:  # a look before this one may have handed one over: let it finish
            self._idle.wait_for(lambda: self._pending == 0, timeout_s)
        for name in names:
            for version in kept_versions(self.directory, name):
                if version.stepped:
                    shutil.rmtree(version.path.parent)  # sentinel's links, never the job's
                    log.info(
                        "dropped kept version %d of %s: set aside after the onset",
                        version.number,
                        version.original,
                    )

    def close(self, timeout_s: float | None = None) -> None:
        """Finish the versions handed over, then stop the worker; drop the staged links of
        the checkpoints still in their place (the job's own stand: its links add nothing,
        and a sentinel started later stages them again)."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout_s)
            self._worker = None
        with self._looking:
            for name, tracked in self._stepped.items():
                if tracked.staged and os.path.lexists(self.directory / name):
                    tracked.staged = False
                    _discard(self._stepped_staging(name))

    def _sweep_staging(self) -> None:
        """At the first look: drop what an earlier sentinel staged of a checkpoint still in
        its place. One the job deleted meanwhile is left as it is: its links may be the only
        copy there is."""
        root = own_root(self.directory) / KEPT_DIR
        try:
            names = os.listdir(root)
        except OSError:
            return
        for name in names:
            staging = self._stepped_staging(name)
            if os.path.isdir(staging) and os.path.lexists(self.directory / name):
                _discard(staging)

    def _poll_stepped(self, names: list[str], now: float) -> None:
        """Look at the newest ``versions`` checkpoints named by their step: older ones were
        kept when they were the newest, or came before sentinel."""
        listed: dict[str, _Order] = {}
        for name in names:
            try:
                mtime_ns = os.stat(self.directory / name).st_mtime_ns
            except OSError:
                continue  # gone since listed
            position = position_of(name)
            step = -1 if position.step is None else position.step
            listed[name] = (step, -1 if position.epoch is None else position.epoch, mtime_ns)
        self._notice_rotation(listed)
        newest = sorted(listed, key=listed.__getitem__)[-self.versions_kept :]
        for name, tracked in self._stepped.items():
            if name not in newest:  # deleted by the job, or no longer among the newest
                self._finish(name, tracked)
        self._stepped = {name: self._stepped.get(name) or _Tracked() for name in newest}
        for name, tracked in self._stepped.items():
            path = self.directory / name
            if path.is_dir() and not _holds_checkpoint(path):
                continue  # "version_0", "runs_2": a number, and nothing a checkpoint holds
            self._look(path, tracked, now, stepped=True)

    def _notice_rotation(self, listed: dict[str, _Order]) -> None:
        """Say once that the job deletes its older checkpoints as it saves, and what it means."""
        before, self._listed = self._listed, listed
        if self._said_rotation or not listed:
            return
        newest = max(listed, key=listed.__getitem__)
        latest = listed[newest]
        gone = sorted(n for n, order in before.items() if n not in listed and order < latest)
        if not gone:
            return
        self._said_rotation = True
        left = "only its newest checkpoint" if len(listed) == 1 else f"its newest {len(listed)}"
        what = (
            f"the job deletes its older checkpoints as it saves ({', '.join(gone)} went once"
            f" {newest} was written): it keeps {left}, and after a blow-up that may be one"
            " written after the onset"
        )
        if self._said_too_big:
            log.warning(
                "%s; its checkpoints are over [keep] max_bytes (%d), so sentinel keeps none"
                " and a rollback may find no clean checkpoint: raise max_bytes",
                what,
                self.max_bytes,
            )
            return
        log.info(
            "%s. sentinel keeps the last %d clean ones it saw in %s (hard links where it can:"
            " no disk until the job deletes its own), so a rollback puts the newest clean one"
            " back where the job looks",
            what,
            self.versions_kept,
            own_root(self.directory) / KEPT_DIR,
        )

    def _look(
        self,
        path: Path,
        tracked: _Tracked,
        now: float,
        *,
        stepped: bool = False,
        link_ok: bool = True,
    ) -> None:
        seen = version_of(path)
        if seen is None:
            tracked.seen = None
            return
        if seen == tracked.handled:
            return
        if seen[0] > self.max_bytes:  # a write only adds: over now, over once settled
            self._handled(tracked, seen, stepped=stepped)
            self._too_big(path, seen[0], tracked, stepped=stepped)
            if tracked.staged:  # linked while it was smaller: its links would hold the disk
                tracked.staged = False
                _discard(self._stepped_staging(path.name))
            return
        if seen != tracked.seen:
            tracked.seen, tracked.seen_since = seen, now
            if stepped:
                if self._stage and tracked.handled is None:
                    tracked.staged = self._stage_now(path) or tracked.staged
                return
            if not says_whole(path):
                return
            # A file whose format ends where it says (torch's zip end record, a safetensors
            # length) is whole now: kept at once. nanoGPT's ckpt.pt rewritten every 0.8 s
            # never held still between two looks, so no version was kept and a NaN left
            # nothing clean to resume. A copy the job rewrites meanwhile is dropped.
        elif now - tracked.seen_since < self.settle_s and (stepped or not says_whole(path)):
            return  # unchanged at two looks, but not for long enough: the write may go on
        self._handled(tracked, seen, stepped=stepped)
        self._submit(_Job(path, seen, link_ok and tracked.replaces_by_rename, stepped))

    def _finish(self, name: str, tracked: _Tracked) -> None:
        """Hand over a staged checkpoint that was never judged settled, once the job moved
        on from it (deleted it, or saved newer ones)."""
        if not tracked.staged or tracked.seen is None or tracked.handled == tracked.seen:
            return
        tracked.staged = False
        self._handled(tracked, tracked.seen, stepped=True)
        self._submit(_Job(self.directory / name, tracked.seen, True, True, finish=True))

    def _handled(self, tracked: _Tracked, seen: tuple[int, int, int], *, stepped: bool) -> None:
        previous = tracked.handled
        tracked.handled = seen
        if previous is not None and not stepped:
            tracked.replaces_by_rename = previous[2] != seen[2]

    def _too_big(self, path: Path, size: int, tracked: _Tracked, *, stepped: bool) -> None:
        """Say once (for each overwritten file; for all checkpoints named by their step)
        that a checkpoint is over ``max_bytes`` and will not be kept."""
        if stepped and not self._said_too_big:
            log.warning(
                "not keeping %s: %d bytes is over [keep] max_bytes (%d); if the job deletes"
                " it, no clean copy of it is left (said once for the checkpoints of %s)",
                path,
                size,
                self.max_bytes,
                self.directory,
            )
            self._said_too_big = True
        elif not stepped and not tracked.warned_too_big:
            log.warning(
                "not keeping versions of %s: %d bytes is over [keep] max_bytes (%d);"
                " once the job rewrites it, no clean copy is left",
                path,
                size,
                self.max_bytes,
            )
        else:
            log.debug("not keeping %s: over [keep] max_bytes", path)
        tracked.warned_too_big = True

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
                if job.finish:
                    self._finish_stepped(job)
                elif job.stepped:
                    self._keep_stepped(job)
                else:
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
        staging = self._staging(name, number)
        kept = staging / name
        method = self._clone(job, kept)
        after = version_of(job.path)
        if after != job.seen or os.stat(kept).st_size != size:
            log.info("not keeping %s: it changed while being kept", job.path)
            shutil.rmtree(staging)
            return
        if method is not Method.LINK:
            os.utime(kept, ns=(mtime_ns, mtime_ns))
        step, epoch = self._read_position(kept)
        self._commit(staging, job, number, method, (step, epoch), inode)
        self._prune(name)

    def _keep_stepped(self, job: _Job) -> None:
        """Keep a checkpoint named by its step: link it (each of its files) first, so that
        a job that deletes it now takes nothing away; then judge the kept copy."""
        size, mtime_ns, _ = job.seen
        name = job.path.name
        existing = kept_versions(self.directory, name)
        if any((v.size, v.mtime_ns) == (size, mtime_ns) for v in existing):
            return  # kept already (or put back from a kept one)
        number = max((v.number for v in existing), default=0) + 1
        staging = self._staging(name, number)
        kept = staging / name
        try:
            method = copy_tree(job.path, kept, link=True, try_reflink=self._reflink)
        except FileNotFoundError:
            log.info("not keeping %s: the job deleted it before it could be kept", job.path)
            _discard(staging)
            return
        after = version_of(job.path)
        copied = version_of(kept)
        changed = after is not None and after != job.seen
        if changed or copied is None or copied[:2] != (size, mtime_ns):
            log.info("not keeping %s: it changed while being kept", job.path)
            _discard(staging)
            return
        inode = job.seen[2] if not kept.is_dir() else _inode(job.path)
        self._commit_stepped(staging, job, number, method, inode)

    def _commit_stepped(
        self, staging: Path, job: _Job, number: int, method: Method, inode: int, why: str = ""
    ) -> None:
        """Keep the checkpoint staged in ``staging`` once it is clean as the scan judges it;
        then drop the oldest beyond ``versions``."""
        kept = staging / job.path.name
        problem = checkpoint_problem(kept)
        if problem:
            log.info("not keeping %s%s: %s", job.path, why, problem)
            _discard(staging)
            return
        position = position_of(job.path.name)
        step, epoch = position.step, position.epoch
        if counts_saves(job.path) or counts_saves(kept):
            step = None  # accelerate's checkpoint_<i>: the i-th save, placed by its time
        if step is None and epoch is None:
            step, epoch = _content_position(kept)
        elif not kept.is_dir() and (not position.keyed or position.generic):
            # A file's bare number: its step, unless it holds an epoch and no step (as the
            # scan).
            held = _content_position(kept)
            if held[0] is None and held[1] is not None:
                step, epoch = held
        self._commit(staging, job, number, method, (step, epoch), inode)
        self._prune_stepped()

    def _stepped_staging(self, name: str) -> Path:
        """Where a checkpoint named by its step is staged: it is kept once (number 1)."""
        return own_root(self.directory) / KEPT_DIR / name / f"{_STAGING_PREFIX}{1:06d}"

    def _stage_now(self, path: Path) -> bool:
        """Link a checkpoint named by its step as it is now, in the look itself (a link per
        file: no data is read), so that a job that deletes it right after takes nothing
        away. The staging of an earlier look is replaced once this one is whole; True when
        it is staged."""
        name = path.name
        if kept_versions(self.directory, name):
            return False  # kept already (or put back from a kept one)
        staging = self._stepped_staging(name)
        fresh = staging.with_name(staging.name + ".new")
        try:
            if fresh.exists():
                shutil.rmtree(fresh)
            fresh.mkdir(parents=True)
            copy_tree(path, fresh / name, link=True, only_links=True)
        except FileNotFoundError:
            _discard(fresh)  # deleted since listed: an earlier look's staging stands
            return staging.exists()
        except OSError as error:
            # No hard links here: staging would copy the checkpoint at every look.
            self._stage = False
            _discard(fresh)
            log.info(
                "cannot hard-link in %s (%s): a checkpoint is kept once it settled, and one"
                " the job deletes sooner is lost",
                self.directory,
                error.strerror or error,
            )
            return False
        if staging.exists():
            shutil.rmtree(staging)
        os.rename(fresh, staging)
        return True

    def _finish_stepped(self, job: _Job) -> None:
        """Keep a staged checkpoint the job moved on from: the job's own where it is still
        there (it is finished: newer ones followed), else the links of its last stage."""
        name = job.path.name
        now = version_of(job.path)
        if now is not None:
            self._keep_stepped(_Job(job.path, now, True, True))
            return
        staging = self._stepped_staging(name)
        seen = version_of(staging / name)
        if seen is None or kept_versions(self.directory, name):
            log.info("not keeping %s: the job deleted it before it could be kept", job.path)
            if staging.exists():
                _discard(staging)
            return
        missing = self._missing_files(staging / name)
        if missing:
            log.info(
                "not keeping %s (deleted by the job): the look that linked it came mid-save"
                " (it lacks %s, which the job's newest checkpoint holds)",
                job.path,
                ", ".join(missing[:3]),
            )
            _discard(staging)
            return
        inode = seen[2] if not (staging / name).is_dir() else 0
        staged = _Job(job.path, seen, True, True)
        self._commit_stepped(staging, staged, 1, Method.LINK, inode, " (deleted by the job)")

    def _missing_files(self, staged: Path) -> list[str]:
        """What a staged checkpoint folder lacks of the files the job's newest checkpoint
        folder holds (by their place in it): the same job saves the same files each time,
        so a folder linked mid-save lacks some."""
        if not staged.is_dir():
            return []  # a file linked mid-save is cut short: it does not parse
        listed = self._listed  # the last look's checkpoints named by their step, in order
        folders = [name for name in listed if _holds_checkpoint(self.directory / name)]
        if not folders:
            return []
        newest = max(folders, key=listed.__getitem__)
        return sorted(_relative_files(self.directory / newest) - _relative_files(staged))

    def _staging(self, name: str, number: int) -> Path:
        staging = own_root(self.directory) / KEPT_DIR / name / f"{_STAGING_PREFIX}{number:06d}"
        if staging.exists():
            shutil.rmtree(staging)  # a staging folder of ours left by a crash
        staging.mkdir(parents=True)
        return staging

    def _commit(
        self,
        staging: Path,
        job: _Job,
        number: int,
        method: Method,
        position: tuple[int | None, int | None],
        inode: int,
    ) -> None:
        """Write the sidecar, then give the staging folder its number: the version is kept."""
        size, mtime_ns, _ = job.seen
        name = job.path.name
        folder = staging.parent / f"{number:06d}"
        version = KeptVersion(
            path=folder / name,
            original=job.path,
            number=number,
            step=position[0],
            epoch=position[1],
            mtime=mtime_ns / 1e9,
            mtime_ns=mtime_ns,
            size=size,
            inode=inode,
            method=str(method),
            kept_at=time.time(),
        )
        (staging / SIDECAR).write_text(json.dumps(version.to_json(), indent=2) + "\n")
        os.rename(staging, folder)
        log.info("kept version %d of %s (%s, %d bytes)", number, job.path, method, size)

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

    def _beyond(self, versions: list[KeptVersion]) -> list[KeptVersion]:
        """Of ``versions`` (oldest first), those to drop: all but the last ``versions``, and
        the newest from before an open warning's onset when none of those is."""
        cut = max(len(versions) - self.versions_kept, 0)
        old, last = versions[:cut], versions[cut:]
        onset = self._onset
        if onset is None or any(_before(v, onset) for v in last):
            return old
        clean = [v for v in old if _before(v, onset)]
        return [v for v in old if not clean or v is not clean[-1]]

    def _prune(self, name: str) -> None:
        for old in self._beyond(kept_versions(self.directory, name)):
            # Only the keeper's own folder goes: a link's inode lives on in the job's file.
            shutil.rmtree(old.path.parent)
            log.debug("dropped kept version %d of %s", old.number, old.original)

    def _prune_stepped(self) -> None:
        """Keep the last ``versions`` checkpoints named by their step, in the order written."""
        versions = [v for v in kept_versions(self.directory) if v.stepped]
        versions.sort(key=lambda v: (v.mtime_ns, v.kept_at))  # copies may share an mtime
        for old in self._beyond(versions):
            shutil.rmtree(old.path.parent)  # sentinel's links or copies, never the job's names
            with contextlib.suppress(OSError):
                old.path.parent.parent.rmdir()  # the name's folder, once it holds no version
            log.debug("dropped kept version %d of %s", old.number, old.original)


def _before(version: KeptVersion, onset: Onset) -> bool:
    """Whether ``version`` was surely written before ``onset`` (by its step, epoch or time)."""
    return not onset.reaches(version.step, version.epoch, version.mtime)


def _discard(staging: Path) -> None:
    """Remove a staging folder of ours (if it was made), and its name's folder once it holds
    nothing."""
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        staging.parent.rmdir()


def _kind(entry: os.DirEntry[str]) -> str:
    """ "link", "dir" or "file" (anything else, or gone: "file")."""
    try:
        if entry.is_symlink():
            return "link"
        return "dir" if entry.is_dir() else "file"
    except OSError:
        return "file"


def _holds_checkpoint(path: Path) -> bool:
    try:
        return holds_checkpoint(path)
    except OSError:
        return False


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return 0  # the job deleted it since: the kept copy is all there is


def checkpoint_problem(path: Path) -> str:
    """What keeps a checkpoint (a file or a folder) from being resumed from, as the scan
    judges it; "" when it is clean."""
    try:
        verdict = judge_dir(path) if path.is_dir() else judge_file(path)
    except OSError as error:
        return f"unreadable: {error.strerror or error}"
    return "" if verdict.status is CheckpointStatus.CLEAN else verdict.reason or str(verdict.status)


def _content_position(path: Path) -> tuple[int | None, int | None]:
    """The step and epoch a checkpoint holds inside (its trainer_state, its pickle)."""
    try:
        content = dir_content(path) if path.is_dir() else read_content(path)
    except OSError:
        return None, None
    return content.step, content.epoch


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


def _relative_files(folder: Path) -> set[str]:
    """The files below ``folder``, by their path relative to it."""
    return {
        os.path.relpath(os.path.join(root, name), folder)
        for root, _dirs, names in os.walk(folder)
        for name in names
    }


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read_sidecar(folder: Path, name: str) -> KeptVersion | None:
    try:
        raw = json_value((folder / SIDECAR).read_text())
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


class FolderKeepers:
    """A ``Keeper`` for each folder whose checkpoints are a dir's (``checkpoint_folders``):
    the dir itself and, in Lightning's ``lightning_logs``, each ``version_<N>/checkpoints/``,
    a keeper for a new version's from the first look that finds it. Lightning's default
    ``save_top_k=1`` deletes each save as it writes the next; with ``--checkpoints
    lightning_logs`` nothing was kept, and a blow-up whose one save came after its onset
    gave up ("no clean checkpoint") with the clean one deleted by the job."""

    def __init__(self, directory: Path, **settings: Any) -> None:
        self.directory = Path(os.path.abspath(directory))
        self._settings = settings
        #: As each ``Keeper``'s: how long a version must hold still.
        self.settle_s: float = settings.get("settle_s", SETTLE_S)
        self._onset: Onset | None = None
        self.keepers: dict[Path, Keeper] = {}
        self._follow()

    def _follow(self) -> None:
        for folder in checkpoint_folders(self.directory):
            if folder not in self.keepers:
                keeper = self.keepers[folder] = Keeper(folder, **self._settings)
                keeper.keep_before(self._onset)

    def keep_before(self, onset: Onset | None) -> None:
        self._onset = onset
        for keeper in self.keepers.values():
            keeper.keep_before(onset)

    def poll(self, now: float) -> None:
        self._follow()
        for keeper in self.keepers.values():
            keeper.poll(now)

    def flush(self, timeout_s: float | None = None) -> bool:
        return all([keeper.flush(timeout_s) for keeper in self.keepers.values()])

    def set_aside(self, paths: list[Path], timeout_s: float | None = None) -> None:
        """``Keeper.set_aside`` for each quarantined checkpoint, by the folder it was in."""
        for folder, keeper in self.keepers.items():
            names = [p.name for p in paths if Path(os.path.abspath(p.parent)) == folder]
            keeper.set_aside(names, timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        for keeper in self.keepers.values():
            keeper.close(timeout_s)
