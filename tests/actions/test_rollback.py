"""Tests for rollback planning and quarantine, over real checkpoint folders in tmp_path."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

from sentinel.checkpoints.keep import Keeper, kept_versions
from sentinel.checkpoints.quarantine import MANIFEST, fresh_label, sanitize_label
from sentinel.checkpoints.restore import RestoreRefused, restore_quarantine
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback
from sentinel.checkpoints.scan import QUARANTINE_DIR, CheckpointStatus, Onset, scan
from tests.helpers.kept import (
    digest,
    fixture_position,
    mtime_ns,
    rewrite_in_place,
    settle,
    version_bytes,
)

LABEL = "20261121T031204-nan_inf"


def write_checkpoint(
    path: Path, *, step: int, state: bool = True, weights: bool = True, corrupt: bool = False
) -> None:
    """Write an HF Trainer checkpoint dir whose files carry the step in their content."""
    path.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    length = 999 if corrupt else len(header)
    data = struct.pack("<Q", length) + header + struct.pack("<q", step)
    if weights:
        (path / "model.safetensors").write_bytes(data)
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def build_run(directory: Path) -> None:
    """Clean 100, 200; corrupt 300; incomplete 400; 500 and 600 after an onset at 500."""
    for step in (100, 200, 500, 600):
        write_checkpoint(directory / f"checkpoint-{step}", step=step)
    write_checkpoint(directory / "checkpoint-300", step=300, corrupt=True)
    write_checkpoint(directory / "checkpoint-400", step=400, weights=False)
    (directory / "runs").mkdir()
    (directory / "runs" / "events.out").write_text("tensorboard")


def content_digests(directory: Path) -> list[str]:
    """Return the sorted digests of every file below ``directory``: moves keep them all."""
    return sorted(
        hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def get_last_checkpoint(folder: Path) -> Path | None:
    """Equivalent of transformers.trainer_utils.get_last_checkpoint."""
    found = [p for p in folder.iterdir() if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)]
    return max(found, key=lambda p: int(p.name.split("-")[1]), default=None)


def test_plan_restores_last_clean_and_quarantines_every_newer(tmp_path: Path) -> None:
    build_run(tmp_path)
    plan = plan_rollback(tmp_path, onset=500)
    assert plan.restore is not None
    assert plan.restore.path == tmp_path / "checkpoint-200"
    assert plan.onset_step == 500
    assert [(c.step, c.status) for c in plan.quarantine] == [
        (300, CheckpointStatus.CORRUPT),
        (400, CheckpointStatus.INCOMPLETE),
        (500, CheckpointStatus.AFTER_ONSET),
        (600, CheckpointStatus.AFTER_ONSET),
    ]


def test_apply_moves_exactly_the_newer_ones_and_deletes_nothing(tmp_path: Path) -> None:
    build_run(tmp_path)
    before = content_digests(tmp_path)
    plan = plan_rollback(tmp_path, onset=500)
    moved = apply_rollback(plan, tmp_path, label=LABEL)

    target = tmp_path / QUARANTINE_DIR / LABEL
    assert moved == [target / f"checkpoint-{s}" for s in (300, 400, 500, 600)]
    assert all(p.is_dir() for p in moved)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-100",
        "checkpoint-200",
        QUARANTINE_DIR,
        "runs",
    ]
    assert content_digests(tmp_path) == before
    assert (target / "checkpoint-600" / "trainer_state.json").read_text() == '{"global_step": 600}'


def test_resume_from_latest_finds_the_clean_one(tmp_path: Path) -> None:
    build_run(tmp_path)
    assert get_last_checkpoint(tmp_path) == tmp_path / "checkpoint-600"
    plan = plan_rollback(tmp_path, onset=500)
    apply_rollback(plan, tmp_path, label=LABEL)
    assert plan.restore is not None
    assert get_last_checkpoint(tmp_path) == plan.restore.path
    assert plan_rollback(tmp_path, onset=None).quarantine == []


def test_dry_run_moves_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    build_run(tmp_path)
    listing = sorted(str(p) for p in tmp_path.rglob("*"))
    plan = plan_rollback(tmp_path, onset=500)
    with caplog.at_level(logging.WARNING, logger="sentinel.checkpoints.rollback"):
        would = apply_rollback(plan, tmp_path, label=LABEL, dry_run=True)
    target = tmp_path / QUARANTINE_DIR / LABEL
    assert would == [target / f"checkpoint-{s}" for s in (300, 400, 500, 600)]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == listing
    assert not (tmp_path / QUARANTINE_DIR).exists()
    assert sum("dry run" in r.getMessage() for r in caplog.records) == 4


def test_name_collision_gets_a_suffix_and_overwrites_nothing(tmp_path: Path) -> None:
    build_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=LABEL)
    # The job resumes from 200, diverges again, writes 300 again.
    write_checkpoint(tmp_path / "checkpoint-300", step=3000)
    before = content_digests(tmp_path)
    plan = plan_rollback(tmp_path, onset=300)
    assert [c.path.name for c in plan.quarantine] == ["checkpoint-300"]
    dry = apply_rollback(plan, tmp_path, label=LABEL, dry_run=True)
    moved = apply_rollback(plan, tmp_path, label=LABEL)
    target = tmp_path / QUARANTINE_DIR / LABEL
    assert dry == moved == [target / "checkpoint-300.1"]
    assert content_digests(tmp_path) == before
    assert (
        (target / "checkpoint-300" / "model.safetensors")
        .read_bytes()
        .endswith(struct.pack("<q", 300))
    )
    assert (
        (target / "checkpoint-300.1" / "model.safetensors")
        .read_bytes()
        .endswith(struct.pack("<q", 3000))
    )


def test_restore_none_when_nothing_is_clean(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "checkpoint-100", step=100, corrupt=True)
    write_checkpoint(tmp_path / "checkpoint-200", step=200)
    (tmp_path / "model-300.pt").write_bytes(b"")
    plan = plan_rollback(tmp_path, onset=200)
    assert plan.restore is None
    assert [c.step for c in plan.quarantine] == [100, 200, 300]
    moved = apply_rollback(plan, tmp_path, label=LABEL)
    assert len(moved) == 3
    assert get_last_checkpoint(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == [QUARANTINE_DIR]


def test_empty_or_missing_directory_plans_nothing(tmp_path: Path) -> None:
    plan = plan_rollback(tmp_path / "missing", onset=10)
    assert (plan.restore, plan.quarantine) == (None, [])
    assert apply_rollback(plan, tmp_path / "missing", label=LABEL) == []
    assert not (tmp_path / "missing").exists()


def test_vanished_checkpoint_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    build_run(tmp_path)
    plan = plan_rollback(tmp_path, onset=500)
    shutil.rmtree(tmp_path / "checkpoint-400")
    with caplog.at_level(logging.WARNING, logger="sentinel.checkpoints.rollback"):
        moved = apply_rollback(plan, tmp_path, label=LABEL)
    assert [p.name for p in moved] == ["checkpoint-300", "checkpoint-500", "checkpoint-600"]
    assert any("vanished" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("20261121T031204-nan_inf", "20261121T031204-nan_inf"),
        ("../../etc", "_.._etc"),
        ("a/b c:d", "a_b_c_d"),
        ("..", "unlabelled"),
        ("", "unlabelled"),
    ],
)
def test_sanitize_label(label: str, expected: str) -> None:
    assert sanitize_label(label) == expected


def test_hostile_label_stays_inside_quarantine(tmp_path: Path) -> None:
    build_run(tmp_path)
    moved = apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label="../../x")
    assert all(p.parent.parent == tmp_path / QUARANTINE_DIR for p in moved)


def test_manifest_records_where_each_item_came_from(tmp_path: Path) -> None:
    build_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=LABEL)
    manifest = json.loads((tmp_path / QUARANTINE_DIR / LABEL / MANIFEST).read_text())
    assert manifest["label"] == LABEL
    assert [(i["name"], i["origin"], i["status"]) for i in manifest["items"]] == [
        (f"checkpoint-{s}", str(tmp_path / f"checkpoint-{s}"), status)
        for s, status in [
            (300, "corrupt"),
            (400, "incomplete"),
            (500, "after_onset"),
            (600, "after_onset"),
        ]
    ]


def kept_run(directory: Path, *, last_step: int = 60) -> Keeper:
    """A job that rewrites ckpt.pt in place at steps 20, 40, 60, watched by a keeper."""
    keeper = Keeper(directory, position_reader=fixture_position, versions=3)
    now = 0.0
    for step in (20, 40, 60):
        if step <= last_step:
            rewrite_in_place(directory / "ckpt.pt", step)
            now = settle(keeper, now)
    keeper.close()
    return keeper


def test_a_kept_version_goes_back_and_the_poisoned_file_is_quarantined(tmp_path: Path) -> None:
    kept_run(tmp_path)  # the NaN came at step 50: the version of step 60 is poisoned
    plan = plan_rollback(tmp_path, onset=50)
    assert plan.restore is not None and plan.put_back is not None
    assert (plan.restore.path, plan.restore.step) == (tmp_path / "ckpt.pt", 40)
    assert [c.path for c in plan.quarantine] == [tmp_path / "ckpt.pt"]

    moved = apply_rollback(plan, tmp_path, label=LABEL)

    assert moved == [tmp_path / QUARANTINE_DIR / LABEL / "ckpt.pt"]
    assert digest(moved[0].read_bytes()) == digest(version_bytes(60))  # set aside, not deleted
    assert digest((tmp_path / "ckpt.pt").read_bytes()) == digest(version_bytes(40))
    assert (tmp_path / "ckpt.pt").stat().st_mtime_ns == mtime_ns(40)
    # A copy, not a link: the resumed job rewrites ckpt.pt in place, the kept one must stay.
    rewrite_in_place(tmp_path / "ckpt.pt", 20)
    assert [v.step for v in kept_versions(tmp_path) if v.intact()] == [20, 40, 60]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_clean_version_in_place_is_resumed_without_a_copy(tmp_path: Path) -> None:
    kept_run(tmp_path, last_step=40)
    plan = plan_rollback(tmp_path, onset=50)
    assert plan.restore is not None
    assert (plan.restore.path, plan.restore.step, plan.put_back) == (tmp_path / "ckpt.pt", 40, None)
    assert plan.quarantine == []


def test_a_kept_version_no_longer_intact_is_not_resumed_from(tmp_path: Path) -> None:
    kept_run(tmp_path)
    forty = next(v for v in kept_versions(tmp_path) if v.step == 40)
    os.utime(forty.path, ns=(1, 1))
    plan = plan_rollback(tmp_path, onset=50)
    assert plan.restore is not None and plan.put_back is not None
    assert plan.restore.step == 20


def test_restore_round_trip_puts_everything_back(tmp_path: Path) -> None:
    build_run(tmp_path)
    listing = sorted(str(p) for p in tmp_path.rglob("*"))
    before = content_digests(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=LABEL)

    moves = restore_quarantine(tmp_path, LABEL[:10])  # a unique prefix will do

    assert [m.destination.name for m in moves] == [f"checkpoint-{s}" for s in (300, 400, 500, 600)]
    assert content_digests(tmp_path) == before
    assert sorted(str(p) for p in tmp_path.rglob("*")) == sorted(
        [*listing, str(tmp_path / QUARANTINE_DIR)]
    )


def test_restore_after_a_put_back_brings_the_newer_file_back(tmp_path: Path) -> None:
    kept_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=50), tmp_path, label=LABEL)
    restore_quarantine(tmp_path, LABEL)
    assert digest((tmp_path / "ckpt.pt").read_bytes()) == digest(version_bytes(60))
    assert [v.step for v in kept_versions(tmp_path) if v.intact()] == [20, 40, 60]
    assert os.listdir(tmp_path / QUARANTINE_DIR) == []


def test_restore_refuses_when_the_job_wrote_over_the_put_back(tmp_path: Path) -> None:
    kept_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=50), tmp_path, label=LABEL)
    rewrite_in_place(tmp_path / "ckpt.pt", 20)  # the resumed job saved again
    with pytest.raises(RestoreRefused, match=r"ckpt\.pt exists"):
        restore_quarantine(tmp_path, LABEL)
    assert (tmp_path / QUARANTINE_DIR / LABEL / "ckpt.pt").is_file()
    assert digest((tmp_path / "ckpt.pt").read_bytes()) == digest(version_bytes(20))


def test_restore_refuses_over_an_existing_destination_and_moves_nothing(tmp_path: Path) -> None:
    build_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=LABEL)
    write_checkpoint(tmp_path / "checkpoint-600", step=6000)  # the resumed job got there again
    quarantined = sorted(os.listdir(tmp_path / QUARANTINE_DIR / LABEL))
    with pytest.raises(RestoreRefused, match="checkpoint-600 exists"):
        restore_quarantine(tmp_path, LABEL)
    assert sorted(os.listdir(tmp_path / QUARANTINE_DIR / LABEL)) == quarantined
    assert not (tmp_path / "checkpoint-300").exists()


@pytest.mark.parametrize(
    ("incident", "message"),
    [("2026", "names 2 quarantines"), ("1999", "no quarantine '1999'"), ("", "no quarantine ''")],
)
def test_restore_needs_one_quarantine(tmp_path: Path, incident: str, message: str) -> None:
    build_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=LABEL)
    (tmp_path / QUARANTINE_DIR / "20261122T000000-stall").mkdir()
    with pytest.raises(RestoreRefused, match=message):
        restore_quarantine(tmp_path, incident)


def test_restore_refuses_a_manifest_pointing_outside(tmp_path: Path) -> None:
    build_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=LABEL)
    manifest_path = tmp_path / QUARANTINE_DIR / LABEL / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["items"][0]["origin"] = str(tmp_path.parent / "elsewhere")
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(RestoreRefused, match="outside"):
        restore_quarantine(tmp_path, LABEL)
    assert not (tmp_path.parent / "elsewhere").exists()


def test_a_kept_version_with_no_step_is_placed_by_its_time(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path, position_reader=lambda path: (None, None))
    now = 0.0
    for step in (20, 40, 60):
        rewrite_in_place(tmp_path / "ckpt.pt", step)
        now = settle(keeper, now)
    keeper.close()
    onset = Onset(step=50, time=mtime_ns(60) / 1e9 - 1)  # the save at 60 came after it
    plan = plan_rollback(tmp_path, onset)
    assert plan.put_back is not None and plan.restore is not None
    assert (plan.put_back.mtime_ns, plan.restore.step) == (mtime_ns(40), None)
    assert plan.restore.placed_by == "kept version 2"
    assert plan_rollback(tmp_path, 50).put_back is None  # no time, no step: nothing placed


def test_two_rollbacks_in_one_second_get_a_folder_and_an_onset_each(tmp_path: Path) -> None:
    build_run(tmp_path)
    first = fresh_label(tmp_path, LABEL)
    apply_rollback(plan_rollback(tmp_path, onset=500), tmp_path, label=first)
    write_checkpoint(tmp_path / "checkpoint-600", step=600)  # the resumed job failed again
    second = fresh_label(tmp_path, LABEL)
    apply_rollback(plan_rollback(tmp_path, onset=550), tmp_path, label=second)
    assert (first, second) == (LABEL, f"{LABEL}-2")
    onsets = [
        json.loads((tmp_path / QUARANTINE_DIR / label / MANIFEST).read_text())["onset"]["step"]
        for label in (first, second)
    ]
    assert onsets == [500, 550]
    in_second = sorted(os.listdir(tmp_path / QUARANTINE_DIR / second))
    assert in_second == sorted(["checkpoint-600", MANIFEST])


@pytest.mark.parametrize(
    ("dir_mode", "folder_mode", "manifest_mode"),
    [(0o750, 0o750, 0o640), (0o700, 0o700, 0o600), (0o2775, 0o2775, 0o644)],
    ids=["group-readable", "private", "shared setgid"],
)
def test_quarantine_folders_and_manifest_take_the_dirs_owner_and_mode(
    tmp_path: Path, dir_mode: int, folder_mode: int, manifest_mode: int
) -> None:
    directory = tmp_path / "run"
    directory.mkdir()
    build_run(directory)
    if os.geteuid() == 0:
        os.chown(directory, 12345, 23456)  # the job's user; sentinel runs as root
    directory.chmod(dir_mode)
    owner = os.stat(directory)

    apply_rollback(plan_rollback(directory, onset=500), directory, label=LABEL)

    made = [directory / QUARANTINE_DIR, directory / QUARANTINE_DIR / LABEL]
    manifest = directory / QUARANTINE_DIR / LABEL / MANIFEST
    for path, mode in [(made[0], folder_mode), (made[1], folder_mode), (manifest, manifest_mode)]:
        stat = os.stat(path)
        assert (oct(stat.st_mode & 0o7777), stat.st_uid) == (oct(mode), owner.st_uid), path
        assert stat.st_gid == owner.st_gid, path


SB3_CHECKPOINTS = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "sb3"


def test_stable_baselines3_checkpoints_are_scanned_and_rolled_back(tmp_path: Path) -> None:
    """SB3's ``CheckpointCallback`` zips (tests/fixtures/checkpoints/make_sb3_checkpoints.py),
    named by the environment steps its tables log: a NaN at 1200 rolls back to the one of
    1024 and sets the one of 1536 aside; a zip named by no step is no checkpoint."""
    for source in SB3_CHECKPOINTS.iterdir():
        shutil.copy2(source, tmp_path / source.name)
    (tmp_path / "dataset.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    found = scan(tmp_path)
    assert [(c.path.name, c.step, c.status) for c in found] == [
        ("rl_model_512_steps.zip", 512, CheckpointStatus.CLEAN),
        ("rl_model_1024_steps.zip", 1024, CheckpointStatus.CLEAN),
        ("rl_model_1536_steps.zip", 1536, CheckpointStatus.CLEAN),
    ]
    plan = plan_rollback(tmp_path, 1200)
    assert plan.restore is not None and plan.restore.path.name == "rl_model_1024_steps.zip"
    assert [c.path.name for c in plan.quarantine] == ["rl_model_1536_steps.zip"]
    apply_rollback(plan, tmp_path, label=LABEL)
    assert (tmp_path / QUARANTINE_DIR / LABEL / "rl_model_1536_steps.zip").is_file()
    assert (tmp_path / "dataset.zip").is_file()


def test_a_truncated_sb3_checkpoint_is_corrupt(tmp_path: Path) -> None:
    data = (SB3_CHECKPOINTS / "rl_model_512_steps.zip").read_bytes()
    (tmp_path / "rl_model_512_steps.zip").write_bytes(data[: len(data) // 2])
    (checkpoint,) = scan(tmp_path)
    assert checkpoint.status is CheckpointStatus.CORRUPT


KERAS_CHECKPOINTS = SB3_CHECKPOINTS.parent / "keras"


@pytest.mark.parametrize(
    ("pattern", "name", "layout", "cut_reason"),
    [
        ("*.keras", "model_0{}.keras", "keras", "torch zip archive unreadable"),
        ("*.weights.h5", "w_0{}.weights.h5", "hdf5", "HDF5 file cut short"),
    ],
)
def test_keras_checkpoints_are_epochs_placed_by_time_and_rolled_back(
    tmp_path: Path, pattern: str, name: str, layout: str, cut_reason: str
) -> None:
    """Keras 3's own checkpoints (tests/fixtures/checkpoints/make_keras_checkpoints.py):
    ``ModelCheckpoint("model_{epoch:02d}.keras")`` and, with ``save_weights_only=True``,
    ``w_{epoch:02d}.weights.h5`` (HDF5, as ``BackupAndRestore`` writes). Their number is
    Keras's epoch, never a step; a rollback places them by time (real runs gave up with "no
    checkpoint at all" beside six and eight of them, the last holding the NaN). One cut
    short is corrupt (an HDF5 file's superblock says where it ends)."""
    for epoch, source in enumerate(sorted(KERAS_CHECKPOINTS.glob(pattern)), start=1):
        shutil.copy2(source, tmp_path / source.name)
        os.utime(tmp_path / source.name, (1_700_000_000 + 100 * epoch,) * 2)
    found = scan(tmp_path)
    assert [(c.path.name, c.step, c.epoch, c.status, c.layout) for c in found] == [
        (name.format(e), None, e, CheckpointStatus.CLEAN, layout) for e in (1, 2, 3)
    ]
    plan = plan_rollback(tmp_path, Onset(step=70, time=1_700_000_250))
    assert plan.restore is not None and plan.restore.path.name == name.format(2)
    assert [c.path.name for c in plan.quarantine] == [name.format(3)]
    data = (KERAS_CHECKPOINTS / name.format(1)).read_bytes()
    (tmp_path / name.format(1)).write_bytes(data[: len(data) // 2])
    cut = {c.path.name: c for c in scan(tmp_path)}[name.format(1)]
    assert cut.status is CheckpointStatus.CORRUPT and cut_reason in cut.reason, cut.reason


def test_the_name_the_job_resumes_from_gets_its_clean_version_beside_a_best_copy(
    tmp_path: Path,
) -> None:
    """The PyTorch ImageNet example: each epoch ``checkpoint.pth.tar`` is saved in place and,
    when best, copied to ``model_best.pth.tar``; the job resumes from checkpoint.pth.tar.
    The save after the fault is set aside and its clean version goes back: the copy of the
    same epoch, a few milliseconds newer, had been resumed instead, and the job, finding
    no checkpoint.pth.tar, trained from scratch. The copy stays where it is."""
    torch = pytest.importorskip("torch")
    resume, best = tmp_path / "checkpoint.pth.tar", tmp_path / "model_best.pth.tar"
    keeper = Keeper(tmp_path)
    t0 = 1_700_000_000
    torch.save({"epoch": 3, "state_dict": {"w": torch.ones(2)}}, resume)
    os.utime(resume, (t0, t0))
    shutil.copyfile(resume, best)
    os.utime(best, (t0 + 0.005, t0 + 0.005))
    now = settle(keeper, 0.0)
    torch.save({"epoch": 4, "state_dict": {"w": torch.full((2,), float("nan"))}}, resume)
    os.utime(resume, (t0 + 30, t0 + 30))  # the epoch's end, after its NaN
    settle(keeper, now)
    keeper.close()
    plan = plan_rollback(tmp_path, Onset(step=155, epoch=4, time=t0 + 20))
    assert plan.restore is not None and plan.put_back is not None
    assert plan.restore.path == resume
    assert [c.path for c in plan.quarantine] == [resume]
    apply_rollback(plan, tmp_path, label=LABEL)
    assert torch.load(resume)["epoch"] == 3
    assert best.exists()
