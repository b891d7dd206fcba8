"""``sentinel checkpoints --restore INCIDENT DIR``: a rollback undone from the command line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sentinel.checkpoints.keep import Keeper
from sentinel.checkpoints.quarantine import MANIFEST
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback
from tests.helpers.cli import sentinel_here
from tests.helpers.env import clean_env
from tests.helpers.kept import digest, rewrite_in_place, settle, version_bytes

LABEL = "20261121T140600-loss_spike"


def sentinel(*args: str) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS`` by ``main`` in this process (``tests.helpers.cli``)."""
    return sentinel_here(*args, env=clean_env())


def rolled_back(directory: Path) -> None:
    """nanoGPT's ckpt.pt saved at 20, 40, 60, NaN at 50: rolled back to the kept 40."""
    keeper = Keeper(directory)
    now = 0.0
    for step in (20, 40, 60):
        rewrite_in_place(directory / "ckpt.pt", step)
        now = settle(keeper, now)
    keeper.close()
    apply_rollback(plan_rollback(directory, 50), directory, label=LABEL)
    assert digest((directory / "ckpt.pt").read_bytes()) == digest(version_bytes(40))


@pytest.mark.slow
def test_restore_by_prefix_puts_the_poisoned_file_back(tmp_path: Path) -> None:
    rolled_back(tmp_path)
    result = sentinel("checkpoints", "--restore", "20261121T14", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"restored {tmp_path / 'ckpt.pt'}" in result.stdout
    assert digest((tmp_path / "ckpt.pt").read_bytes()) == digest(version_bytes(60))
    assert os.listdir(tmp_path / "quarantine") == []


@pytest.mark.slow
def test_restore_over_a_taken_place_exits_2_with_one_line(tmp_path: Path) -> None:
    rolled_back(tmp_path)
    rewrite_in_place(tmp_path / "ckpt.pt", 20)  # the resumed job saved again
    result = sentinel("checkpoints", "--restore", LABEL, str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "ckpt.pt exists; not overwriting it, nothing moved" in result.stderr
    assert (tmp_path / "quarantine" / LABEL / "ckpt.pt").is_file()
    assert digest((tmp_path / "ckpt.pt").read_bytes()) == digest(version_bytes(20))


@pytest.mark.slow
def test_restore_refuses_a_manifest_that_points_through_a_link_naming_it(tmp_path: Path) -> None:
    """``ck/lnk -> ../elsewhere``: an origin under ``lnk`` is inside ck by its name only."""
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    ck.mkdir()
    elsewhere.mkdir()
    rolled_back(ck)
    (ck / "lnk").symlink_to("../elsewhere")
    manifest_path = ck / "quarantine" / LABEL / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["items"][0]["origin"] = str(ck / "lnk" / "planted.pt")
    manifest_path.write_text(json.dumps(manifest))
    result = sentinel("checkpoints", "--restore", LABEL, str(ck))
    assert result.returncode == 2, result.stdout
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"through the symbolic link {ck / 'lnk'}" in result.stderr
    assert os.listdir(elsewhere) == []
    assert (ck / "quarantine" / LABEL / "ckpt.pt").is_file(), "nothing moved"


@pytest.mark.slow
def test_restore_refuses_a_quarantine_folder_that_is_a_link(tmp_path: Path) -> None:
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere" / "20261121T140600-nan_inf"
    ck.mkdir()
    elsewhere.mkdir(parents=True)
    (elsewhere / "ckpt.pt").write_bytes(b"not ours")
    (ck / "quarantine").symlink_to(tmp_path / "elsewhere")
    result = sentinel("checkpoints", "--restore", "20261121T14", str(ck))
    assert result.returncode == 2
    assert "is a symbolic link" in result.stderr
    assert not (ck / "ckpt.pt").exists()


@pytest.mark.slow
def test_restore_refuses_a_manifest_whose_origin_climbs_out_with_dots(tmp_path: Path) -> None:
    """``ck/../elsewhere/planted.pt`` begins with ``ck`` by its name, and leads out of it."""
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    ck.mkdir()
    elsewhere.mkdir()
    rolled_back(ck)
    manifest_path = ck / "quarantine" / LABEL / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["items"][0]["origin"] = f"{ck}/../elsewhere/planted.pt"
    manifest_path.write_text(json.dumps(manifest))
    result = sentinel("checkpoints", "--restore", LABEL, str(ck))
    assert result.returncode == 2, result.stdout
    assert "came from outside" in result.stderr
    assert os.listdir(elsewhere) == []
    assert (ck / "quarantine" / LABEL / "ckpt.pt").is_file(), "nothing moved"
