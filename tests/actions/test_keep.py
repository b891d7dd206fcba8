"""The keeper: clean versions of a checkpoint file the job overwrites, kept from real files."""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from sentinel.checkpoints.clone import Method, clone, reflink
from sentinel.checkpoints.keep import KEPT_DIR, SIDECAR, Keeper, is_overwritten_file, kept_versions
from sentinel.checkpoints.rollback import plan_rollback
from sentinel.checkpoints.scan import Onset
from tests.helpers.kept import (
    digest,
    fixture_position,
    mtime_ns,
    replace_by_rename,
    rewrite_in_place,
    settle,
    version_bytes,
)


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[Keeper]:
    made = Keeper(tmp_path)
    yield made
    made.close(timeout_s=10)


def test_rewritten_in_place_is_kept_as_a_copy_that_survives_the_rewrite(
    tmp_path: Path, keeper: Keeper
) -> None:
    ckpt = tmp_path / "ckpt.pt"
    rewrite_in_place(ckpt, 20)
    now = settle(keeper, 0.0)
    rewrite_in_place(ckpt, 40)
    settle(keeper, now)

    first, second = keeper.versions(ckpt)
    assert (first.number, first.method, second.method) == (1, "copy", "copy")
    assert digest(first.path.read_bytes()) == digest(version_bytes(20))
    assert digest(second.path.read_bytes()) == digest(version_bytes(40))
    assert first.path.stat().st_ino != ckpt.stat().st_ino
    assert (first.mtime_ns, first.path.stat().st_mtime_ns) == (mtime_ns(20), mtime_ns(20))
    assert first.intact() and second.intact()
    sidecar = json.loads((first.path.parent / SIDECAR).read_text())
    assert sidecar["original"] == str(ckpt)
    assert (sidecar["size"], sidecar["method"]) == (len(version_bytes(20)), "copy")
    assert first.path == tmp_path / KEPT_DIR / "ckpt.pt" / "000001" / "ckpt.pt"


def test_replaced_by_rename_is_kept_by_hard_link(tmp_path: Path, keeper: Keeper) -> None:
    ckpt = tmp_path / "last.pt"
    replace_by_rename(ckpt, 20)
    now = settle(keeper, 0.0)
    replace_by_rename(ckpt, 40)
    now = settle(keeper, now)
    replace_by_rename(ckpt, 60)
    settle(keeper, now)

    versions = keeper.versions(ckpt)
    # The first version: the job's habit is not known yet, so a copy.
    assert [v.method for v in versions] == ["link", "link"]
    v40, v60 = versions
    assert v60.path.stat().st_ino == ckpt.stat().st_ino
    assert v40.path.stat().st_nlink == 1  # the job's name for it is gone: only ours holds it
    assert digest(v40.path.read_bytes()) == digest(version_bytes(40))
    assert v40.intact() and v60.intact()


def test_only_the_last_versions_are_kept(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path, versions=2)
    ckpt = tmp_path / "ckpt.pt"
    now = 0.0
    for step in (20, 40, 60):
        rewrite_in_place(ckpt, step)
        now = settle(keeper, now)
    keeper.close()
    assert [(v.number, v.mtime_ns) for v in kept_versions(tmp_path, "ckpt.pt")] == [
        (2, mtime_ns(40)),
        (3, mtime_ns(60)),
    ]
    assert sorted(os.listdir(tmp_path / KEPT_DIR / "ckpt.pt")) == ["000002", "000003"]


def test_an_open_warning_keeps_the_newest_version_from_before_its_onset(tmp_path: Path) -> None:
    """A warning opened at step 30: the job saves twice more before any stop, and the last
    two versions (40, 60) are both after it; the one of step 20 stays for the rollback."""
    keeper = Keeper(tmp_path, versions=2, position_reader=fixture_position)
    ckpt = tmp_path / "ckpt.pt"
    now = settle_version(keeper, ckpt, 20, 0.0)
    keeper.keep_before(Onset(step=30))
    for step in (40, 60):
        now = settle_version(keeper, ckpt, step, now)
    assert [v.step for v in kept_versions(tmp_path, "ckpt.pt")] == [20, 40, 60]

    plan = plan_rollback(tmp_path, 30)
    assert plan.restore is not None and plan.restore.step == 20
    assert plan.put_back is not None

    keeper.close()


def test_a_closed_warning_keeps_nothing_more(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path, versions=2, position_reader=fixture_position)
    ckpt = tmp_path / "ckpt.pt"
    now = settle_version(keeper, ckpt, 20, 0.0)
    keeper.keep_before(Onset(step=30))
    now = settle_version(keeper, ckpt, 40, now)
    keeper.keep_before(None)  # the warning resolved before the next save
    settle_version(keeper, ckpt, 60, now)
    keeper.close()
    assert [v.step for v in kept_versions(tmp_path, "ckpt.pt")] == [40, 60]


