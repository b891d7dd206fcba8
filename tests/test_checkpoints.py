"""Tests for checkpoint scanning and integrity, over real files in tmp_path."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.checkpoints.scan import (
    QUARANTINE_DIR,
    Checkpoint,
    CheckpointStatus,
    Onset,
    last_clean,
    scan,
    step_of,
)
from tests.helpers.cli import sentinel_here
from tests.helpers.env import clean_env

CLEAN = CheckpointStatus.CLEAN
CORRUPT = CheckpointStatus.CORRUPT
INCOMPLETE = CheckpointStatus.INCOMPLETE
AFTER_ONSET = CheckpointStatus.AFTER_ONSET


def safetensors_bytes(
    header: object | None = None, data: bytes = b"\x00" * 8, header_len: int | None = None
) -> bytes:
    """Return a safetensors file: 8-byte little-endian header length, JSON header, data."""
    if header is None:
        header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    length = len(raw) if header_len is None else header_len
    return struct.pack("<Q", length) + raw + data


def torch_zip_bytes(path: Path) -> None:
    """Write a zip laid out like torch.save's (archive/data.pkl, archive/data/0)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/data/0", b"\x01" * 4096)
        archive.writestr("archive/version", b"3\n")


def write_safetensors(path: Path) -> None:
    path.write_bytes(safetensors_bytes())


def write_hf_checkpoint(path: Path, *, state: bool = True, weights: bool = True) -> Path:
    path.mkdir(parents=True)
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    if weights:
        write_safetensors(path / "model.safetensors")
    (path / "config.json").write_text("{}")
    return path


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-500", 500),
        ("checkpoint-0", 0),
        ("global_step1200", 1200),
        ("step_30", 30),
        ("step-30", 30),
        ("step_30.pt", 30),
        ("epoch=2-step=4500.ckpt", 4500),
        ("epoch=0-step=10-v1.ckpt", 10),
        ("model-1200.pt", 1200),
        ("weights-77.pth", 77),
        ("model-300.safetensors", 300),
        ("run-a-99.ckpt", 99),
        ("latest", None),
        ("runs", None),
        ("quarantine", None),
        ("trainer_state.json", None),
        ("last.ckpt", None),
        ("model.safetensors", None),
        ("model-00001-of-00002.safetensors", None),
        ("tmp-checkpoint-500", None),
        ("checkpoint-", None),
        ("model-12.txt", None),
        ("global_step", None),
    ],
)
def test_step_of(name: str, step: int | None) -> None:
    assert step_of(name) == step


def _valid_safetensors(p: Path) -> None:
    p.write_bytes(safetensors_bytes())


def _truncated_safetensors(p: Path) -> None:
    p.write_bytes(safetensors_bytes()[:-3])


def _garbage_header_len(p: Path) -> None:
    p.write_bytes(safetensors_bytes(header_len=999))


def _huge_header_len(p: Path) -> None:
    p.write_bytes(b"\xff" * 8 + b"{}" + b"\x00" * 8)


def _header_not_json(p: Path) -> None:
    p.write_bytes(safetensors_bytes(header=b"not json at all!"))


def _header_not_object(p: Path) -> None:
    p.write_bytes(safetensors_bytes(header=b"[1, 2, 3]"))


def _trailing_bytes(p: Path) -> None:
    p.write_bytes(safetensors_bytes(data=b"\x00" * 12))


def _torch_zip(p: Path) -> None:
    torch_zip_bytes(p)


def _torch_zip_truncated(p: Path) -> None:
    torch_zip_bytes(p)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _legacy_pickle(p: Path) -> None:
    p.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.")


def _not_torch(p: Path) -> None:
    p.write_bytes(b"hello, I am text")


