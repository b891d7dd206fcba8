"""The keeper and rollback for a job that deletes its older checkpoints as it saves.

The job is a real child process (tests/helpers/rotating_job.py) that ``torch.save``s each
checkpoint and deletes the one before, as Lightning's ``save_top_k=1`` and HF's
``save_total_limit=1`` do; the keeper in this process looks between its saves. One child
serves the module's tests, each in its own folder: torch is imported once.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sentinel.checkpoints.disk import disk_use
from sentinel.checkpoints.keep import KEPT_DIR, SIDECAR, Keeper, KeptVersion, kept_versions
from sentinel.checkpoints.pointer_find import PointerKind, find_pointers
from sentinel.checkpoints.quarantine import MANIFEST
from sentinel.checkpoints.restore import restore_quarantine
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback
from sentinel.checkpoints.scan import QUARANTINE_DIR, Onset
from tests.helpers.cli import sentinel_here
from tests.helpers.env import clean_env
from tests.helpers.kept import settle, version_bytes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
]

TESTS = Path(__file__).parent.parent
JOB = TESTS / "helpers" / "rotating_job.py"
DEEPSPEED = TESTS / "fixtures" / "checkpoints" / "deepspeed" / "global_step40"
LABEL = "20261121T031204-nan_inf"


class RotatingJob:
    """The child job: ``save(step)`` returns once it saved and deleted the one before."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(JOB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def tell(self, command: str) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == command, "the job answered"

    def save(self, step: int) -> None:
        self.tell(f"save {step}")

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        code = self.process.wait(timeout=30)
        self.process.stdout.close()
        assert code == 0


@pytest.fixture(scope="module")
def rotating_job() -> Iterator[RotatingJob]:
    job = RotatingJob()
    yield job
    job.close()


@pytest.fixture
def start_job(tmp_path: Path, rotating_job: RotatingJob) -> Callable[[str], RotatingJob]:
    """Start a run of the job in ``tmp_path``, saving as ``layout`` says."""

    def start(layout: str) -> RotatingJob:
        rotating_job.tell(f"use {tmp_path} {layout}")
        return rotating_job

    return start


def run(job: RotatingJob, keeper: Keeper, steps: tuple[int, ...]) -> None:
    """The job saves at each of ``steps``; the keeper looks in between, long enough to keep."""
    now = 0.0
    for step in steps:
        job.save(step)
        now = settle(keeper, now)


def stepped(directory: Path) -> list[KeptVersion]:
    return [v for v in kept_versions(directory) if v.stepped]


def torch_value(path: Path, key: str) -> int:
    import torch

    return int(torch.load(path, weights_only=True)[key])