def test_a_version_from_before_the_onset_among_the_last_ones_is_enough(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path, versions=2, position_reader=fixture_position)
    keeper.keep_before(Onset(step=50))  # 40 is before it, and among the last two
    ckpt = tmp_path / "ckpt.pt"
    now = 0.0
    for step in (20, 40, 60):
        now = settle_version(keeper, ckpt, step, now)
    keeper.close()
    assert [v.step for v in kept_versions(tmp_path, "ckpt.pt")] == [40, 60]


def settle_version(keeper: Keeper, ckpt: Path, step: int, now: float) -> float:
    rewrite_in_place(ckpt, step)
    return settle(keeper, now)


def test_a_write_in_progress_is_never_kept(tmp_path: Path, keeper: Keeper) -> None:
    ckpt = tmp_path / "ckpt.pt"
    data = version_bytes(20)
    with open(ckpt, "wb") as handle:
        for now, end in enumerate(range(500, len(data), 500)):
            handle.write(data[end - 500 : end])
            handle.flush()
            keeper.poll(float(now * 5))  # a look whenever the file has grown
        assert keeper.flush(timeout_s=10)
        assert keeper.versions(ckpt) == []
        # The write stalls half done: settled, yet no torch archive to parse.
        keeper.poll(100.0)
        keeper.poll(200.0)
        assert keeper.flush(timeout_s=10)
        assert keeper.versions(ckpt) == []
        handle.write(data[handle.tell() :])
    settle(keeper, 300.0)
    assert [digest(v.path.read_bytes()) for v in keeper.versions(ckpt)] == [digest(data)]


def test_a_version_not_settled_long_enough_waits(tmp_path: Path, keeper: Keeper) -> None:
    """A legacy pickle (pre-1.6 torch.save) has no end record to say it is whole: it waits
    to hold still for the settle time."""
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(pickle.dumps({"iter_num": 20, "model": [0.5] * 100}, protocol=2))
    keeper.poll(0.0)
    keeper.poll(keeper.settle_s / 2)
    assert keeper.flush(timeout_s=10)
    assert keeper.versions(ckpt) == []
    keeper.poll(keeper.settle_s)
    assert keeper.flush(timeout_s=10)
    assert len(keeper.versions(ckpt)) == 1


def test_a_whole_zip_rewritten_under_a_second_apart_is_kept_at_first_sight(
    tmp_path: Path, keeper: Keeper
) -> None:
    """torch.save's zip says it is whole (its end record at its end): it is kept at the first
    look that finds it so. nanoGPT's ckpt.pt rewritten every 0.8 s never held still between
    two looks, and a NaN found no clean version. One cut short is never kept."""
    ckpt = tmp_path / "ckpt.pt"
    data = version_bytes(20)
    ckpt.write_bytes(data[: len(data) - 10])  # mid-write: no end record yet
    keeper.poll(0.0)
    keeper.poll(0.5)
    assert keeper.flush(timeout_s=10)
    assert keeper.versions(ckpt) == []
    for look, step in enumerate((20, 40)):
        rewrite_in_place(ckpt, step)
        keeper.poll(1.0 + look)
        assert keeper.flush(timeout_s=10)
    kept = [digest(v.path.read_bytes()) for v in keeper.versions(ckpt)]
    assert kept == [digest(version_bytes(20)), digest(version_bytes(40))]


def test_over_the_cap_is_not_kept_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = Keeper(tmp_path, max_bytes=1000)
    ckpt = tmp_path / "ckpt.pt"
    rewrite_in_place(ckpt, 20)
    with caplog.at_level(logging.WARNING, logger="sentinel.checkpoints.keep"):
        settle(keeper, 0.0)
    assert keeper.versions(ckpt) == []
    assert not (tmp_path / KEPT_DIR).exists()
    assert "max_bytes" in caplog.text and "ckpt.pt" in caplog.text


def test_a_version_equal_to_a_kept_one_is_not_kept_again(tmp_path: Path, keeper: Keeper) -> None:
    """After a rollback puts a kept version back, the file is that version again."""
    ckpt = tmp_path / "ckpt.pt"
    rewrite_in_place(ckpt, 20)
    now = settle(keeper, 0.0)
    ckpt.unlink()
    rewrite_in_place(ckpt, 20)  # a new inode, the same size and mtime
    settle(keeper, now)
    assert len(keeper.versions(ckpt)) == 1