@pytest.mark.parametrize(
    ("name", "write", "status", "reason_part"),
    [
        pytest.param("model-100.safetensors", _valid_safetensors, CLEAN, "", id="st-valid"),
        pytest.param(
            "model-100.safetensors", _truncated_safetensors, CORRUPT, "truncated", id="st-trunc"
        ),
        pytest.param(
            "model-100.safetensors", _garbage_header_len, CORRUPT, "999 exceeds", id="st-len"
        ),
        pytest.param(
            "model-100.safetensors", _huge_header_len, CORRUPT, "not sane", id="st-len-huge"
        ),
        pytest.param(
            "model-100.safetensors", _header_not_json, CORRUPT, "not JSON", id="st-not-json"
        ),
        pytest.param(
            "model-100.safetensors", _header_not_object, CORRUPT, "JSON object", id="st-array"
        ),
        pytest.param(
            "model-100.safetensors", _trailing_bytes, CORRUPT, "data bytes", id="st-trailing"
        ),
        pytest.param("model-100.pt", _torch_zip, CLEAN, "", id="zip-valid"),
        pytest.param("model-100.pt", _torch_zip_truncated, CORRUPT, "zip", id="zip-half"),
        pytest.param("model-100.pt", _empty, CORRUPT, "empty", id="pt-empty"),
        pytest.param("model-100.safetensors", _empty, CORRUPT, "empty", id="st-empty"),
        pytest.param("model-100.pt", _legacy_pickle, CLEAN, "", id="legacy-pickle"),
        pytest.param("model-100.pth", _not_torch, CORRUPT, "neither", id="pt-text"),
        pytest.param("epoch=1-step=100.ckpt", _torch_zip, CLEAN, "", id="lightning-zip"),
    ],
)
def test_weights_file_integrity(
    tmp_path: Path,
    name: str,
    write: Callable[[Path], None],
    status: CheckpointStatus,
    reason_part: str,
) -> None:
    write(tmp_path / name)
    [checkpoint] = scan(tmp_path)
    assert checkpoint.status is status, checkpoint.reason
    assert checkpoint.step == 100
    assert reason_part in checkpoint.reason
    if status is CLEAN:
        assert checkpoint.reason == ""
    else:
        assert checkpoint.reason.startswith(name + ": ")