def test_the_last_two_checkpoints_are_kept_by_link_and_survive_the_jobs_deletion(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    keeper = Keeper(tmp_path)
    run(start_job("files"), keeper, (10, 20, 30))
    keeper.close()

    assert sorted(p.name for p in tmp_path.iterdir() if p.name != KEPT_DIR) == ["model_step30.pt"]
    v20, v30 = stepped(tmp_path)
    assert [(v.step, v.method) for v in (v20, v30)] == [(20, "link"), (30, "link")]
    assert torch_value(v20.path, "step") == 20
    assert v20.path.stat().st_nlink == 1, "the job's name for it is gone: only sentinel's holds it"
    assert v30.path.stat().st_ino == (tmp_path / "model_step30.pt").stat().st_ino
    assert v20.original == tmp_path / "model_step20.pt"
    assert v20.intact() and v30.intact()
    assert sorted(os.listdir(tmp_path / KEPT_DIR)) == ["model_step20.pt", "model_step30.pt"]


def test_rollback_puts_the_deleted_clean_checkpoint_back_where_the_job_wrote_it(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    keeper = Keeper(tmp_path)
    # The NaN came at step 25: the save at 30 (which deleted 20) is poisoned, and was kept
    # before anyone knew, so one kept version would not have been enough.
    run(start_job("files"), keeper, (10, 20, 30))
    keeper.close()

    plan = plan_rollback(tmp_path, 25)
    assert plan.restore is not None and plan.put_back is not None
    assert (plan.restore.path, plan.restore.step) == (tmp_path / "model_step20.pt", 20)
    assert [c.path for c in plan.quarantine] == [tmp_path / "model_step30.pt"]

    moved = apply_rollback(plan, tmp_path, label=LABEL)

    assert moved == [tmp_path / QUARANTINE_DIR / LABEL / "model_step30.pt"]
    assert torch_value(moved[0], "step") == 30  # set aside, not deleted
    restored = tmp_path / "model_step20.pt"
    assert torch_value(restored, "step") == 20
    assert restored.stat().st_ino != plan.put_back.path.stat().st_ino, "a copy, not a link"
    assert [v.step for v in stepped(tmp_path) if v.intact()] == [20, 30]
    manifest = json.loads((tmp_path / QUARANTINE_DIR / LABEL / MANIFEST).read_text())
    assert manifest["complete"] is True
    assert [r["path"] for r in manifest["put_back"]] == [str(restored)]
    assert manifest["put_back"][0]["kept"] == str(plan.put_back.path)
    assert [(i["name"], i["moved"]) for i in manifest["items"]] == [("model_step30.pt", True)]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    # A false alarm undone: the poisoned one back in place, the put-back copy stays beside it.
    restore_quarantine(tmp_path, LABEL)
    assert torch_value(tmp_path / "model_step30.pt", "step") == 30
    assert torch_value(restored, "step") == 20


def test_a_deleted_checkpoint_folder_is_kept_file_by_file_and_goes_back_whole(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    keeper = Keeper(tmp_path)
    run(start_job("folders"), keeper, (10, 20, 30))
    keeper.close()
    v20, v30 = stepped(tmp_path)
    assert (v20.path.name, v20.method, v20.step) == ("checkpoint-20", "link", 20)
    assert {f.name: f.stat().st_nlink for f in v20.path.iterdir()} == {
        "model.pt": 1,
        "optimizer.pt": 1,
    }
    in_place = tmp_path / "checkpoint-30" / "model.pt"
    assert (v30.path / "model.pt").stat().st_ino == in_place.stat().st_ino

    plan = plan_rollback(tmp_path, 25)
    assert plan.restore is not None and plan.restore.path == tmp_path / "checkpoint-20"
    apply_rollback(plan, tmp_path, label=LABEL)

    assert sorted(os.listdir(tmp_path / "checkpoint-20")) == ["model.pt", "optimizer.pt"]
    assert torch_value(tmp_path / "checkpoint-20" / "model.pt", "step") == 20
    assert torch_value(tmp_path / "checkpoint-20" / "optimizer.pt", "step") == 20
    assert (tmp_path / QUARANTINE_DIR / LABEL / "checkpoint-30" / "model.pt").is_file()
    # HF's resume_from_checkpoint=True takes the highest checkpoint-N: the clean one now.
    hf = [p for p in find_pointers(tmp_path) if p.kind is PointerKind.HF_LAST]
    assert [p.path.name for p in hf] == ["checkpoint-20"]
    assert v20.intact(), "the kept copy stays kept"


def test_a_job_saving_fast_after_a_warning_keeps_the_checkpoint_from_before_it(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    """The warning opens at step 25; the job saves three times more before the stop (a job
    that saves every few seconds). The last two kept (40, 50) are both after the onset: the
    checkpoint of step 20 is kept beside them, and the rollback puts it back."""
    keeper = Keeper(tmp_path)
    job = start_job("folders")
    run(job, keeper, (10, 20))
    keeper.keep_before(Onset(step=25, time=time.time()))
    run(job, keeper, (30, 40, 50))
    keeper.close()
    assert [v.step for v in stepped(tmp_path)] == [20, 40, 50]

    plan = plan_rollback(tmp_path, 25)
    assert plan.restore is not None and plan.restore.path == tmp_path / "checkpoint-20"
    apply_rollback(plan, tmp_path, label=LABEL)
    assert torch_value(tmp_path / "checkpoint-20" / "model.pt", "step") == 20


@pytest.mark.parametrize("layout", ["lightning", "lightning-link"])
def test_a_lightning_job_with_save_top_k_1_gets_its_checkpoint_and_last_ckpt_back(
    tmp_path: Path,
    start_job: Callable[[str], RotatingJob],
    layout: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keeper = Keeper(tmp_path)
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        run(start_job(layout), keeper, (10, 20, 30))
    keeper.close()
    assert "could not keep" not in caplog.text
    if layout == "lightning-link":  # a pointer: its target is kept as itself
        assert kept_versions(tmp_path, "last.ckpt") == []

    plan = plan_rollback(tmp_path, 25)
    clean = tmp_path / "epoch=0-step=20.ckpt"
    assert plan.restore is not None and plan.restore.path == clean, "the name it wrote"
    apply_rollback(plan, tmp_path, label=LABEL)

    assert torch_value(clean, "global_step") == 20
    last = tmp_path / "last.ckpt"
    manifest = json.loads((tmp_path / QUARANTINE_DIR / LABEL / MANIFEST).read_text())
    assert [p["after"] for p in manifest["pointers"]] == ["epoch=0-step=20.ckpt"]
    if layout == "lightning-link":
        assert os.readlink(last) == "epoch=0-step=20.ckpt"
    else:
        assert not last.is_symlink() and torch_value(last, "global_step") == 20
        aside = tmp_path / QUARANTINE_DIR / LABEL / "last.ckpt"
        assert torch_value(aside, "global_step") == 30, "the poisoned copy set aside"
    assert sorted(p.name for p in (tmp_path / QUARANTINE_DIR / LABEL).iterdir()) == sorted(
        ["epoch=0-step=30.ckpt", MANIFEST, *(["last.ckpt"] if layout == "lightning" else [])]
    )


def test_deepspeeds_latest_names_the_folder_put_back(tmp_path: Path) -> None:
    """The test is the job here: it copies a real DeepSpeed folder as each save and moves
    ``latest`` on, then deletes the folder before."""
    keeper = Keeper(tmp_path)
    now = 0.0
    for step in (10, 20, 30):
        shutil.copytree(DEEPSPEED, tmp_path / f"global_step{step}", copy_function=shutil.copyfile)
        (tmp_path / "latest").write_text(f"global_step{step}")
        if step > 10:
            shutil.rmtree(tmp_path / f"global_step{step - 10}")
        now = settle(keeper, now)
    keeper.close()

    plan = plan_rollback(tmp_path, 25)
    assert plan.restore is not None and plan.restore.path == tmp_path / "global_step20"
    apply_rollback(plan, tmp_path, label=LABEL)

    assert (tmp_path / "latest").read_text() == "global_step20"
    assert sorted(os.listdir(tmp_path / "global_step20")) == sorted(os.listdir(DEEPSPEED))
    assert (tmp_path / QUARANTINE_DIR / LABEL / "global_step30").is_dir()


def test_what_a_job_that_deletes_its_checkpoints_means_is_said_once(
    tmp_path: Path, start_job: Callable[[str], RotatingJob], caplog: pytest.LogCaptureFixture
) -> None:
    keeper = Keeper(tmp_path)
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        run(start_job("files"), keeper, (10, 20, 30, 40))
    keeper.close()
    said = [r for r in caplog.records if "deletes its older checkpoints" in r.getMessage()]
    assert len(said) == 1
    message = said[0].getMessage()
    assert "model_step10.pt went once model_step20.pt was written" in message
    assert "only its newest checkpoint" in message
    assert "keeps the last 2 clean ones" in message and said[0].levelno == logging.INFO


def test_a_job_that_keeps_all_its_checkpoints_is_not_said_to_delete_them(
    tmp_path: Path, start_job: Callable[[str], RotatingJob], caplog: pytest.LogCaptureFixture
) -> None:
    keeper = Keeper(tmp_path)
    job = start_job("files")
    job.tell("keep 0")
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        run(job, keeper, (10, 20, 30))
    keeper.close()
    assert "deletes its older checkpoints" not in caplog.text
    assert [v.step for v in stepped(tmp_path)] == [20, 30]
    assert disk_use(tmp_path).kept_bytes == sidecar_bytes(tmp_path), "links cost nothing"


def test_checkpoints_over_the_budget_are_not_kept_and_it_is_said_once(
    tmp_path: Path, start_job: Callable[[str], RotatingJob], caplog: pytest.LogCaptureFixture
) -> None:
    keeper = Keeper(tmp_path, max_bytes=100)
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        run(start_job("files"), keeper, (10, 20, 30))
    keeper.close()
    assert kept_versions(tmp_path) == []
    over = [r for r in caplog.records if "over [keep] max_bytes" in r.getMessage()]
    assert [r.levelno for r in over] == [logging.WARNING, logging.WARNING]
    assert "not keeping" in over[0].getMessage() and "model_step10.pt" in over[0].getMessage()
    assert "keeps none" in over[1].getMessage(), "the rotation, said with what it costs"
    assert plan_rollback(tmp_path, 25).restore is None


def sidecar_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in (directory / KEPT_DIR).rglob(SIDECAR))


def test_disk_use_counts_a_kept_checkpoint_once_the_job_deleted_it(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    keeper = Keeper(tmp_path)
    run(start_job("folders"), keeper, (10, 20, 30))
    keeper.close()
    v20, _v30 = stepped(tmp_path)
    # checkpoint-30 is still the job's: its links cost nothing; checkpoint-20 is only ours.
    assert disk_use(tmp_path).kept_bytes == v20.size + sidecar_bytes(tmp_path)
    assert v20.size == sum(f.stat().st_size for f in v20.path.iterdir())


def test_of_the_checkpoints_there_before_sentinel_only_the_newest_are_kept(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    job = start_job("files")
    job.tell("keep 0")
    for step in (10, 20, 30, 40):
        job.save(step)
    keeper = Keeper(tmp_path)
    settle(keeper, 0.0)
    keeper.close()
    assert [v.step for v in stepped(tmp_path)] == [30, 40]


@pytest.mark.parametrize("layout", ["files", "folders"])
def test_a_checkpoint_the_job_deletes_before_it_settled_is_kept_from_the_links_of_its_look(
    tmp_path: Path,
    start_job: Callable[[str], RotatingJob],
    layout: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job that saves more often than a version settles (a small model's Trainer with
    ``save_total_limit=1``): each checkpoint is gone before a second look."""
    keeper = Keeper(tmp_path)
    job = start_job(layout)
    job.save(10)
    keeper.poll(0.0)  # the one look that finds step 10
    job.save(20)  # 10 is deleted before another look
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        settle(keeper, 10.0)
    keeper.close()
    kept = {v.step: v for v in stepped(tmp_path)}
    assert sorted(kept) == [10, 20]
    assert not (tmp_path / kept[10].original.name).exists(), "the job deleted its own"
    weights = kept[10].path if layout == "files" else kept[10].path / "model.pt"
    assert torch_value(weights, "step") == 10
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_rollback_right_after_the_jobs_last_save_finds_the_one_it_deleted(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    """The job saved and deleted after the keeper's last look, then failed: the rollback's
    flush hands the staged checkpoint over without waiting for a look."""
    keeper = Keeper(tmp_path)
    job = start_job("files")
    job.save(10)
    keeper.poll(0.0)
    job.save(20)
    assert keeper.flush(timeout_s=10)
    assert [v.step for v in stepped(tmp_path)] == [10]
    keeper.close()


def test_what_a_rollback_set_aside_is_not_kept_so_a_rollback_further_back_finds_its_copy(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    """The NaN came at step 25 and the job saved 30 (deleting 20) before the stop: the
    rollback puts 20 back and sets 30 aside. The look that linked 30 must not keep it once
    it is gone from its place (as if the job had deleted it), nor may its version kept
    before the stop count among the last two: the restart from 20 failed before it passed
    step 25, and the rollback further back needs the copy of 10."""
    keeper = Keeper(tmp_path)
    job = start_job("files")
    run(job, keeper, (10, 20))
    job.save(30)
    keeper.poll(100.0)  # the one look that finds 30, before the stop: its files linked
    assert keeper.flush(timeout_s=10)

    plan = plan_rollback(tmp_path, 25)
    assert plan.restore is not None and plan.restore.step == 20
    apply_rollback(plan, tmp_path, label=LABEL)
    keeper.set_aside([c.path.name for c in plan.quarantine], timeout_s=10)
    settle(keeper, 200.0)  # the looks after the rollback: 30 is gone from its place
    assert sorted(v.step for v in stepped(tmp_path)) == [10, 20]

    further = plan_rollback(tmp_path, 20)
    assert further.restore is not None and further.restore.step == 10
    keeper.close()


def test_a_checkpoint_that_grows_over_the_budget_drops_the_links_of_its_first_look(
    tmp_path: Path,
) -> None:
    keeper = Keeper(tmp_path, max_bytes=len(version_bytes(20)) + 10)
    path = tmp_path / "model_step10.pt"
    path.write_bytes(version_bytes(20)[:-100])  # under the budget at the first look
    keeper.poll(0.0)
    assert (tmp_path / KEPT_DIR / path.name).is_dir(), "its files linked"
    path.write_bytes(version_bytes(20) * 2)  # the save goes on, past it
    keeper.poll(1.0)
    os.unlink(path)
    settle(keeper, 10.0)
    keeper.close()
    assert kept_versions(tmp_path) == []
    assert not (tmp_path / KEPT_DIR / path.name).exists(), "no link left holding its disk"


def test_a_folder_linked_mid_save_then_deleted_is_not_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The look came between the weights and the optimizer of checkpoint-10; before the next,
    the job finished it, saved checkpoint-20 and deleted checkpoint-10. What the look linked
    parses, but lacks what each of this job's checkpoints holds: a resume from it would
    start without its optimizer."""
    keeper = Keeper(tmp_path)
    first = tmp_path / "checkpoint-10"
    first.mkdir()
    (first / "model.pt").write_bytes(version_bytes(20))
    keeper.poll(0.0)
    (first / "optimizer.pt").write_bytes(version_bytes(40))
    second = tmp_path / "checkpoint-20"
    second.mkdir()
    (second / "model.pt").write_bytes(version_bytes(40))
    (second / "optimizer.pt").write_bytes(version_bytes(60))
    shutil.rmtree(first)
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        settle(keeper, 1.0)
    keeper.close()
    assert [v.original.name for v in kept_versions(tmp_path)] == ["checkpoint-20"]
    assert "lacks optimizer.pt" in caplog.text


def test_a_checkpoint_seen_half_written_then_deleted_is_not_kept_and_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = Keeper(tmp_path)
    path = tmp_path / "model_step10.pt"
    path.write_bytes(version_bytes(20)[:-100])  # the look finds the save half done
    keeper.poll(0.0)
    assert keeper.flush(timeout_s=10)
    os.unlink(path)  # and the staged links hold no more than the half
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        settle(keeper, 10.0)
    keeper.close()
    assert kept_versions(tmp_path) == []
    assert "not keeping" in caplog.text and "deleted by the job" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert os.listdir(tmp_path / KEPT_DIR) == [], "its staging removed"


def test_a_checkpoint_folder_still_being_written_waits_until_it_settles(tmp_path: Path) -> None:
    keeper = Keeper(tmp_path)
    folder = tmp_path / "checkpoint-10"
    folder.mkdir()
    (folder / "model.pt").write_bytes(version_bytes(20))
    keeper.poll(0.0)
    (folder / "optimizer.pt").write_bytes(version_bytes(40))  # the save goes on
    keeper.poll(keeper.settle_s)
    assert keeper.flush(timeout_s=10)
    assert kept_versions(tmp_path) == []
    settle(keeper, keeper.settle_s)
    keeper.close()
    (kept,) = kept_versions(tmp_path)
    assert sorted(os.listdir(kept.path)) == ["model.pt", "optimizer.pt"]


def test_a_checkpoint_that_does_not_parse_is_not_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = Keeper(tmp_path)
    (tmp_path / "model_step10.pt").write_bytes(version_bytes(20)[:-100])  # cut short
    with caplog.at_level(logging.INFO, logger="sentinel.checkpoints.keep"):
        settle(keeper, 0.0)
    keeper.close()
    assert kept_versions(tmp_path) == []
    assert "not keeping" in caplog.text and "model_step10.pt" in caplog.text
    assert os.listdir(tmp_path / KEPT_DIR) == [], "its staging removed"


def test_the_listing_shows_the_kept_copies_and_which_of_the_jobs_own_are_gone(
    tmp_path: Path, start_job: Callable[[str], RotatingJob]
) -> None:
    """A person who resumes by hand sees what sentinel kept of the checkpoints the job
    deleted, where it is, and that it is the only copy left."""
    keeper = Keeper(tmp_path)
    run(start_job("files"), keeper, (10, 20, 30))
    keeper.close()
    state = ["--state-dir", str(tmp_path / "no-state")]
    listing = sentinel_here("checkpoints", str(tmp_path), *state, env=clean_env())
    assert listing.returncode == 0, listing.stderr
    rows = {
        line.split()[1]: line
        for line in listing.stdout.splitlines()
        if KEPT_DIR in line and line.split()[0].isdigit()
    }
    assert sorted(rows) == ["model_step20.pt", "model_step30.pt"], listing.stdout
    assert rows["model_step20.pt"].split()[0] == "20"
    assert "the job's own is gone" in rows["model_step20.pt"]
    assert "gone" not in rows["model_step30.pt"]
    assert "kept by sentinel" in listing.stdout
    as_json = json.loads(sentinel_here("checkpoints", "--json", str(tmp_path), *state).stdout)
    assert [(k["step"], k["intact"], k["after_onset"]) for k in as_json["kept"]] == [
        (20, True, False),
        (30, True, False),
    ]


def test_lightning_logs_versions_are_kept_each_and_a_rollback_puts_one_back(
    tmp_path: Path,
) -> None:
    """``--checkpoints lightning_logs``: Lightning's default ``save_top_k=1`` deletes each
    ``epoch=..-step=...ckpt`` in ``version_0/checkpoints/`` as it writes the next. Only the
    pool's top folder was kept, nothing under it: a real run whose one save came after its
    onset gave up ("no clean checkpoint") with the clean one deleted. Each version's folder
    has a keeper, and the rollback puts the clean save back where Lightning wrote it."""
    import torch

    from sentinel.checkpoints.keep import FolderKeepers

    logs = tmp_path / "lightning_logs"
    folder = logs / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    keepers = FolderKeepers(logs)

    def save(step: int, previous: int | None) -> None:
        state = {"state_dict": {"w": torch.zeros(2)}, "global_step": step, "epoch": 0}
        state["pytorch-lightning_version"] = "2.6.6"
        torch.save(state, folder / f"epoch=0-step={step}.ckpt")
        if previous is not None:
            (folder / f"epoch=0-step={previous}.ckpt").unlink()  # save_top_k=1

    save(120, None)
    now = settle(keepers, 0.0)
    save(130, 120)  # written after the onset at 125; 120 is gone
    settle(keepers, now)
    keepers.close()
    # What a person resuming by hand sees: the kept copy, listed and counted from the pool
    # (only `sentinel checkpoints lightning_logs/version_0/checkpoints` listed it).
    listed = sentinel_here("checkpoints", "--json", str(logs), cwd=tmp_path)
    kept = json.loads(listed.stdout)["kept"]
    assert [Path(k["original"]).name for k in kept] == [
        "epoch=0-step=120.ckpt",
        "epoch=0-step=130.ckpt",
    ], kept
    assert disk_use(logs).kept_bytes > 0
    plan = plan_rollback(logs, Onset(step=125))
    assert plan.restore is not None and plan.put_back is not None
    assert plan.restore.path == folder / "epoch=0-step=120.ckpt"
    apply_rollback(plan, logs, label="20261129T210000-loss_spike")
    assert torch.load(folder / "epoch=0-step=120.ckpt")["global_step"] == 120
    assert not (folder / "epoch=0-step=130.ckpt").exists()


def test_a_sentinel_that_stops_mid_save_leaves_no_staging_of_a_checkpoint_still_there(
    tmp_path: Path,
) -> None:
    """``watch --pid`` ended with its job while a save was still settling: the save's staged
    links stayed in ``.sentinel-kept/<name>/.staging-000001`` for good. A sentinel started
    later drops such stale links of a checkpoint still in place, and leaves those of one the
    job deleted meanwhile: they may be the only copy."""
    keeper = Keeper(tmp_path)
    (tmp_path / "model_step10.pt").write_bytes(version_bytes(20))
    keeper.poll(0.0)  # staged, not settled yet
    assert keeper.flush(timeout_s=10)
    assert (tmp_path / KEPT_DIR / "model_step10.pt" / ".staging-000001").is_dir()
    keeper.close()
    assert os.listdir(tmp_path / KEPT_DIR) == [], "its staging removed"

    for name in ("model_step20.pt", "model_step30.pt"):  # an earlier sentinel's, left
        staging = tmp_path / KEPT_DIR / name / ".staging-000001"
        staging.mkdir(parents=True)
        (staging / name).write_bytes(version_bytes(20))
    (tmp_path / "model_step30.pt").write_bytes(version_bytes(40))  # 20 the job deleted
    later = Keeper(tmp_path)
    later.poll(100.0)
    assert later.flush(timeout_s=10)
    later.close()
    assert (tmp_path / KEPT_DIR / "model_step20.pt" / ".staging-000001").is_dir()
    assert not (tmp_path / KEPT_DIR / "model_step30.pt" / ".staging-000001").exists()