def test_a_kept_link_the_job_rewrites_in_place_is_no_longer_intact(
    tmp_path: Path, keeper: Keeper
) -> None:
    ckpt = tmp_path / "ckpt.pt"
    replace_by_rename(ckpt, 20)
    now = settle(keeper, 0.0)
    replace_by_rename(ckpt, 40)
    settle(keeper, now)
    linked = keeper.versions(ckpt)[-1]
    assert linked.method == "link"
    rewrite_in_place(ckpt, 60)  # the job changed its habit: our link's inode is rewritten
    assert not linked.intact()


@pytest.mark.parametrize(
    ("name", "tracked"),
    [
        ("ckpt.pt", True),
        ("last.pt", True),
        ("model.safetensors", True),
        ("last.ckpt", True),
        ("checkpoint-40.pt", False),
        ("model_step40.pt", False),
        ("epoch_3.pt", False),
        ("model-00001-of-00002.safetensors", False),
        (".ckpt.pt.tmp", False),
        (".hidden.pt", False),
        ("notes.txt", False),
        ("quarantine", False),
    ],
)
def test_which_files_are_tracked(name: str, tracked: bool) -> None:
    assert is_overwritten_file(name) is tracked


def test_hidden_files_are_left_alone(tmp_path: Path, keeper: Keeper) -> None:
    # Step-named ones are kept as checkpoints the job may delete (test_keep_rotation.py).
    (tmp_path / ".ckpt.pt").write_bytes(version_bytes(40))
    (tmp_path / ".model_step40.pt").write_bytes(version_bytes(40))
    settle(keeper, 0.0)
    assert kept_versions(tmp_path) == []
    assert not (tmp_path / KEPT_DIR).exists()


def test_a_file_behind_a_symbolic_link_is_kept_by_copy_never_as_a_link_to_the_link(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere, checkpoints = tmp_path / "elsewhere", tmp_path / "ckpt"
    elsewhere.mkdir()
    checkpoints.mkdir()
    (checkpoints / "ckpt.pt").symlink_to(elsewhere / "ckpt.pt")
    keeper = Keeper(checkpoints)
    now = 0.0
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        for step in (20, 40):
            replace_by_rename(elsewhere / "ckpt.pt", step)  # a new inode behind the link
            now = settle(keeper, now)
    keeper.close()
    versions = kept_versions(checkpoints)
    assert [v.method for v in versions] == ["copy", "copy"]
    assert [digest(v.path.read_bytes()) for v in versions] == [
        digest(version_bytes(20)),
        digest(version_bytes(40)),
    ]
    assert not any(v.path.is_symlink() for v in versions)
    assert "could not keep" not in caplog.text


def test_polling_a_missing_directory_does_nothing(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path / "not-yet")
    keeper.poll(0.0)
    keeper.poll(10.0)
    assert keeper.flush(timeout_s=1)
    assert not (tmp_path / "not-yet").exists()
    assert kept_versions(tmp_path / "not-yet") == []


def test_a_sidecar_that_does_not_parse_is_skipped(
    tmp_path: Path, keeper: Keeper, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt.pt"
    rewrite_in_place(ckpt, 20)
    settle(keeper, 0.0)
    (keeper.versions(ckpt)[0].path.parent / SIDECAR).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="sentinel.checkpoints.keep"):
        assert kept_versions(tmp_path) == []
    assert "unreadable sidecar" in caplog.text


def test_the_step_inside_is_recorded(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path)  # read from inside, by the scan's pickle walk
    ckpt = tmp_path / "ckpt.pt"
    now = 0.0
    for step in (20, 40):
        rewrite_in_place(ckpt, step)
        now = settle(keeper, now)
    keeper.close()
    assert [v.step for v in kept_versions(tmp_path)] == [20, 40]


def test_clone_falls_back_to_a_copy_and_never_overwrites(tmp_path: Path) -> None:
    source = tmp_path / "ckpt.pt"
    source.write_bytes(version_bytes(20))
    method = clone(source, tmp_path / "copy.pt")
    # A reflink on btrfs or XFS; here (ext4, tmpfs, overlay) the ioctl is refused: a copy.
    assert method in (Method.REFLINK, Method.COPY)
    assert (tmp_path / "copy.pt").read_bytes() == version_bytes(20)
    assert (tmp_path / "copy.pt").stat().st_ino != source.stat().st_ino
    (tmp_path / "taken.pt").write_bytes(b"mine")
    for attempt in (
        lambda: clone(source, tmp_path / "taken.pt"),
        lambda: reflink(source, tmp_path / "taken.pt"),
    ):
        with pytest.raises(FileExistsError):
            attempt()
    assert (tmp_path / "taken.pt").read_bytes() == b"mine"