@pytest.mark.slow
@pytest.mark.slow  # importing torch takes seconds
def test_real_torch_save_is_clean(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch not installed")
    torch.save({"w": torch.zeros(4)}, tmp_path / "model-7.pt")
    [checkpoint] = scan(tmp_path)
    assert (checkpoint.step, checkpoint.status) == (7, CLEAN)


def _hf_complete(d: Path) -> None:
    write_hf_checkpoint(d)


def _hf_no_state(d: Path) -> None:
    write_hf_checkpoint(d, state=False)


def _hf_no_weights(d: Path) -> None:
    write_hf_checkpoint(d, weights=False)


def _hf_peft(d: Path) -> None:
    write_hf_checkpoint(d, weights=False)
    write_safetensors(d / "adapter_model.safetensors")


def _hf_corrupt_weights(d: Path) -> None:
    write_hf_checkpoint(d)
    (d / "model.safetensors").write_bytes(safetensors_bytes(header_len=999))


def _hf_corrupt_optimizer(d: Path) -> None:
    write_hf_checkpoint(d)
    (d / "optimizer.pt").write_bytes(b"")


def _sharded(d: Path, *, drop: str | None = None) -> None:
    write_hf_checkpoint(d, weights=False)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map = {"a.weight": shards[0], "b.weight": shards[1]}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for shard in shards:
        if shard != drop:
            write_safetensors(d / shard)


def _sharded_complete(d: Path) -> None:
    _sharded(d)


def _sharded_missing(d: Path) -> None:
    _sharded(d, drop="model-00002-of-00002.safetensors")


def _bad_index(d: Path) -> None:
    write_hf_checkpoint(d)
    (d / "model.safetensors.index.json").write_text("{ nope")


def _deepspeed(d: Path) -> None:
    d.mkdir()
    torch_zip_bytes(d / "mp_rank_00_model_states.pt")
    torch_zip_bytes(d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")


def _deepspeed_truncated(d: Path) -> None:
    _deepspeed(d)
    _torch_zip_truncated(d / "mp_rank_00_model_states.pt")


def _deepspeed_empty_of_states(d: Path) -> None:
    d.mkdir()
    (d / "latest").write_text("global_step100")


def _hf_with_deepspeed_subdir(d: Path) -> None:
    write_hf_checkpoint(d, weights=False)
    _deepspeed(d / "global_step100")


def _empty_dir(d: Path) -> None:
    d.mkdir()


def _plain_dir(d: Path) -> None:
    d.mkdir()
    (d / "notes.txt").write_text("anything")


@pytest.mark.parametrize(
    ("name", "build", "status", "reason_part"),
    [
        pytest.param("checkpoint-100", _hf_complete, CLEAN, "", id="hf-complete"),
        pytest.param("checkpoint-100", _hf_no_state, INCOMPLETE, "trainer_state", id="hf-state"),
        pytest.param("checkpoint-100", _hf_no_weights, INCOMPLETE, "weights", id="hf-weights"),
        pytest.param("checkpoint-100", _hf_peft, CLEAN, "", id="hf-peft-adapter"),
        pytest.param(
            "checkpoint-100", _hf_corrupt_weights, CORRUPT, "model.safetensors: header length 999",
            id="hf-corrupt-weights",
        ),
        pytest.param(
            "checkpoint-100", _hf_corrupt_optimizer, CORRUPT, "optimizer.pt: empty",
            id="hf-empty-optimizer",
        ),
        pytest.param("checkpoint-100", _sharded_complete, CLEAN, "", id="shards-complete"),
        pytest.param(
            "checkpoint-100", _sharded_missing, INCOMPLETE, "missing shard model-00002",
            id="shards-missing",
        ),
        pytest.param("checkpoint-100", _bad_index, CORRUPT, "index", id="shard-index-garbage"),
        pytest.param(
            "checkpoint-100", _hf_with_deepspeed_subdir, CLEAN, "", id="hf-deepspeed-subdir"
        ),
        pytest.param("global_step100", _deepspeed, CLEAN, "", id="deepspeed"),
        pytest.param(
            "global_step100", _deepspeed_truncated, CORRUPT, "mp_rank_00_model_states.pt",
            id="deepspeed-truncated",
        ),
        pytest.param(
            "global_step100", _deepspeed_empty_of_states, INCOMPLETE, "model_states",
            id="deepspeed-no-states",
        ),
        pytest.param("checkpoint-100", _empty_dir, INCOMPLETE, "empty", id="hf-empty-dir"),
        pytest.param("step_100", _empty_dir, INCOMPLETE, "empty", id="plain-empty-dir"),
        pytest.param("step_100", _plain_dir, CLEAN, "", id="plain-dir"),
    ],
)  # fmt: skip
def test_directory_integrity(
    tmp_path: Path,
    name: str,
    build: Callable[[Path], None],
    status: CheckpointStatus,
    reason_part: str,
) -> None:
    build(tmp_path / name)
    [checkpoint] = scan(tmp_path)
    assert checkpoint.status is status, checkpoint.reason
    assert reason_part in checkpoint.reason
    assert checkpoint.path == tmp_path / name
    assert checkpoint.path.is_absolute()


def test_scan_missing_directory(tmp_path: Path) -> None:
    assert scan(tmp_path / "nope") == []


def test_scan_ignores_quarantine_and_non_checkpoints(tmp_path: Path) -> None:
    write_hf_checkpoint(tmp_path / "checkpoint-10")
    write_hf_checkpoint(tmp_path / QUARANTINE_DIR / "x" / "checkpoint-20")
    (tmp_path / "runs").mkdir()
    (tmp_path / "trainer_state.json").write_text("{}")
    (tmp_path / "latest").write_text("global_step10")
    assert [c.path.name for c in scan(tmp_path)] == ["checkpoint-10"]


def test_scan_relative_directory_gives_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_hf_checkpoint(tmp_path / "ckpts" / "checkpoint-10")
    monkeypatch.chdir(tmp_path)
    [checkpoint] = scan(Path("ckpts"))
    assert checkpoint.path == tmp_path / "ckpts" / "checkpoint-10"


def test_same_step_entries_are_kept_apart(tmp_path: Path) -> None:
    write_hf_checkpoint(tmp_path / "checkpoint-100")
    torch_zip_bytes(tmp_path / "model-100.pt")
    found = scan(tmp_path)
    assert sorted(c.path.name for c in found) == ["checkpoint-100", "model-100.pt"]
    assert {c.step for c in found} == {100}


def build_run(directory: Path) -> None:
    """A run with clean 100, 200, a corrupt 300, then 400 and 500 (clean on disk)."""
    for step in (100, 200, 400, 500):
        write_hf_checkpoint(directory / f"checkpoint-{step}")
    _hf_corrupt_weights(directory / "checkpoint-300")
    for offset, checkpoint in enumerate(sorted(directory.iterdir())):
        os.utime(checkpoint, (1_000_000 + offset, 1_000_000 + offset))


def test_scan_sorted_with_onset_statuses(tmp_path: Path) -> None:
    build_run(tmp_path)
    found = scan(tmp_path, onset_step=400)
    assert [(c.step, c.status) for c in found] == [
        (100, CLEAN),
        (200, CLEAN),
        (300, CORRUPT),
        (400, AFTER_ONSET),
        (500, AFTER_ONSET),
    ]
    assert found[3].reason == "step 400 >= onset step 400"
    assert all(isinstance(c, Checkpoint) and c.mtime > 0 for c in found)


def test_last_clean_skips_corrupt_before_onset(tmp_path: Path) -> None:
    build_run(tmp_path)
    found = scan(tmp_path, onset_step=400)
    chosen = last_clean(found, 400)
    assert chosen is not None
    assert chosen.path.name == "checkpoint-200"


def test_last_clean_without_onset_takes_newest_clean(tmp_path: Path) -> None:
    build_run(tmp_path)
    chosen = last_clean(scan(tmp_path))
    assert chosen is not None
    assert chosen.step == 500


def test_last_clean_applies_onset_to_an_unonset_scan(tmp_path: Path) -> None:
    build_run(tmp_path)
    chosen = last_clean(scan(tmp_path), onset_step=450)
    assert chosen is not None
    assert chosen.step == 400


def test_last_clean_none_when_nothing_clean(tmp_path: Path) -> None:
    _hf_no_state(tmp_path / "checkpoint-100")
    assert last_clean(scan(tmp_path, onset_step=50), 50) is None
    assert last_clean(scan(tmp_path)) is None


# -- the onset as step, epoch and time --------------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"
T0 = 1_700_000_000.0


def place(path: Path, source: Path, mtime: float) -> None:
    path.write_bytes(source.read_bytes())
    os.utime(path, (mtime, mtime))


@pytest.mark.parametrize(
    ("name", "source", "onset", "after"),
    [
        pytest.param("model_step40.pt", "plain/model_step40.pt", Onset(step=40), True,
                     id="step-at-onset"),
        pytest.param("model_step40.pt", "plain/model_step40.pt", Onset(step=41), False,
                     id="step-before-onset"),
        pytest.param("epoch_3.pt", "epochs/last.pt", Onset(step=10, epoch=4.5), False,
                     id="epoch-before-onset-epoch"),
        pytest.param("epoch_3.pt", "epochs/last.pt", Onset(step=1, epoch=2.9), True,
                     id="epoch-after-onset-epoch"),
        pytest.param("epoch_3.pt", "epochs/last.pt", Onset(epoch=3.5, time=T0 + 1), False,
                     id="onset-epoch-written-before-onset-time"),
        pytest.param("epoch_3.pt", "epochs/last.pt", Onset(epoch=3.5, time=T0), True,
                     id="onset-epoch-written-at-onset-time"),
        pytest.param("epoch_3.pt", "epochs/last.pt", Onset(epoch=3.5), True,
                     id="onset-epoch-no-time-is-not-trusted"),
        pytest.param("epoch_3.pt", "epochs/last.pt", Onset(step=2000, time=T0 + 1), False,
                     id="epoch-without-onset-epoch-by-time"),
        pytest.param("ckpt.pt", "nanogpt/ckpt.pt", Onset(step=61), False,
                     id="stepless-by-inner-step-before"),
        pytest.param("ckpt.pt", "nanogpt/ckpt.pt", Onset(step=60, time=T0 + 99), True,
                     id="stepless-by-inner-step-at"),
        pytest.param("ckpt.pt", "evil/ckpt.pt", Onset(step=13), False,
                     id="stepless-hostile-by-inner-step"),
        pytest.param("last.pt", "epochs/last.pt", Onset(epoch=2.0), True,
                     id="stepless-by-inner-epoch"),
        pytest.param("model.safetensors", "", Onset(step=5, time=T0 + 1), False,
                     id="nothing-inside-before-onset-time"),
        pytest.param("model.safetensors", "", Onset(step=5, time=T0), True,
                     id="nothing-inside-at-onset-time"),
        pytest.param("model.safetensors", "", Onset(step=5), True,
                     id="nothing-inside-nothing-to-compare"),
        pytest.param("model.safetensors", "", Onset(), False, id="no-onset"),
    ],
)  # fmt: skip
def test_onset_by_step_epoch_or_time(
    tmp_path: Path, name: str, source: str, onset: Onset, after: bool
) -> None:
    if source:
        place(tmp_path / name, FIXTURES / source, T0)
    else:
        (tmp_path / name).write_bytes(safetensors_bytes())
        os.utime(tmp_path / name, (T0, T0))
    [checkpoint] = scan(tmp_path, onset=onset)
    assert (checkpoint.status is AFTER_ONSET) is after, checkpoint.reason
    assert (last_clean([checkpoint], onset) is None) is after


def test_epoch_named_checkpoint_is_never_a_step(tmp_path: Path) -> None:
    place(tmp_path / "epoch_3.pt", FIXTURES / "epochs" / "last.pt", T0)
    [checkpoint] = scan(tmp_path, onset=Onset(step=4))
    assert (checkpoint.step, checkpoint.epoch, checkpoint.status) == (None, 3, AFTER_ONSET)
    assert checkpoint.reason == (
        "nothing places it before the onset (no step or epoch, no onset time)"
    )


def test_stepless_file_reports_where_its_step_came_from(tmp_path: Path) -> None:
    place(tmp_path / "ckpt.pt", FIXTURES / "nanogpt" / "ckpt.pt", T0)
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes())
    by_name = {c.path.name: c for c in scan(tmp_path)}
    assert (by_name["ckpt.pt"].step, by_name["ckpt.pt"].placed_by) == (
        60, "content: iter_num in its pickle"
    )  # fmt: skip
    assert (by_name["model.safetensors"].step, by_name["model.safetensors"].placed_by) == (
        None, "time"
    )  # fmt: skip


def test_safetensors_metadata_step(tmp_path: Path) -> None:
    header = {
        "__metadata__": {"format": "pt", "global_step": "800"},
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    }
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(header))
    [checkpoint] = scan(tmp_path, onset_step=900)
    assert (checkpoint.step, checkpoint.status) == (800, CLEAN)
    assert checkpoint.placed_by == "content: global_step in its __metadata__"


