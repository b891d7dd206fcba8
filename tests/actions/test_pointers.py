"""Resume pointers after a rollback: laid out as each framework writes them, read as it reads them.

Each test writes a checkpoint dir by hand with the exact pointer contents the framework
writes, rolls back over an onset at step 50 (clean 20 and 40, poisoned 60), then resumes
the way that framework does (its few lines of pointer reading, reimplemented and cited)
and checks that it lands on the clean checkpoint of step 40.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sentinel.checkpoints import atomic
from sentinel.checkpoints.files import read_content
from sentinel.checkpoints.pointer_find import Form, PointerKind, find_pointers
from sentinel.checkpoints.pointers import apply_rewrite, plan_rewrites, rewrite
from sentinel.checkpoints.quarantine import MANIFEST
from sentinel.checkpoints.restore import RestoreRefused, restore_quarantine
from sentinel.checkpoints.rollback import apply_rollback, plan_rollback, pointer_note
from sentinel.checkpoints.scan import QUARANTINE_DIR, CheckpointStatus, scan
from sentinel.cli.main import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "checkpoints"
LABEL = "20261125T210000-nan_inf"
ONSET = 50
T0 = 1_700_000_000.0


def age(path: Path, step: int) -> None:
    """Give ``path`` (and all below it) the mtime of a save at ``step``: later step, later time."""
    for below in [path, *(path.rglob("*") if path.is_dir() else [])]:
        os.utime(below, (T0 + step, T0 + step), follow_symlinks=False)


def roll_back(directory: Path) -> list[Path]:
    plan = plan_rollback(directory, ONSET)
    assert plan.restore is not None
    assert plan.restore.step == 40, plan.restore
    return apply_rollback(plan, directory, label=LABEL)


# -- DeepSpeed ----------------------------------------------------------------------------


def deepspeed_run(directory: Path) -> None:
    """engine.save_checkpoint at steps 20, 40, 60 (ZeRO, two data-parallel ranks).

    deepspeed/runtime/engine.py save_checkpoint: the tag defaults to
    f"global_step{self.global_steps}", and rank 0 ends with
        with open(os.path.join(save_dir, 'latest'), 'w') as fd:
            fd.write(tag)
    (no newline); _copy_recovery_script puts zero_to_fp32.py beside the tags.
    """
    for step in (20, 40, 60):
        shutil.copytree(FIXTURES / "deepspeed" / "global_step40", directory / f"global_step{step}")
        age(directory / f"global_step{step}", step)
        (directory / "latest").write_text(f"global_step{step}")
    (directory / "zero_to_fp32.py").write_text("# DeepSpeed's recovery script\n")


def deepspeed_resume(load_dir: Path, universal: bool = False) -> Path | None:
    """DeepSpeedEngine.load_checkpoint(load_dir, tag=None), up to the folder it loads.

    deepspeed/runtime/engine.py:
        latest_tag = "latest_universal" if self.load_universal_checkpoint() else "latest"
        latest_path = os.path.join(load_dir, latest_tag)
        if os.path.isfile(latest_path):
            with open(latest_path, 'r') as fd:
                tag = fd.read().strip()
        else: ... logger.warning("Unable to find latest file at ..."); return None, None
    """
    latest_path = os.path.join(load_dir, "latest_universal" if universal else "latest")
    if not os.path.isfile(latest_path):
        return None  # DeepSpeed trains from scratch, silently
    with open(latest_path) as fd:
        tag = fd.read().strip()
    return Path(os.path.join(load_dir, tag))


def test_deepspeed_latest_names_the_clean_tag_after_a_rollback(tmp_path: Path) -> None:
    deepspeed_run(tmp_path)
    [latest] = find_pointers(tmp_path)
    assert (latest.kind, latest.form, latest.says) == (
        PointerKind.DEEPSPEED_LATEST,
        Form.FILE,
        "global_step60",
    )

    roll_back(tmp_path)

    assert (tmp_path / "latest").read_bytes() == b"global_step40"  # as DeepSpeed writes it
    resumed = deepspeed_resume(tmp_path)
    assert resumed == tmp_path / "global_step40"
    [checkpoint] = [c for c in scan(tmp_path) if c.path == resumed]
    assert checkpoint.status is CheckpointStatus.CLEAN
    assert (tmp_path / QUARANTINE_DIR / LABEL / "global_step60").is_dir()


def test_deepspeed_latest_universal_left_alone_without_a_universal_checkpoint(
    tmp_path: Path,
) -> None:
    deepspeed_run(tmp_path)
    # ds_to_universal.py: latest_file = os.path.join(checkpoint_root_folder, 'latest_universal')
    #                     with open(latest_file, "w") as f: f.write(step_folder)
    (tmp_path / "latest_universal").write_text("global_step60_universal")
    plan = plan_rollback(tmp_path, ONSET)
    apply_rollback(plan, tmp_path, label=LABEL)

    assert (tmp_path / "latest_universal").read_text() == "global_step60_universal"
    note = pointer_note(plan)
    assert "latest -> global_step40" in note
    assert "latest_universal (global_step40 is not a universal checkpoint)" in note


def test_deepspeed_latest_universal_names_the_clean_universal_folder(tmp_path: Path) -> None:
    for step in (20, 40, 60):
        universal = tmp_path / f"global_step{step}_universal"
        (universal / "zero" / "linear.weight").mkdir(parents=True)
        shutil.copy(
            FIXTURES / "plain" / "model_step40.pt", universal / "zero" / "linear.weight" / "fp32.pt"
        )
        age(universal, step)
    (tmp_path / "latest_universal").write_text("global_step60_universal")
    pointers = find_pointers(tmp_path)
    clean = tmp_path / "global_step40_universal"

    changes = rewrite(pointers, clean, tmp_path / QUARANTINE_DIR / LABEL, quarantined=[])
    assert changes == []  # global_step60_universal is there and not set aside: nothing to do
    changes = rewrite(
        pointers,
        clean,
        tmp_path / QUARANTINE_DIR / LABEL,
        quarantined=[tmp_path / "global_step60_universal"],
    )

    assert [(c.before, c.after) for c in changes] == [
        ("global_step60_universal", "global_step40_universal")
    ]
    assert deepspeed_resume(tmp_path, universal=True) == clean


# -- Megatron-LM --------------------------------------------------------------------------


def megatron_run(directory: Path, tracker: str = "60") -> None:
    """save_checkpoint at iterations 20, 40, 60 (legacy per-rank torch files).

    megatron/training/checkpointing.py: get_checkpoint_name -> 'iter_{:07d}'.format(iteration)
    /mp_rank_00/model_optim_rng.pt, and after the save, on rank 0:
        tracker_filename = get_checkpoint_tracker_filename(save_dir)
        with open(tracker_filename, 'w') as f:
            f.write(str(iteration))
    """
    for step in (20, 40, 60):
        rank = directory / f"iter_{step:07d}" / "mp_rank_00"
        rank.mkdir(parents=True)
        shutil.copy(FIXTURES / "plain" / "model_step40.pt", rank / "model_optim_rng.pt")
        age(rank.parent, step)
    (directory / "latest_checkpointed_iteration.txt").write_text(tracker)


def megatron_resume(load_dir: Path) -> Path:
    """load_checkpoint: read_metadata(tracker), then get_checkpoint_name's directory.

    megatron/training/checkpointing.py read_metadata:
        metastring = f.read().strip()
        try: iteration = int(metastring)
        except ValueError: release = metastring == 'release' (else exit)
        assert iteration > 0 or release
    """
    tracker = os.path.join(load_dir, "latest_checkpointed_iteration.txt")
    iteration, release = 0, False
    with open(tracker) as f:
        metastring = f.read().strip()
        try:
            iteration = int(metastring)
        except ValueError:
            release = metastring == "release"
            assert release, f"Invalid metadata file {tracker}"
    assert iteration > 0 or release
    directory = "release" if release else f"iter_{iteration:07d}"
    return load_dir / directory


def test_megatron_tracker_names_the_clean_iteration_after_a_rollback(tmp_path: Path) -> None:
    megatron_run(tmp_path)
    [tracker] = find_pointers(tmp_path)
    assert (tracker.kind, tracker.target) == (
        PointerKind.MEGATRON_TRACKER,
        tmp_path / "iter_0000060",
    )

    roll_back(tmp_path)

    assert (tmp_path / "latest_checkpointed_iteration.txt").read_bytes() == b"40"
    assert megatron_resume(tmp_path) == tmp_path / "iter_0000040"
    assert (tmp_path / "iter_0000040" / "mp_rank_00" / "model_optim_rng.pt").is_file()


def test_megatron_release_tracker_is_left_alone(tmp_path: Path) -> None:
    megatron_run(tmp_path, tracker="release")
    (tmp_path / "release" / "mp_rank_00").mkdir(parents=True)

    roll_back(tmp_path)

    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert megatron_resume(tmp_path) == tmp_path / "release"


# -- Lightning ------------------------------------------------------------------------------


def lightning_save(path: Path, step: int, *, without: str = "") -> None:
    """Trainer.save_checkpoint: torch.save of _CheckpointConnector.dump_checkpoint's dict."""
    torch = pytest.importorskip("torch")
    checkpoint = {
        "epoch": step // 20 - 1,
        "global_step": step,
        "pytorch-lightning_version": "2.5.0",
        "state_dict": {"layer.weight": torch.full((2, 2), float(step))},
        "loops": {},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
    }
    checkpoint.pop(without, None)
    torch.save(checkpoint, path)
    age(path, step)


