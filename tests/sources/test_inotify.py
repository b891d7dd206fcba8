"""FileWatches: real inotify watches on real files, renamed, linked and written."""

from __future__ import annotations

import select
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.follow.inotify import FileWatches

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


@pytest.fixture
def watches() -> Iterator[FileWatches]:
    opened = FileWatches()
    yield opened
    opened.close()


def woken(watches: FileWatches) -> bool:
    """Whether an event waits; the kernel queues it within the write, so no wait is needed."""
    ready, _, _ = select.select([watches.fileno()], [], [], 0)
    watches.drain()
    return bool(ready)


def append(path: Path, data: bytes = b"line\n") -> None:
    with path.open("ab") as file:
        file.write(data)


def test_a_write_to_a_watched_file_wakes_and_drain_empties(
    tmp_path: Path, watches: FileWatches
) -> None:
    log = tmp_path / "train.log"
    log.touch()
    watches.watch(str(log))
    assert not woken(watches)
    append(log)
    assert woken(watches)
    assert not woken(watches)


def test_a_file_not_watched_does_not_wake(tmp_path: Path, watches: FileWatches) -> None:
    watched, other = tmp_path / "a.log", tmp_path / "b.log"
    watched.touch()
    other.touch()
    watches.watch(str(watched))
    append(other)
    assert not woken(watches)


def test_watching_again_after_a_rotation_follows_the_new_file(
    tmp_path: Path, watches: FileWatches
) -> None:
    log, rotated = tmp_path / "train.log", tmp_path / "train.log.1"
    log.touch()
    watches.watch(str(log))
    log.rename(rotated)
    log.touch()
    watches.watch(str(log))
    append(log)
    assert woken(watches)
    append(rotated)
    assert not woken(watches)


def test_a_symlink_and_its_target_share_a_watch_that_outlives_one_of_them(
    tmp_path: Path, watches: FileWatches
) -> None:
    target, link = tmp_path / "train.log", tmp_path / "current.log"
    target.touch()
    link.symlink_to(target)
    watches.watch(str(target))
    watches.watch(str(link))
    watches.unwatch(str(link))
    append(target)
    assert woken(watches)


def test_a_missing_path_is_not_watched_until_it_exists(
    tmp_path: Path, watches: FileWatches
) -> None:
    log = tmp_path / "later.log"
    watches.watch(str(log))
    log.touch()
    append(log)
    assert not woken(watches)
    watches.watch(str(log))
    append(log)
    assert woken(watches)