def test_hidden_entries_quarantine_and_in_progress_are_never_checkpoints(tmp_path: Path) -> None:
    torch_zip_bytes(tmp_path / "model_step10.pt")
    (tmp_path / ".sentinel-kept").mkdir()
    torch_zip_bytes(tmp_path / ".sentinel-kept" / "ckpt.pt")
    torch_zip_bytes(tmp_path / ".ckpt.pt")
    (tmp_path / QUARANTINE_DIR).mkdir()
    torch_zip_bytes(tmp_path / QUARANTINE_DIR / "model_step20.pt")
    write_hf_checkpoint(tmp_path / "tmp-checkpoint-30")
    torch_zip_bytes(tmp_path / "model_step40.pt.tmp")
    torch_zip_bytes(tmp_path / "training_args.bin")
    (tmp_path / "version_0").mkdir()  # a number, no keyword, nothing a checkpoint holds
    (tmp_path / "version_0" / "metrics.csv").write_text("step,loss\n")
    assert [c.path.name for c in scan(tmp_path)] == ["model_step10.pt"]


def test_a_folder_without_a_step_in_its_name_that_holds_weights(tmp_path: Path) -> None:
    (tmp_path / "best").mkdir()
    place(tmp_path / "best" / "model.pt", FIXTURES / "plain" / "model_step40.pt", T0)
    [checkpoint] = scan(tmp_path)
    assert (checkpoint.step, checkpoint.status, checkpoint.layout) == (40, CLEAN, "plain")
    assert checkpoint.placed_by == "content: step in its pickle of model.pt"


