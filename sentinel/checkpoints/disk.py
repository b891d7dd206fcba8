"""The disk that rollback's quarantine and the keeper's copies take in a checkpoint dir.

Each file counts once, by inode: a hard link the keeper holds to the job's current
file costs nothing until the job replaces that file, so it is not counted; a
quarantined file that is also kept counts in the quarantine. A reflink is counted
in full (what it shares cannot be seen without FIEMAP): the figure errs high.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sentinel.checkpoints.keep import KEPT_DIR
from sentinel.checkpoints.scan import QUARANTINE_DIR, checkpoint_folders, own_root


@dataclass(frozen=True)
class DiskUse:
    """Bytes set aside in one checkpoint dir."""

    directory: Path
    quarantine_bytes: int
    kept_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.quarantine_bytes + self.kept_bytes


@dataclass
class _Inode:
    size: int
    links: int
    seen: int = 0
    quarantined: bool = False


def disk_use(directory: Path) -> DiskUse:
    """Measure ``directory``'s quarantine and kept copies (zero where they do not exist)."""
    root = Path(os.path.abspath(directory))
    own = own_root(root)
    inodes: dict[tuple[int, int], _Inode] = {}
    # Kept copies of a Lightning pool live in each version's checkpoints folder.
    kept_dirs = [own_root(folder) / KEPT_DIR for folder in checkpoint_folders(root)]
    for folder, quarantined in ((own / QUARANTINE_DIR, True), *((k, False) for k in kept_dirs)):
        for path in _files(folder):
            try:
                stat = os.lstat(path)
            except OSError:
                continue  # gone since listed
            inode = inodes.setdefault(
                (stat.st_dev, stat.st_ino), _Inode(stat.st_size, stat.st_nlink)
            )
            inode.seen += 1
            inode.quarantined = inode.quarantined or quarantined
    quarantine = sum(i.size for i in inodes.values() if i.quarantined)
    # A kept inode with more links than seen here is the job's own file too: no extra cost.
    kept = sum(i.size for i in inodes.values() if not i.quarantined and i.links <= i.seen)
    return DiskUse(root, quarantine, kept)


def human_bytes(count: int) -> str:
    """``count`` bytes for people: 0 B, 512 B, 1.5 KiB, 4.0 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, _dirnames, filenames in os.walk(folder):
        found.extend(Path(dirpath) / name for name in filenames)
    return found