def lightning_run(directory: Path, *, last: str) -> None:
    """ModelCheckpoint(save_top_k=-1, save_last=True or "link") at steps 20, 40, 60.

    save_last="link" (ModelCheckpoint._link_checkpoint): os.remove(linkpath), then
        os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
    save_last=True: _save_checkpoint(trainer, "last.ckpt"), a full save of its own.
    """
    for step in (20, 40, 60):
        name = f"epoch={step // 20 - 1}-step={step}.ckpt"
        lightning_save(directory / name, step)
        link = directory / "last.ckpt"
        if last == "link":
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.relpath(directory / name, directory), link)
        else:
            lightning_save(link, step)


def lightning_resume_last(ckpt_dir: Path) -> Path:
    """Trainer.fit(ckpt_path="last"): the newest modification time among the last*.ckpt.

    ModelCheckpoint._find_last_checkpoints: names with suffix ".ckpt" and
    re.match(r"^last(-(\\d+))?", stem); checkpoint_connector._parse_ckpt_path:
    max(candidates_ts, key=candidates_ts.get) over fs.modified(path), which for a
    symlink is its target's (fsspec's LocalFileSystem.info follows the link).
    """
    found = [
        p for p in ckpt_dir.iterdir() if p.suffix == ".ckpt" and re.match(r"^last(-(\d+))?", p.stem)
    ]
    return max(found, key=lambda p: os.stat(p).st_mtime)