def test_folder_mtime_is_its_newest_file(tmp_path: Path) -> None:
    write_hf_checkpoint(tmp_path / "checkpoint-10")
    for path in [tmp_path / "checkpoint-10", *(tmp_path / "checkpoint-10").iterdir()]:
        os.utime(path, (T0, T0))
    os.utime(tmp_path / "checkpoint-10" / "model.safetensors", (T0 + 50, T0 + 50))
    [checkpoint] = scan(tmp_path)
    assert checkpoint.mtime == T0 + 50


def test_newer_by_step_then_epoch_then_time(tmp_path: Path) -> None:
    place(tmp_path / "model_step20.pt", FIXTURES / "plain" / "model_step40.pt", T0 + 30)
    place(tmp_path / "model_step10.pt", FIXTURES / "plain" / "model_step40.pt", T0 + 40)
    place(tmp_path / "epoch_2.pt", FIXTURES / "epochs" / "last.pt", T0 + 10)
    place(tmp_path / "epoch_1.pt", FIXTURES / "epochs" / "last.pt", T0 + 20)
    by_name = {c.path.name: c for c in scan(tmp_path)}
    assert by_name["model_step20.pt"].is_newer_than(by_name["model_step10.pt"])  # step, not time
    assert by_name["epoch_2.pt"].is_newer_than(by_name["epoch_1.pt"])  # epoch, not time
    assert by_name["model_step10.pt"].is_newer_than(by_name["epoch_2.pt"])  # only time compares
    assert not by_name["model_step10.pt"].is_newer_than(by_name["model_step10.pt"])


def test_onset_step_keyword_still_works(tmp_path: Path) -> None:
    build_run(tmp_path)
    assert scan(tmp_path, onset_step=400) == scan(tmp_path, onset=Onset(step=400))
    assert last_clean(scan(tmp_path), onset_step=450) == last_clean(scan(tmp_path), Onset(step=450))


# -- sentinel checkpoints DIR -----------------------------------------------------------


