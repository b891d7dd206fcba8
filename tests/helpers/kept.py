"""Versions of one overwritten checkpoint file (nanoGPT's ckpt.pt), written as a job writes them."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from sentinel.checkpoints.keep import Keeper

FIXTURES = Path(__file__).parent.parent / "fixtures" / "keep"
STEPS = (20, 40, 60)
#: An mtime well in the past, so each version's own is distinct and exact.
T0_NS = 1_700_000_000 * 10**9


def version_bytes(step: int) -> bytes:
    """ckpt.pt as torch.save wrote it at ``step`` (tests/fixtures/make_keep_checkpoints.py)."""
    return (FIXTURES / f"ckpt_v{step}.pt").read_bytes()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fixture_step(path: Path) -> int | None:
    """The step a fixture version holds (``iter_num``), told by its bytes."""
    data = digest(path.read_bytes())
    return next((step for step in STEPS if digest(version_bytes(step)) == data), None)


def fixture_position(path: Path) -> tuple[int | None, int | None]:
    """``fixture_step`` as the keeper's position reader: the step, no epoch."""
    return fixture_step(path), None


def mtime_ns(step: int) -> int:
    return T0_NS + step * 10**9


def rewrite_in_place(path: Path, step: int) -> None:
    """Save as torch.save(obj, path) does: truncate and write the same inode."""
    with open(path, "r+b" if path.exists() else "wb") as handle:
        handle.truncate(0)
        handle.write(version_bytes(step))
    os.utime(path, ns=(mtime_ns(step), mtime_ns(step)))


def replace_by_rename(path: Path, step: int) -> None:
    """Save as an atomic writer does: a temp file, then rename over the old one."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_bytes(version_bytes(step))
    os.utime(temp, ns=(mtime_ns(step), mtime_ns(step)))
    os.replace(temp, path)


def settle(keeper: Keeper, now: float) -> float:
    """Two looks, the settle time apart, then wait for the worker; the next free time."""
    keeper.poll(now)
    keeper.poll(now + keeper.settle_s)
    assert keeper.flush(timeout_s=10)
    return now + keeper.settle_s + 1