def step_inside(path: Path) -> int | None:
    return read_content(Path(os.path.realpath(path))).step


@pytest.mark.slow  # torch's import alone takes about a second
def test_lightning_last_link_names_the_clean_checkpoint_after_a_rollback(tmp_path: Path) -> None:
    lightning_run(tmp_path, last="link")
    [last] = find_pointers(tmp_path)
    assert (last.form, last.says) == (Form.SYMLINK, "epoch=2-step=60.ckpt")
    assert [c.path.name for c in scan(tmp_path)] == [  # the link is not a checkpoint of its own
        "epoch=0-step=20.ckpt",
        "epoch=1-step=40.ckpt",
        "epoch=2-step=60.ckpt",
    ]

    roll_back(tmp_path)

    assert os.readlink(tmp_path / "last.ckpt") == "epoch=1-step=40.ckpt"  # relative, as Lightning
    assert step_inside(lightning_resume_last(tmp_path)) == 40


@pytest.mark.slow  # torch's import alone takes about a second
def test_lightning_last_copy_is_set_aside_and_replaced(tmp_path: Path) -> None:
    lightning_run(tmp_path, last="copy")
    old = os.stat(tmp_path / "last.ckpt")
    [last] = find_pointers(tmp_path)
    assert last.form is Form.COPY

    moved = roll_back(tmp_path)

    folder = tmp_path / QUARANTINE_DIR / LABEL
    assert folder / "last.ckpt" in moved
    assert os.stat(folder / "last.ckpt").st_ino == old.st_ino  # the job's file, moved, not copied
    assert step_inside(folder / "last.ckpt") == 60
    assert not (tmp_path / "last.ckpt").is_symlink()  # a link would let the next save write through
    assert step_inside(lightning_resume_last(tmp_path)) == 40
    assert (
        os.stat(tmp_path / "last.ckpt").st_mtime
        > os.stat(tmp_path / "epoch=1-step=40.ckpt").st_mtime
    )


