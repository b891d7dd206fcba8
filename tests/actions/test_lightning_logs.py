"""``--checkpoints lightning_logs``: Lightning's default layout is one pool of checkpoints.

Each start of a Lightning job writes to a new ``lightning_logs/version_<N>/checkpoints/``,
and ``ModelCheckpoint`` at its defaults keeps one checkpoint there (the last epoch's), so
after a restart the last clean checkpoint is in an older version's folder than the newest.
The checkpoints are copies of a real Lightning checkpoint (``tests/fixtures/checkpoints``),
placed in training by their names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.checkpoints.pointer_find import Form, find_pointers
from sentinel.checkpoints.restore import restore_quarantine
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback
from sentinel.checkpoints.scan import (
    QUARANTINE_DIR,
    CheckpointStatus,
    Onset,
    checkpoint_folders,
    last_clean,
    scan,
)
from tests.helpers.env import clean_env

LIGHTNING_CKPT = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "lightning"
LABEL = "20261128T030000-nan_inf"
T0 = 1_700_000_000.0
ONSET = Onset(step=130)


def save(logs: Path, version: int, step: int) -> Path:
    """``ModelCheckpoint``'s save at ``step`` (50 steps an epoch) in ``version_<version>``."""
    folder = logs / f"version_{version}" / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch={step // 50 - 1}-step={step}.ckpt"
    path.write_bytes((LIGHTNING_CKPT / "last.ckpt").read_bytes())
    os.utime(path, (T0 + step, T0 + step))
    return path


def link_last(checkpoint: Path) -> Path:
    """``save_last="link"``: ``last.ckpt`` beside it, a relative link to it."""
    link = checkpoint.parent / "last.ckpt"
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(checkpoint.name, link)
    return link


def restarted_run(logs: Path) -> tuple[Path, Path]:
    """The first start saved step 100 (clean) and was rolled back before its NaN at 120;
    the second, resumed from it, saved step 150 after a NaN from step 130. Each start also
    wrote its event file and hparams.yaml beside its checkpoints."""
    clean = save(logs, 0, 100)
    poisoned = save(logs, 1, 150)
    link_last(poisoned)
    for version in (0, 1):
        (logs / f"version_{version}" / "events.out.tfevents.1.host.1.0").write_bytes(b"")
        (logs / f"version_{version}" / "hparams.yaml").write_text("{}\n")
    return clean, poisoned


def test_the_folders_are_lightning_logs_and_each_versions_checkpoints(tmp_path: Path) -> None:
    for version in (10, 2, 0):
        (tmp_path / f"version_{version}" / "checkpoints").mkdir(parents=True)
    (tmp_path / "version_3").mkdir()  # logged, never checkpointed
    (tmp_path / "version_x" / "checkpoints").mkdir(parents=True)  # not Lightning's name
    (tmp_path / "elsewhere" / "checkpoints").mkdir(parents=True)
    (tmp_path / "version_4").symlink_to(tmp_path / "elsewhere")  # may lead out of the dir
    assert checkpoint_folders(tmp_path) == [
        tmp_path,
        tmp_path / "version_0" / "checkpoints",
        tmp_path / "version_2" / "checkpoints",
        tmp_path / "version_10" / "checkpoints",
    ]
    assert checkpoint_folders(tmp_path / "version_0" / "checkpoints") == [
        tmp_path / "version_0" / "checkpoints"
    ]
    assert checkpoint_folders(tmp_path / "missing") == [tmp_path / "missing"]


def test_every_versions_checkpoints_are_scanned_in_step_order(tmp_path: Path) -> None:
    clean, poisoned = restarted_run(tmp_path)
    older = save(tmp_path, 0, 50)
    found = scan(tmp_path, onset=ONSET)
    assert [(c.path, c.step, c.status) for c in found] == [
        (older, 50, CheckpointStatus.CLEAN),
        (clean, 100, CheckpointStatus.CLEAN),
        (poisoned, 150, CheckpointStatus.AFTER_ONSET),
    ]
    assert last_clean(found, ONSET) == found[1]


def test_after_a_restart_the_clean_checkpoint_in_the_older_version_is_resumed(
    tmp_path: Path,
) -> None:
    clean, poisoned = restarted_run(tmp_path)
    plan = plan_rollback(tmp_path, ONSET)
    assert plan.restore is not None and plan.restore.path == clean
    assert [c.path for c in plan.quarantine] == [poisoned]

    moved = apply_rollback(plan, tmp_path, label=LABEL)

    folder = tmp_path / QUARANTINE_DIR / LABEL
    assert moved == [folder / poisoned.name]
    assert not os.path.lexists(poisoned) and clean.exists()
    manifest = json.loads((folder / ".sentinel-manifest.json").read_text())
    assert [(item["name"], item["origin"]) for item in manifest["items"]] == [
        (poisoned.name, str(poisoned))
    ]
    # The second start's last.ckpt names the clean checkpoint, in the first start's folder.
    last = poisoned.parent / "last.ckpt"
    assert os.readlink(last) == "../../version_0/checkpoints/epoch=1-step=100.ckpt"
    assert os.path.realpath(last) == str(clean)
    assert [c.path for c in scan(tmp_path)] == [clean]


def test_restore_puts_each_back_in_its_version_and_the_link_as_it_was(tmp_path: Path) -> None:
    clean, poisoned = restarted_run(tmp_path)
    again = save(tmp_path, 2, 150)  # a third start, resumed from step 100 too, saved 150 again
    plan = plan_rollback(tmp_path, ONSET)
    assert [c.path for c in plan.quarantine] == [poisoned, again]

    moved = apply_rollback(plan, tmp_path, label=LABEL)
    assert sorted(path.name for path in moved) == [again.name, f"{again.name}.1"]

    restored = restore_quarantine(tmp_path, LABEL)

    assert sorted(move.destination for move in restored) == sorted([poisoned, again])
    assert poisoned.is_file() and again.is_file() and clean.is_file()
    assert os.readlink(poisoned.parent / "last.ckpt") == poisoned.name
    assert not (tmp_path / QUARANTINE_DIR / LABEL).exists()


def test_each_versions_last_ckpt_is_a_pointer(tmp_path: Path) -> None:
    clean, poisoned = restarted_run(tmp_path)
    link_last(clean)
    pointers = find_pointers(tmp_path)
    assert [(p.path, p.form, p.target) for p in pointers] == [
        (clean.parent / "last.ckpt", Form.SYMLINK, clean),
        (poisoned.parent / "last.ckpt", Form.SYMLINK, poisoned),
    ]
    assert pointers[1].describe(tmp_path) == (
        "lightning last: version_1/checkpoints/last.ckpt -> version_1/checkpoints/"
        "epoch=2-step=150.ckpt"
    )


@pytest.mark.slow  # a real `python -m sentinel`
def test_sentinel_checkpoints_lists_the_pool_by_path(tmp_path: Path) -> None:
    restarted_run(tmp_path)
    listing = subprocess.run(
        [sys.executable, "-m", "sentinel", "checkpoints", str(tmp_path)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=True,
    ).stdout.splitlines()
    rows = [line.split(None, 4) for line in listing[1:]]
    assert [row[:4] for row in rows] == [
        ["100", "clean", "version_0/checkpoints/epoch=1-step=100.ckpt", "lightning"],
        ["150", "clean", "version_1/checkpoints/epoch=2-step=150.ckpt", "lightning"],
        ["pointer", "lightning", "last:", "version_1/checkpoints/last.ckpt"],
    ]
    assert rows[1][4] == "<- last clean: a rollback resumes here"
