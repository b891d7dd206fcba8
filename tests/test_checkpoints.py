"""Tests for checkpoint scanning and integrity, over real files in tmp_path."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.sources.checkpoints import (
    QUARANTINE_DIR,
    Checkpoint,
    CheckpointStatus,
    last_clean,
    scan,
    step_of,
)

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