@pytest.mark.slow  # torch's import alone takes about a second
def test_lightning_hpc_resume_skips_the_poisoned_and_the_broken_saves(tmp_path: Path) -> None:
    # Lightning's SLURM requeue: hpc_save writes hpc_ckpt_{max N + 1}.ckpt at each save.
    for number, step in ((1, 20), (2, 40), (3, 60)):
        lightning_save(tmp_path / f"hpc_ckpt_{number}.ckpt", step)
    # A fourth save cut short, its mtime before the onset: the scan cannot place it after.
    (tmp_path / "hpc_ckpt_4.ckpt").write_bytes(b"PK\x03\x04 cut short")
    age(tmp_path / "hpc_ckpt_4.ckpt", 45)
    placed = {c.path.name: c.step for c in scan(tmp_path)}
    assert placed["hpc_ckpt_3.ckpt"] == 60  # from its content, not the save number in its name

    plan = plan_rollback(tmp_path, ONSET)
    apply_rollback(plan, tmp_path, label=LABEL)

    assert hpc_resume(tmp_path) == tmp_path / "hpc_ckpt_2.ckpt"
    assert step_inside(tmp_path / "hpc_ckpt_2.ckpt") == 40
    assert sorted(os.listdir(tmp_path / QUARANTINE_DIR / LABEL)) == [
        MANIFEST,
        "hpc_ckpt_3.ckpt",
        "hpc_ckpt_4.ckpt",
    ]


@pytest.mark.slow
def test_lightning_hpc_save_left_broken_below_the_clean_one_is_set_aside(tmp_path: Path) -> None:
    # ModelCheckpoint(dirpath=default_root_dir) beside the SLURM saves.
    lightning_save(tmp_path / "hpc_ckpt_1.ckpt", 20)
    lightning_save(tmp_path / "hpc_ckpt_2.ckpt", 30, without="state_dict")
    lightning_save(tmp_path / "epoch=1-step=40.ckpt", 40)
    lightning_save(tmp_path / "epoch=2-step=60.ckpt", 60)
    [hpc] = find_pointers(tmp_path)
    assert (hpc.kind, hpc.path.name) == (PointerKind.LIGHTNING_HPC, "hpc_ckpt_2.ckpt")

    roll_back(tmp_path)

    assert hpc_resume(tmp_path) == tmp_path / "hpc_ckpt_1.ckpt"  # clean, if older
    assert (tmp_path / QUARANTINE_DIR / LABEL / "hpc_ckpt_2.ckpt").is_file()


def hpc_resume(root: Path) -> Path | None:
    """_CheckpointConnector._hpc_resume_path: hpc_ckpt_{max N}.ckpt in default_root_dir.

    __max_ckpt_version_in_folder(dir_path, "hpc_ckpt_"): names holding the key, then
    int(re.sub("[^0-9]", "", name.split(name_key)[-1])), the max.
    """
    files = [name for name in os.listdir(root) if "hpc_ckpt_" in name]
    if not files:
        return None
    versions = [int(re.sub("[^0-9]", "", name.split("hpc_ckpt_")[-1])) for name in files]
    return root / f"hpc_ckpt_{max(versions)}.ckpt"


# -- HF Trainer -----------------------------------------------------------------------------


