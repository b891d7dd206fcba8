"""Tests for rollback planning and quarantine, over real checkpoint folders in tmp_path."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
from pathlib import Path

import pytest

from sentinel.actions.rollback import apply_rollback, plan_rollback, sanitize_label
from sentinel.sources.checkpoints import QUARANTINE_DIR, CheckpointStatus

LABEL = "20261121T031204-nan_inf"


def write_checkpoint(path: Path, *, step: int, state: bool = True, corrupt: bool = False) -> None:
    """Write an HF Trainer checkpoint dir whose files carry the step in their content."""
    path.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    length = 999 if corrupt else len(header)
    data = struct.pack("<Q", length) + header + struct.pack("<q", step)
    (path / "model.safetensors").write_bytes(data)
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def build_run(directory: Path) -> None:
    """Clean 100, 200; corrupt 300; incomplete 400; 500 and 600 after an onset at 500."""
    for step in (100, 200, 500, 600):
        write_checkpoint(directory / f"checkpoint-{step}", step=step)
    write_checkpoint(directory / "checkpoint-300", step=300, corrupt=True)
    write_checkpoint(directory / "checkpoint-400", step=400, state=False)
    (directory / "runs").mkdir()
    (directory / "runs" / "events.out").write_text("tensorboard")


def content_digests(directory: Path) -> list[str]:
    """Return the sorted digests of every file below ``directory``: moves keep them all."""
    return sorted(
        hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.rglob("*") if p.is_file()
    )


def get_last_checkpoint(folder: Path) -> Path | None:
    """Equivalent of transformers.trainer_utils.get_last_checkpoint."""
    found = [p for p in folder.iterdir() if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)]
    return max(found, key=lambda p: int(p.name.split("-")[1]), default=None)


def test_plan_restores_last_clean_and_quarantines_every_newer(tmp_path: Path) -> None:
    build_run(tmp_path)
    plan = plan_rollback(tmp_path, onset_step=500)
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
    plan = plan_rollback(tmp_path, onset_step=500)
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
    plan = plan_rollback(tmp_path, onset_step=500)
    apply_rollback(plan, tmp_path, label=LABEL)
    assert plan.restore is not None
    assert get_last_checkpoint(tmp_path) == plan.restore.path
    assert plan_rollback(tmp_path, onset_step=None).quarantine == []


def test_dry_run_moves_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    build_run(tmp_path)
    listing = sorted(str(p) for p in tmp_path.rglob("*"))
    plan = plan_rollback(tmp_path, onset_step=500)
    with caplog.at_level(logging.WARNING, logger="sentinel.actions.rollback"):
        would = apply_rollback(plan, tmp_path, label=LABEL, dry_run=True)
    target = tmp_path / QUARANTINE_DIR / LABEL
    assert would == [target / f"checkpoint-{s}" for s in (300, 400, 500, 600)]
    assert sorted(str(p) for p in tmp_path.rglob("*")) == listing
    assert not (tmp_path / QUARANTINE_DIR).exists()
    assert sum("dry run" in r.getMessage() for r in caplog.records) == 4


def test_name_collision_gets_a_suffix_and_overwrites_nothing(tmp_path: Path) -> None:
    build_run(tmp_path)
    apply_rollback(plan_rollback(tmp_path, onset_step=500), tmp_path, label=LABEL)
    # The job resumes from 200, diverges again, writes 300 again.
    write_checkpoint(tmp_path / "checkpoint-300", step=3000)
    before = content_digests(tmp_path)
    plan = plan_rollback(tmp_path, onset_step=300)
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
    plan = plan_rollback(tmp_path, onset_step=200)
    assert plan.restore is None
    assert [c.step for c in plan.quarantine] == [100, 200, 300]
    moved = apply_rollback(plan, tmp_path, label=LABEL)
    assert len(moved) == 3
    assert get_last_checkpoint(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == [QUARANTINE_DIR]


def test_empty_or_missing_directory_plans_nothing(tmp_path: Path) -> None:
    plan = plan_rollback(tmp_path / "missing", onset_step=10)
    assert (plan.restore, plan.quarantine) == (None, [])
    assert apply_rollback(plan, tmp_path / "missing", label=LABEL) == []
    assert not (tmp_path / "missing").exists()


def test_vanished_checkpoint_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    build_run(tmp_path)
    plan = plan_rollback(tmp_path, onset_step=500)
    (tmp_path / "checkpoint-400" / "model.safetensors").unlink()
    (tmp_path / "checkpoint-400").rmdir()
    with caplog.at_level(logging.WARNING, logger="sentinel.actions.rollback"):
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
    moved = apply_rollback(plan_rollback(tmp_path, onset_step=500), tmp_path, label="../../x")
    assert all(p.parent.parent == tmp_path / QUARANTINE_DIR for p in moved)