def sentinel(*args: str) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS`` by ``main`` in this process (``tests.helpers.cli``); exit 0 or raise."""
    result = sentinel_here(*args, env=clean_env())
    result.check_returncode()
    return result


def every_layout(directory: Path) -> None:
    """One of each layout, oldest first, clean up to the epoch file; a cut DCP last."""
    shutil.copytree(FIXTURES / "deepspeed" / "global_step40", directory / "global_step10")
    write_hf_checkpoint(directory / "checkpoint-20")
    place(directory / "model_step30.pt", FIXTURES / "plain" / "model_step40.pt", T0)
    place(directory / "epoch=1-step=40.ckpt", FIXTURES / "lightning" / "last.ckpt", T0)
    shutil.copytree(FIXTURES / "dcp" / "step_40", directory / "step_50")
    place(directory / "ckpt.pt", FIXTURES / "nanogpt" / "ckpt.pt", T0)
    place(directory / "epoch_7.pt", FIXTURES / "epochs" / "last.pt", T0 + 100)
    shutil.copytree(FIXTURES / "dcp" / "step_40", directory / "step_70")
    (directory / "step_70" / "__0_0.distcp").unlink()
    for path in sorted(directory.rglob("*")):
        if path.name != "epoch_7.pt":
            os.utime(path, (T0, T0))


@pytest.mark.slow
def test_listing_shows_every_layout_and_the_resume_point(tmp_path: Path) -> None:
    every_layout(tmp_path)
    lines = sentinel("checkpoints", str(tmp_path)).stdout.splitlines()
    assert lines[0].split() == ["step", "status", "checkpoint", "layout", "reason"]
    rows = [line.split(None, 4) for line in lines[1:]]
    assert [row[:4] for row in rows] == [
        ["10", "clean", "global_step10", "deepspeed"],
        ["20", "clean", "checkpoint-20", "hf"],
        ["30", "clean", "model_step30.pt", "torch"],
        ["40", "clean", "epoch=1-step=40.ckpt", "lightning"],
        ["50", "clean", "step_50", "dcp"],
        ["60", "clean", "ckpt.pt", "torch"],
        ["70", "incomplete", "step_70", "dcp"],
        ["epoch=7", "clean", "epoch_7.pt", "torch"],
        ["pointer", "hf", "last", "checkpoint:"],  # HF's get_last_checkpoint: checkpoint-20
    ]
    assert rows[5][4] == "placed by content: iter_num in its pickle"
    assert rows[6][4] == "missing shard __0_0.distcp named in .metadata"
    marked = [row[2] for row in rows if "<- last clean: a rollback resumes here" in row[-1]]
    assert marked == ["epoch_7.pt"]


@pytest.mark.slow
def test_listing_json_keeps_its_keys_and_adds_epoch(tmp_path: Path) -> None:
    every_layout(tmp_path)
    listing = json.loads(sentinel("checkpoints", "--json", str(tmp_path)).stdout)
    assert listing["last_clean"] == str(tmp_path / "epoch_7.pt")
    first, *_, last = listing["checkpoints"]
    assert set(first) >= {"path", "step", "status", "reason", "epoch"}
    assert (first["step"], first["epoch"], first["layout"]) == (10, None, "deepspeed")
    assert (last["step"], last["epoch"], last["status"]) == (None, 7, "clean")


@pytest.mark.slow
def test_listing_says_when_nothing_is_clean(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-20").mkdir()
    out = sentinel("checkpoints", str(tmp_path)).stdout
    assert "no clean checkpoint: a rollback would have nothing to resume from" in out


def _stopped_at(state_dir: Path, onset_step: int, *, code: int | None) -> None:
    """The state dir a stop at ``onset_step`` leaves: still deciding (``code`` None), or final."""
    from sentinel.model.incidents import Incident
    from sentinel.model.records import Alert, Severity
    from sentinel.store import stop_intent, verdict

    alert = Alert("nan_inf", Severity.CRITICAL, "loss is nan", T0 + onset_step, step=onset_step)
    incident = Incident("run-1", "nan_inf", Severity.CRITICAL, T0, onset_step, T0 + onset_step)
    incident.alerts.append(alert)
    intent = stop_intent.StopIntent.begin(
        incident, restart=True, attempt=1, job=(4242, T0), signal="SIGTERM", grace_s=30.0,
        restarts={},
    )  # fmt: skip
    stop_intent.mark_stopping(state_dir, intent)
    if code is not None:
        verdict.write_final(
            state_dir, code, None, "nan_inf", onset_step, None, 1, T0, stop=intent.to_json()
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("code", "last"),
    [(None, "global_step20"), (90, "global_step20"), (91, "global_step40")],
    ids=["unfinished-stop", "gave-up", "rolled-back-and-resumed"],
)
def test_listing_never_calls_clean_what_a_stop_left_after_its_onset(
    tmp_path: Path, code: int | None, last: str
) -> None:
    ck, state = tmp_path / "ck", tmp_path / "state"
    for step in (20, 40):
        shutil.copytree(FIXTURES / "deepspeed" / "global_step40", ck / f"global_step{step}")
    _stopped_at(state, 30, code=code)
    out = sentinel("checkpoints", "--state-dir", str(state), str(ck)).stdout
    marked = [line.split()[2] for line in out.splitlines() if "<- last clean" in line]
    assert marked == [last], out
    listing = json.loads(
        sentinel("checkpoints", "--json", "--state-dir", str(state), str(ck)).stdout
    )
    statuses = {Path(c["path"]).name: c["status"] for c in listing["checkpoints"]}
    if code == 91:  # what the resumed job wrote since is its own, clean
        assert statuses["global_step40"] == "clean" and listing["onset"] is None
    else:
        assert statuses["global_step40"] == "after_onset", out
        assert "was not rolled back and resumed" in out


def test_an_empty_checkpoint_dir_while_the_one_beside_it_fills_is_named_once(
    tmp_path: Path,
) -> None:
    from sentinel.checkpoints.scan import EmptyDir

    typo, real = tmp_path / "run" / "ckpt", tmp_path / "run" / "checkpoints"
    write_hf_checkpoint(real / "checkpoint-10")
    watch = EmptyDir(typo, every_s=60.0)
    assert watch.look(0.0) == ""  # the first look notes what is beside it
    assert watch.look(30.0) == ""  # not due yet
    assert watch.look(61.0) == ""  # nothing new beside it: an old run's folder says nothing
    write_hf_checkpoint(real / "checkpoint-20")
    said = watch.look(122.0)
    assert said.startswith(f"--checkpoints {typo} holds no checkpoint, while {real} beside it")
    assert "gained checkpoint-20" in said and f"give --checkpoints {real}" in said
    write_hf_checkpoint(real / "checkpoint-30")
    assert watch.look(183.0) == ""  # said once


def test_a_checkpoint_dir_that_fills_is_no_typo(tmp_path: Path) -> None:
    from sentinel.checkpoints.scan import EmptyDir

    mine, other = tmp_path / "run" / "ckpt", tmp_path / "run" / "other"
    write_hf_checkpoint(other / "checkpoint-10")
    watch = EmptyDir(mine, every_s=1.0)
    watch.look(0.0)
    write_hf_checkpoint(mine / "checkpoint-10")
    write_hf_checkpoint(other / "checkpoint-20")
    assert watch.look(2.0) == ""


def test_accelerates_checkpoint_folders_count_saves_and_are_placed_by_time(tmp_path: Path) -> None:
    """accelerate's ``save_state`` with ``automatic_checkpoint_naming``, run for real:
    ``checkpoint_0``, ``_1``, ``_2`` number saves, not steps. Read as steps, save 2 (of step
    200, say) sat before an onset at step 100 and was resumed; placed by time, the ones
    written after the onset's time are after it."""
    import time

    torch = pytest.importorskip("torch")
    accelerate = pytest.importorskip("accelerate")
    from accelerate.utils import ProjectConfiguration

    project = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = accelerate.Accelerator(cpu=True, project_config=project)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    saved_at = []
    for _ in range(3):
        accelerator.save_state()
        saved_at.append(time.time())
        time.sleep(0.05)
    del model
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [f"checkpoint_{i}" for i in range(3)]
    onset = Onset(step=1, time=(saved_at[0] + saved_at[1]) / 2)
    found = {c.path.name: c for c in scan(folder, onset=onset)}
    assert {name: c.step for name, c in found.items()} == dict.fromkeys(found, None)
    assert found["checkpoint_0"].status == "clean"
    assert {found["checkpoint_1"].status, found["checkpoint_2"].status} == {"after_onset"}
    assert last_clean(list(found.values()), onset).path.name == "checkpoint_0"
    assert {c.layout for c in found.values()} == {"accelerate"}
    # A save the stop cut short: its weights, not yet its random states. Read by its name
    # it was step 3, before an onset at step 100, and was resumed (FileNotFoundError on
    # its optimizer.bin, three times, then a give-up).
    cut = folder / "checkpoint_3"
    cut.mkdir()
    shutil.copy(folder / "checkpoint_2" / "model.safetensors", cut)
    later = Onset(step=100, time=time.time() + 60)
    found = {c.path.name: c for c in scan(folder, onset=later)}
    assert (found["checkpoint_3"].step, found["checkpoint_3"].status) == (None, "incomplete")
    assert "random_states" in found["checkpoint_3"].reason
    assert last_clean(list(found.values()), later).path.name == "checkpoint_2"