def hf_get_last_checkpoint(folder: Path) -> Path | None:
    """transformers.trainer_utils.get_last_checkpoint, line for line."""
    _re_checkpoint = re.compile(r"^" + "checkpoint" + r"\-(\d+)$")
    content = os.listdir(folder)
    checkpoints = [
        path
        for path in content
        if _re_checkpoint.search(path) is not None and os.path.isdir(os.path.join(folder, path))
    ]
    if len(checkpoints) == 0:
        return None
    last = max(checkpoints, key=lambda x: int(_re_checkpoint.search(x).groups()[0]))  # type: ignore[union-attr]
    return folder / last


def test_hf_get_last_checkpoint_finds_the_clean_one_after_a_rollback(tmp_path: Path) -> None:
    for step in (20, 40, 60):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        shutil.copy(FIXTURES / "plain" / "model_step40.pt", folder / "model.pt")
        age(folder, step)
    [hf] = find_pointers(tmp_path)
    assert (hf.kind, hf.path.name) == (PointerKind.HF_LAST, "checkpoint-60")

    roll_back(tmp_path)

    assert hf_get_last_checkpoint(tmp_path) == tmp_path / "checkpoint-40"
    assert [p.path.name for p in find_pointers(tmp_path)] == ["checkpoint-40"]


# -- atomicity ------------------------------------------------------------------------------


# Another process reads the pointer as DeepSpeed does, as fast as it can, until told to stop.
READER = """
import sys
from pathlib import Path
latest, stop = Path(sys.argv[1]), Path(sys.argv[2])
seen = set()
Path(sys.argv[3]).touch()
while not stop.exists():
    try:
        with open(latest) as fd:
            seen.add(fd.read())
    except FileNotFoundError:
        seen.add("<absent>")
print("\\n".join(sorted(seen)))
"""


@pytest.mark.slow
def test_a_reader_never_sees_the_pointer_absent_or_half_written(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    latest = folder / "latest"
    latest.write_text("global_step60")
    stop, ready = tmp_path / "stop", tmp_path / "ready"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(latest), str(stop), str(ready)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        while not ready.exists():
            assert reader.poll() is None
        for _ in range(200):
            atomic.write_text(latest, "global_step40")
            atomic.write_text(latest, "global_step60")
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=30)
    assert out.split() == ["global_step40", "global_step60"]  # both seen, nothing else
    assert os.listdir(folder) == ["latest"]  # no temp file left behind


def test_rewrite_renames_over_the_pointer_and_a_failed_one_leaves_it_whole(tmp_path: Path) -> None:
    deepspeed_run(tmp_path)
    os.chmod(tmp_path / "latest", 0o640)
    inode = os.stat(tmp_path / "latest").st_ino

    def fail(temp: Path) -> None:
        temp.write_text("global_st")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic.replace(tmp_path / "latest", fail)
    assert (tmp_path / "latest").read_text() == "global_step60"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]

    roll_back(tmp_path)
    stat = os.stat(tmp_path / "latest")
    assert stat.st_ino != inode  # a new file renamed over, never the old one written in place
    assert stat.st_mode & 0o777 == 0o640


def test_a_copy_whose_replacement_fails_stays_in_place_whole(tmp_path: Path) -> None:
    (tmp_path / "last.ckpt").write_bytes(b"the job's last save")
    clean = tmp_path / "epoch=1-step=40.ckpt"
    clean.write_bytes(b"clean")
    inode = os.stat(tmp_path / "last.ckpt").st_ino
    [planned] = plan_rewrites(find_pointers(tmp_path), clean, [tmp_path / "last.ckpt"])
    clean.unlink()  # gone between the plan and the rewrite

    with pytest.raises(FileNotFoundError):
        apply_rewrite(planned, tmp_path / QUARANTINE_DIR / LABEL, set())

    assert (tmp_path / "last.ckpt").read_bytes() == b"the job's last save"
    assert os.stat(tmp_path / "last.ckpt").st_ino == inode
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]  # no temp copy, nothing set aside


# -- restore, dry run, the listing ------------------------------------------------------------


def pointer_state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name in ("latest", "latest_checkpointed_iteration.txt", "last.ckpt"):
        path = directory / name
        if path.is_symlink():
            state[name] = ("link", os.readlink(path))
        elif path.exists():
            state[name] = ("file", path.read_bytes(), os.stat(path).st_ino)
    return state


