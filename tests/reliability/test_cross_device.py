"""A checkpoint moved to or from another filesystem is moved whole, or not at all.

Where rename(2) fails with EXDEV (the checkpoint, or the quarantine, is a mount of another
disk) the move is a copy and a removal. A second filesystem cannot be mounted here without
root, so the other disk is a folder: ``os.rename`` is made to fail with EXDEV for any move
into or out of it, as the kernel's does between two disks. The copies, the holes and the
failures are real.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from sentinel.checkpoints import cross_device
from sentinel.checkpoints.quarantine import MANIFEST, move_to_free
from sentinel.checkpoints.restore import restore_quarantine
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback
from sentinel.checkpoints.scan import QUARANTINE_DIR

GIB = 1024**3
MIB = 1024**2
LABEL = "20261121T031204-nan_inf"
#: Where the sparse file holds data: its start, its middle, and just before its last MiB.
DATA_OFFSETS = (0, 700 * MIB, 2 * GIB - 3 * MIB)


def other_disk(monkeypatch: pytest.MonkeyPatch, disk: Path) -> None:
    """Make ``disk`` a filesystem of its own: a rename into or out of it fails with EXDEV."""
    real_rename = os.rename

    def rename(source: str | Path, destination: str | Path, **kwargs: int) -> None:
        inside = [Path(os.path.abspath(p)).is_relative_to(disk) for p in (source, destination)]
        if inside[0] != inside[1]:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(source), None, destination)
        real_rename(source, destination, **kwargs)

    monkeypatch.setattr(os, "rename", rename)


def disk_fills_after(monkeypatch: pytest.MonkeyPatch, writes: int, error: BaseException) -> None:
    """Let the first ``writes`` chunks through (however they are written), then raise ``error``."""
    count = 0
    for name in ("copy_file_range", "pwrite"):
        real = getattr(os, name)

        def write(*args: int, real: object = real) -> int:
            nonlocal count
            count += 1
            if count > writes:
                raise error
            return real(*args)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(os, name, write)


def disk_nearly_full(monkeypatch: pytest.MonkeyPatch, free_bytes: int) -> None:
    """Have every filesystem report ``free_bytes`` free to whoever asks statvfs(2)."""
    block = 4096
    blocks = free_bytes // block
    report = os.statvfs_result((block, block, 10**6, blocks, blocks, 10**6, 10**5, 10**5, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: report)


def sparse_file(path: Path, size: int, offsets: tuple[int, ...]) -> dict[int, bytes]:
    """A file of ``size`` bytes, holes but for 1 MiB of random data at each of ``offsets``."""
    data = {offset: os.urandom(MIB) for offset in offsets}
    with open(path, "wb") as handle:
        handle.truncate(size)
        for offset, chunk in data.items():
            handle.seek(offset)
            handle.write(chunk)
    return data


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture
def sparse_ok(tmp_path: Path) -> None:
    """Skip where tmp_path's filesystem stores a file's holes as data."""
    probe = tmp_path / "probe"
    sparse_file(probe, 256 * MIB, (64 * MIB,))
    holes = allocated(probe) < 16 * MIB
    probe.unlink()
    if not holes:
        pytest.skip(f"the filesystem of {tmp_path} does not keep sparse files sparse")


def tree(root: Path) -> dict[str, object]:
    """Every entry below ``root``: a link's text, a file's digest; each one's mode, times, owner."""
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        stat = os.lstat(path)
        meta = (stat.st_mode, stat.st_mtime_ns, stat.st_uid, stat.st_gid)
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = ("link", os.readlink(path), *meta)
        elif path.is_dir():
            found[name] = ("dir", *meta)
        else:
            with open(path, "rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            found[name] = ("file", digest, *meta)
    return found


def folder_checkpoint(path: Path, *, step: int, extra_mib: int = 0) -> None:
    """An HF Trainer checkpoint folder: weights, state, a nested folder and a symlink."""
    path.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    weights = struct.pack("<Q", len(header)) + header + struct.pack("<q", step)
    (path / "model.safetensors").write_bytes(weights)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (path / "extra").mkdir()
    (path / "extra" / "shard_state.raw").write_bytes(os.urandom(4096))
    (path / "extra" / "shard_state.raw").chmod(0o640)
    (path / "optimizer_state.raw").write_bytes(os.urandom(extra_mib * MIB))
    (path / "latest").symlink_to("extra")
    os.utime(path / "trainer_state.json", ns=(1_700_000_000_000_000_000,) * 2)


@pytest.mark.usefixtures("sparse_ok")
def test_a_sparse_file_moved_across_keeps_its_holes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model-400.pt"
    data = sparse_file(source, 2 * GIB, DATA_OFFSETS)
    disk = tmp_path / "quarantine"
    disk.mkdir()
    other_disk(monkeypatch, disk)

    moved = move_to_free(source, disk, set())

    assert moved == disk / "model-400.pt"
    assert not os.path.lexists(source)
    assert os.stat(moved).st_size == 2 * GIB
    assert allocated(moved) < 64 * MIB  # 3 MiB of data, not 2 GiB of zeros
    with open(moved, "rb") as handle:
        for offset, chunk in data.items():
            handle.seek(offset)
            assert handle.read(MIB) == chunk
        for hole in (MIB, GIB, 2 * GIB - MIB):
            handle.seek(hole)
            assert handle.read(4096) == bytes(4096)


@pytest.mark.usefixtures("sparse_ok")
def test_a_file_that_is_all_hole_moves_across_as_a_hole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "empty-weights.bin"
    sparse_file(source, 64 * MIB, ())
    disk = tmp_path / "other"
    disk.mkdir()
    other_disk(monkeypatch, disk)
    moved = move_to_free(source, disk, set())
    assert os.stat(moved).st_size == 64 * MIB
    assert allocated(moved) < MIB
    with open(moved, "rb") as handle:
        assert handle.read() == bytes(64 * MIB)


@pytest.mark.parametrize(
    "fault",
    ["copy_file_range unsupported", "SEEK_DATA unsupported"],
)
def test_without_the_kernels_help_the_copy_is_still_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    source = tmp_path / "checkpoint-400"
    folder_checkpoint(source, step=400, extra_mib=20)
    before = tree(source)
    disk = tmp_path / "other"
    disk.mkdir()
    other_disk(monkeypatch, disk)
    if fault == "copy_file_range unsupported":

        def no_copy_range(*args: int) -> int:
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

        monkeypatch.setattr(os, "copy_file_range", no_copy_range)
    else:
        real_lseek = os.lseek

        def lseek(fd: int, offset: int, how: int) -> int:
            if how in (os.SEEK_DATA, os.SEEK_HOLE):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_lseek(fd, offset, how)

        monkeypatch.setattr(os, "lseek", lseek)

    moved = move_to_free(source, disk, set())

    assert tree(moved) == before
    assert not os.path.lexists(source)


def test_a_folder_checkpoint_moves_across_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "checkpoint-400"
    folder_checkpoint(source, step=400, extra_mib=20)
    if os.geteuid() == 0:  # the job's own files, moved by a sentinel running as root
        os.chown(source / "extra" / "shard_state.raw", 12345, 23456)
        os.chown(source / "latest", 12345, 23456, follow_symlinks=False)
    os.utime(source, ns=(1_600_000_000_000_000_000,) * 2)
    mode, mtime_ns = os.stat(source).st_mode, os.stat(source).st_mtime_ns
    before = tree(source)
    disk = tmp_path / "other"
    disk.mkdir()
    other_disk(monkeypatch, disk)

    moved = move_to_free(source, disk, set())

    assert moved == disk / "checkpoint-400"
    assert not os.path.lexists(source)
    assert tree(moved) == before  # contents, modes, mtimes; the link still a link
    assert (moved / "latest").is_symlink()
    assert (os.stat(moved).st_mode, os.stat(moved).st_mtime_ns) == (mode, mtime_ns)


def test_too_little_room_refuses_before_writing_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "checkpoint-400"
    folder_checkpoint(source, step=400, extra_mib=20)
    before = tree(source)
    disk = tmp_path / "other"
    disk.mkdir()
    other_disk(monkeypatch, disk)
    disk_nearly_full(monkeypatch, free_bytes=10 * MIB)
    disk_fills_after(monkeypatch, 0, AssertionError("a byte was written"))

    with pytest.raises(OSError) as raised:
        move_to_free(source, disk, set())

    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert str(source) in message
    needed = int(message.split("needs ")[1].split(" bytes")[0])
    assert needed > 20 * MIB
    assert f"{10 * MIB} bytes" in message  # what is free
    assert os.listdir(disk) == []
    assert tree(source) == before


@pytest.mark.parametrize(
    "error",
    [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
    ids=["disk full", "interrupted"],
)
@pytest.mark.parametrize("shape", ["file", "folder"])
def test_a_copy_that_fails_midway_leaves_no_part_and_the_source_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, shape: str
) -> None:
    source = tmp_path / ("optimizer_state.raw" if shape == "file" else "checkpoint-400")
    if shape == "file":
        source.write_bytes(os.urandom(3 * cross_device.CHUNK_BYTES))
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
    else:
        folder_checkpoint(source, step=400, extra_mib=20)
    before = tree(tmp_path)
    disk = tmp_path / "other"
    disk.mkdir()
    other_disk(monkeypatch, disk)
    disk_fills_after(monkeypatch, 1, error)

    with pytest.raises(type(error)):
        move_to_free(source, disk, set())

    assert os.listdir(disk) == []
    assert {k: v for k, v in tree(tmp_path).items() if k != "other"} == before
    if shape == "file":
        assert hashlib.sha256(source.read_bytes()).hexdigest() == digest


def build_run(directory: Path) -> None:
    """Clean 100 and 200, then 300 after an onset at 300: the one a rollback sets aside."""
    for step in (100, 200, 300):
        folder_checkpoint(directory / f"checkpoint-{step}", step=step, extra_mib=2)


@pytest.mark.parametrize("fault", ["refused before", "full midway"])
def test_a_rollback_onto_a_full_disk_leaves_the_checkpoint_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    build_run(tmp_path)
    before = tree(tmp_path)
    plan = plan_rollback(tmp_path, onset=300)
    assert [c.path.name for c in plan.quarantine] == ["checkpoint-300"]
    other_disk(monkeypatch, tmp_path / QUARANTINE_DIR)
    if fault == "refused before":
        disk_nearly_full(monkeypatch, free_bytes=MIB)
    else:
        disk_fills_after(monkeypatch, 1, OSError(errno.ENOSPC, "No space left on device"))

    with pytest.raises(OSError) as raised:
        apply_rollback(plan, tmp_path, label=LABEL)

    assert raised.value.errno == errno.ENOSPC
    assert tree(tmp_path / "checkpoint-300") == {
        k.removeprefix("checkpoint-300/"): v
        for k, v in before.items()
        if k.startswith("checkpoint-300/")
    }
    # Nothing half-moved: the folder holds only its manifest, which says what is where.
    folder = tmp_path / QUARANTINE_DIR / LABEL
    assert os.listdir(folder) == [MANIFEST]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert [(Path(i["origin"]).name, i["moved"]) for i in manifest["items"]] == [
        ("checkpoint-300", False)
    ]
    assert manifest["complete"] is False


@pytest.mark.usefixtures("sparse_ok")
def test_a_rollback_and_its_restore_across_filesystems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_run(tmp_path)
    offsets = (0, 100 * MIB)
    data = sparse_file(tmp_path / "checkpoint-300" / "optimizer_state.raw", 256 * MIB, offsets)
    before = tree(tmp_path)
    other_disk(monkeypatch, tmp_path / QUARANTINE_DIR)

    moved = apply_rollback(plan_rollback(tmp_path, onset=300), tmp_path, label=LABEL)

    assert moved == [tmp_path / QUARANTINE_DIR / LABEL / "checkpoint-300"]
    assert not os.path.lexists(tmp_path / "checkpoint-300")
    assert allocated(moved[0] / "optimizer_state.raw") < 16 * MIB

    with monkeypatch.context() as full:
        disk_nearly_full(full, free_bytes=MIB)
        with pytest.raises(OSError) as raised:
            restore_quarantine(tmp_path, LABEL)
    assert raised.value.errno == errno.ENOSPC  # the restore checks the room too
    assert not os.path.lexists(tmp_path / "checkpoint-300")
    assert (moved[0] / "optimizer_state.raw").is_file()
    assert (moved[0].parent / MANIFEST).is_file()

    restored = restore_quarantine(tmp_path, LABEL)

    assert [m.destination for m in restored] == [tmp_path / "checkpoint-300"]
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith(QUARANTINE_DIR)} == before
    optimizer = tmp_path / "checkpoint-300" / "optimizer_state.raw"
    assert allocated(optimizer) < 16 * MIB  # restored with its holes
    with open(optimizer, "rb") as handle:
        handle.seek(offsets[1])
        assert handle.read(MIB) == data[offsets[1]]