def test_sentinels_own_folders_are_beside_a_dir_accelerate_lists_whole(tmp_path: Path) -> None:
    """accelerate's automatic naming sorts every entry of ``checkpoints/`` by the number in
    its name (a ``quarantine/`` there made its ``load_state()`` fail): sentinel's folders are
    beside such a dir, and stay there once made; any other dir holds its own."""
    from sentinel.checkpoints.scan import own_root

    hf = tmp_path / "out"
    write_hf_checkpoint(hf / "checkpoint-10")
    assert own_root(hf) == hf
    saves = tmp_path / "project" / "checkpoints"
    (saves / "notes").mkdir(parents=True)
    assert own_root(saves) == saves
    # By its name: the keeper stages a save at its first look, before accelerate wrote its
    # random_states_<rank>.pkl, and a .sentinel-kept/ made inside then would stay.
    (saves / "checkpoint_0").mkdir()
    beside = tmp_path / "project" / "checkpoints.sentinel"
    assert own_root(saves) == beside
    beside.mkdir()
    shutil.rmtree(saves / "checkpoint_0")  # a rollback set every one aside
    assert own_root(saves) == beside
    assert scan(tmp_path / "project") == []  # checkpoints.sentinel is no checkpoint


def test_a_number_after_checkpoint_is_what_the_file_holds_an_epoch_here(tmp_path: Path) -> None:
    """The PyTorch examples' style: ``checkpoint_{epoch}.pth`` holding ``{"epoch": epoch + 1,
    "state_dict": ...}`` and no step. Read as step 3, the save written after the NaN sat
    before an onset at step 160, was resumed, and was still listed as the last clean one
    after the give-up. What it holds says epoch: it compares with the log's epoch, and its
    own epoch's by time. HF's ``checkpoint-400`` (a trainer_state with its global step)
    stays a step."""
    import time

    torch = pytest.importorskip("torch")
    written = []
    for epoch in range(4):
        torch.save(
            {"epoch": epoch + 1, "state_dict": {"w": torch.zeros(2)}},
            tmp_path / f"checkpoint_{epoch}.pth",
        )
        written.append(time.time())
        time.sleep(0.02)
    onset = Onset(step=160, time=(written[2] + written[3]) / 2, epoch=4)
    found = {c.path.name: c for c in scan(tmp_path, onset=onset)}
    assert {n: (c.step, c.epoch) for n, c in found.items()} == {
        f"checkpoint_{e}.pth": (None, e + 1) for e in range(4)
    }
    assert found["checkpoint_3.pth"].status == "after_onset"
    assert last_clean(list(found.values()), onset).path.name == "checkpoint_2.pth"
    hf = write_hf_checkpoint(tmp_path / "hf" / "checkpoint-400")
    assert [c.step for c in scan(hf.parent)] == [400]