@pytest.mark.parametrize(
    "run",
    [
        "deepspeed",
        "megatron",
        pytest.param("lightning-link", marks=pytest.mark.slow),
        pytest.param("lightning-copy", marks=pytest.mark.slow),
    ],
)
def test_restore_puts_the_pointers_back(tmp_path: Path, run: str) -> None:
    if run == "deepspeed":
        deepspeed_run(tmp_path)
    elif run == "megatron":
        megatron_run(tmp_path)
    else:
        lightning_run(tmp_path, last=run.removeprefix("lightning-"))
    before = pointer_state(tmp_path)
    roll_back(tmp_path)
    manifest = json.loads((tmp_path / QUARANTINE_DIR / LABEL / MANIFEST).read_text())
    assert len(manifest["pointers"]) == 1
    assert pointer_state(tmp_path) != before

    restore_quarantine(tmp_path, LABEL)

    after = pointer_state(tmp_path)
    if run == "lightning-copy":  # the job's own file again, not a copy of it
        assert after == before
    else:
        assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
    assert not (tmp_path / QUARANTINE_DIR / LABEL).exists()


def test_restore_refuses_when_the_job_moved_a_pointer_on(tmp_path: Path) -> None:
    deepspeed_run(tmp_path)
    roll_back(tmp_path)
    (tmp_path / "latest").write_text("global_step80")  # the resumed job saved again

    with pytest.raises(RestoreRefused, match="latest was rewritten since the rollback"):
        restore_quarantine(tmp_path, LABEL)
    assert (tmp_path / QUARANTINE_DIR / LABEL / "global_step60").is_dir()  # nothing moved
    assert (tmp_path / "latest").read_text() == "global_step80"


def test_dry_run_rewrites_nothing(tmp_path: Path) -> None:
    megatron_run(tmp_path)
    plan = plan_rollback(tmp_path, ONSET)
    assert [(r.pointer.says, r.says) for r in plan.rewrites] == [("60", "40")]

    apply_rollback(plan, tmp_path, label=LABEL, dry_run=True)

    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "60"
    assert not (tmp_path / QUARANTINE_DIR).exists()


def test_a_pointer_naming_an_older_clean_checkpoint_stays(tmp_path: Path) -> None:
    deepspeed_run(tmp_path)
    (tmp_path / "latest").write_text("global_step20")  # saved later with save_latest=False
    pointers = find_pointers(tmp_path)
    assert plan_rewrites(pointers, tmp_path / "global_step40", [tmp_path / "global_step60"]) == []