def test_of_a_save_in_two_files_the_weights_are_resumed(tmp_path: Path) -> None:
    """``model_{step:06d}.safetensors`` then ``optim_{step:06d}.pt`` each save: the resume
    named the optimizer's half (``optim_000130.pt``, written last), which a job that loads
    ``SENTINEL_RESUME_FROM`` as weights cannot use. The weights file is the one named."""
    import time

    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    for step in (120, 130):
        safetensors_torch.save_file(
            {"w": torch.zeros(2)}, tmp_path / f"model_{step:06d}.safetensors"
        )
        time.sleep(0.01)
        torch.save({"state": {}, "param_groups": []}, tmp_path / f"optim_{step:06d}.pt")
        time.sleep(0.01)
    found = scan(tmp_path, onset=Onset(step=131))
    clean = last_clean(found, Onset(step=131))
    assert clean is not None and clean.path.name == "model_000130.safetensors"
    assert last_clean(found, Onset(step=125)).path.name == "model_000120.safetensors"
    # A name that only contains "optim" is no optimizer's state: the weights of its save.
    torch.save({"w": torch.zeros(2)}, tmp_path / "model_optimized_000140.pt")
    time.sleep(0.01)
    torch.save({"state": {}, "param_groups": []}, tmp_path / "optim_000140.pt")
    found = scan(tmp_path, onset=Onset(step=150))
    assert last_clean(found, Onset(step=150)).path.name == "model_optimized_000140.pt"