def test_checkpoints_lists_each_pointer_before_and_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deepspeed_run(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("60")  # names nothing here

    assert main(["checkpoints", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "deepspeed latest: latest -> global_step60\n" in table
    assert "megatron tracker: latest_checkpointed_iteration.txt -> iter_0000060 (missing)" in table
    assert "latest" not in [line.split()[2] for line in table.splitlines()[1:4]]

    roll_back(tmp_path)
    assert main(["checkpoints", "--json", str(tmp_path)]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [(p["kind"], p["says"], p["exists"]) for p in listing["pointers"]] == [
        ("deepspeed latest", "global_step40", True),
        ("megatron tracker", "60", False),  # no Megatron checkpoint to name: left as it was
    ]
    assert [Path(c["path"]).name for c in listing["checkpoints"]] == [
        "global_step20",
        "global_step40",
    ]


# -- end to end: sentinel watch, a DeepSpeed-style job relaunched by someone else --------------

# Resumes the way DeepSpeedEngine.load_checkpoint(tag=None) does (the `latest` file, then the
# folder it names; a tag whose folder is gone is the crash DeepSpeed's loader would be) and
# saves as engine.save_checkpoint does: the tag folder, then `latest` holding the bare tag.
# Saves every 10 steps and at step 25, right as its loss goes NaN (only in attempt 1).
DS_JOB = """
import json, os, shutil, sys, time
from pathlib import Path
run, shards = Path(sys.argv[1]), Path(sys.argv[2])
ckpt = run / "ckpt"; ckpt.mkdir(parents=True, exist_ok=True)
(run / "job.pid.tmp").write_text(str(os.getpid()))
os.replace(run / "job.pid.tmp", run / "job.pid")
attempt = len(list(run.glob("attempt-*"))) + 1
start, tag = 0, None
if os.path.isfile(ckpt / "latest"):
    with open(ckpt / "latest") as fd:
        tag = fd.read().strip()
    if not (ckpt / tag).is_dir():
        (run / f"attempt-{attempt}").write_text(json.dumps({"tag": tag, "start": None}))
        sys.exit(1)
    start = int(tag.removeprefix("global_step"))
(run / f"attempt-{attempt}").write_text(json.dumps({"tag": tag, "start": start}))
with (run / "train.log").open("a") as log:
    for step in range(start + 1, 41):
        if step % 10 == 0 or step == 25:
            shutil.copytree(shards, ckpt / f"global_step{step}", dirs_exist_ok=True)
            with open(ckpt / "latest", "w") as fd:
                fd.write(f"global_step{step}")
        bad = step == 25 and attempt == 1
        log.write(json.dumps({"step": step, "loss": float("nan") if bad else 2.0 - step / 100}))
        log.write("\\n"); log.flush()
        time.sleep(60 if bad else 0.05)
"""

# systemd's Restart=on-failure with RestartPreventExitStatus=90, through the README's wrapper.
DS_ORCHESTRATOR = """
import json, subprocess, sys
from pathlib import Path
py, job, run, shards, state = sys.argv[1:6]
wrapper = (f"{py} {job} {run} {shards}; status=$?; "
           f"exec {py} -m sentinel verdict --state-dir {state} --wait --timeout 60"
           " --job-status $status")
codes = []
for _ in range(3):
    codes.append(subprocess.call(["bash", "-c", wrapper]))
    # Whole or not at all: the test reads it while this runs.
    Path(run, "codes.json.tmp").write_text(json.dumps(codes))
    Path(run, "codes.json.tmp").replace(Path(run, "codes.json"))
    if codes[-1] in (0, 90):
        break
"""


@pytest.mark.slow
def test_watch_relaunch_by_someone_else_resumes_from_the_rewritten_latest(tmp_path: Path) -> None:
    run, state = tmp_path / "run", tmp_path / "state"
    run.mkdir()
    (tmp_path / "job.py").write_text(DS_JOB)
    (tmp_path / "orchestrator.py").write_text(DS_ORCHESTRATOR)
    shards = FIXTURES / "deepspeed" / "global_step40"
    orchestrator = [sys.executable, str(tmp_path / "orchestrator.py"), sys.executable,
                    str(tmp_path / "job.py"), str(run), str(shards), str(state)]  # fmt: skip
    launcher = (  # exits at once: neither the orchestrator nor the job is sentinel's child
        "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    subprocess.run([sys.executable, "-c", launcher, *orchestrator], check=True, timeout=30)
    watch = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "watch", "--pidfile", str(run / "job.pid"),
         "--log", str(run / "train.log"), "--checkpoints", str(run / "ckpt"),
         "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SENTINEL_JOB__GRACE_PERIOD_S": "5"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while (
            not (run / "codes.json").exists()
            or len(json.loads((run / "codes.json").read_text())) < 2
        ):
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.1)
    finally:
        watch.send_signal(signal.SIGTERM)
        _, err = watch.communicate(timeout=30)
    assert json.loads((run / "codes.json").read_text()) == [91, 0], err
    second = json.loads((run / "attempt-2").read_text())
    assert second == {"tag": "global_step20", "start": 20}, "resumed from the rewritten latest"
    assert [p.name for p in (run / "ckpt" / QUARANTINE_DIR).rglob("global_step*")] == [
        "global_step25"
    ]
    assert "latest now names global_step20 (was global_step25)" in err
    kept = [p.read_bytes() for p in state.rglob("*") if p.is_file()]
    assert any(b"latest -> global_step20" in data for data in kept), "the timeline's note"
    assert (run / "ckpt" / "latest").read_text() == "global_step40"  # the job's own saves since
