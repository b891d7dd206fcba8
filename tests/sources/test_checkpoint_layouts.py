"""Each layout judged by what it holds: DCP, DeepSpeed, HF Trainer, plain scripts, Lightning."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.checkpoints.scan import CheckpointStatus, scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
TORCH_FILE = FIXTURES / "plain" / "model_step40.pt"  # any small file torch.save wrote

CLEAN = CheckpointStatus.CLEAN
CORRUPT = CheckpointStatus.CORRUPT
INCOMPLETE = CheckpointStatus.INCOMPLETE
UNREADABLE = CheckpointStatus.UNREADABLE


def safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)


def only(directory: Path) -> tuple[CheckpointStatus, str, str]:
    [checkpoint] = scan(directory)
    return checkpoint.status, checkpoint.reason, checkpoint.layout


# -- PyTorch Distributed Checkpoint ---------------------------------------------------


def _dcp_as_written(d: Path) -> None:
    pass


def _dcp_shard_missing(d: Path) -> None:
    (d / "__0_0.distcp").unlink()


def _dcp_shard_short(d: Path) -> None:
    data = (d / "__0_0.distcp").read_bytes()
    (d / "__0_0.distcp").write_bytes(data[: len(data) // 2])


def _dcp_item_end_record_gone(d: Path) -> None:
    data = bytearray((d / "__0_0.distcp").read_bytes())
    at = data.index(b"PK\x05\x06")
    data[at : at + 4] = b"\0\0\0\0"
    (d / "__0_0.distcp").write_bytes(bytes(data))


def _dcp_no_metadata(d: Path) -> None:
    (d / ".metadata").unlink()


def _dcp_metadata_garbage(d: Path) -> None:
    (d / ".metadata").write_bytes(b"\x80\x04\x95garbage")


@pytest.mark.parametrize(
    ("change", "status", "reason_part"),
    [
        pytest.param(_dcp_as_written, CLEAN, "", id="as-written"),
        pytest.param(
            _dcp_shard_missing, INCOMPLETE, "missing shard __0_0.distcp named in .metadata",
            id="shard-missing",
        ),
        pytest.param(_dcp_shard_short, CORRUPT, "bytes, .metadata says", id="shard-short"),
        pytest.param(
            _dcp_item_end_record_gone, CORRUPT, "has no zip end record", id="item-cut"
        ),
        pytest.param(_dcp_no_metadata, INCOMPLETE, "no .metadata", id="metadata-not-yet"),
        pytest.param(_dcp_metadata_garbage, CORRUPT, ".metadata: ", id="metadata-garbage"),
    ],
)  # fmt: skip
def test_dcp(
    tmp_path: Path,
    change: Callable[[Path], None],
    status: CheckpointStatus,
    reason_part: str,
) -> None:
    shutil.copytree(FIXTURES / "dcp" / "step_40", tmp_path / "step_40")
    change(tmp_path / "step_40")
    found_status, reason, layout = only(tmp_path)
    assert (found_status, layout) == (status, "dcp"), reason
    assert reason_part in reason
    if status is CLEAN:
        assert reason == ""


# -- DeepSpeed ------------------------------------------------------------------------

ZERO = "zero_pp_rank_{}_mp_rank_00_optim_states.pt"


def _ds_as_written(d: Path) -> None:
    pass


def _ds_rank_1_missing(d: Path) -> None:
    (d / ZERO.format(1)).unlink()


def _ds_rank_0_missing(d: Path) -> None:
    (d / ZERO.format(0)).unlink()


def _ds_model_states_cut(d: Path) -> None:
    data = (d / "mp_rank_00_model_states.pt").read_bytes()
    (d / "mp_rank_00_model_states.pt").write_bytes(data[:-100])


def _ds_bf16_names(d: Path) -> None:
    for rank in (0, 1):
        (d / ZERO.format(rank)).rename(d / f"bf16_{ZERO.format(rank)}")


@pytest.mark.parametrize(
    ("change", "status", "reason_part"),
    [
        pytest.param(_ds_as_written, CLEAN, "", id="as-written"),
        pytest.param(_ds_bf16_names, CLEAN, "", id="bf16-names"),
        pytest.param(
            _ds_rank_1_missing, INCOMPLETE,
            "ZeRO optim-state files for rank(s) 1 of world size 2 missing", id="last-rank-missing",
        ),
        pytest.param(
            _ds_rank_0_missing, INCOMPLETE, "rank(s) 0 of world size 2", id="rank-0-missing"
        ),
        pytest.param(
            _ds_model_states_cut, CORRUPT, "mp_rank_00_model_states.pt: torch zip",
            id="model-states-cut",
        ),
    ],
)  # fmt: skip
def test_deepspeed(
    tmp_path: Path,
    change: Callable[[Path], None],
    status: CheckpointStatus,
    reason_part: str,
) -> None:
    shutil.copytree(FIXTURES / "deepspeed", tmp_path, dirs_exist_ok=True)
    change(tmp_path / "global_step40")
    found_status, reason, layout = only(tmp_path)  # "latest" is a pointer, not a checkpoint
    assert (found_status, layout) == (status, "deepspeed"), reason
    assert reason_part in reason


def test_deepspeed_ranks_without_world_size_must_run_from_zero(tmp_path: Path) -> None:
    d = tmp_path / "global_step7"
    d.mkdir()
    for rank in (0, 2):  # these files say no world size: the gap alone tells
        shutil.copy(TORCH_FILE, d / f"mp_rank_{rank:02d}_model_states.pt")
    status, reason, _ = only(tmp_path)
    assert status is INCOMPLETE
    assert reason == "model-parallel files for rank(s) 1 missing"


# -- HF Trainer against plain scripts ---------------------------------------------------


def _files(*names: str) -> Callable[[Path], None]:
    def build(d: Path) -> None:
        d.mkdir()
        for name in names:
            if name.endswith(".safetensors"):
                safetensors(d / name)
            elif name.endswith(".json"):
                (d / name).write_text('{"global_step": 20}')
            else:
                shutil.copy(TORCH_FILE, d / name)

    return build


@pytest.mark.parametrize(
    ("name", "build", "status", "layout", "reason_part"),
    [
        pytest.param(
            "checkpoint-20", _files("model.pt"), CLEAN, "plain", "", id="plain-script-hf-name"
        ),
        pytest.param(
            "checkpoint-20", _files("model.pt", "optimizer.pt"), CLEAN, "plain", "",
            id="plain-script-with-optimizer",
        ),
        pytest.param(
            "step_20", _files("config.json", "model.safetensors"), CLEAN, "plain", "",
            id="save-pretrained",
        ),
        pytest.param(
            "checkpoint-20", _files("config.json", "model.safetensors"), INCOMPLETE, "hf",
            "missing trainer_state.json", id="hf-being-written",
        ),
        pytest.param(
            "step_20", _files("model.safetensors", "training_args.bin"), INCOMPLETE, "hf",
            "missing trainer_state.json", id="hf-training-args",
        ),
        pytest.param(
            "checkpoint-20", _files("pytorch_model.bin", "rng_state_0.pth"), INCOMPLETE, "hf",
            "missing trainer_state.json", id="hf-rng-state",
        ),
        pytest.param(
            "checkpoint-20", _files("model.safetensors", "trainer_state.json"), CLEAN, "hf", "",
            id="hf-complete",
        ),
    ],
)  # fmt: skip
def test_framework_rules_only_for_that_framework(
    tmp_path: Path,
    name: str,
    build: Callable[[Path], None],
    status: CheckpointStatus,
    layout: str,
    reason_part: str,
) -> None:
    build(tmp_path / name)
    found_status, reason, found_layout = only(tmp_path)
    assert (found_status, found_layout) == (status, layout), reason
    assert reason_part in reason


def test_hf_trainer_state_that_does_not_parse_is_corrupt(tmp_path: Path) -> None:
    _files("model.safetensors", "trainer_state.json")(tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-20" / "trainer_state.json").write_text('{"global_step": 2')
    assert only(tmp_path) == (CORRUPT, "trainer_state.json is not JSON", "hf")


def test_plain_folder_with_a_broken_weights_file_is_corrupt(tmp_path: Path) -> None:
    _files("model.pt")(tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-20" / "model.pt").write_bytes(TORCH_FILE.read_bytes()[:500])
    status, reason, _ = only(tmp_path)
    assert status is CORRUPT
    assert reason.startswith("model.pt: torch zip archive unreadable")


def test_megatron_iteration_folder_is_judged_by_its_files(tmp_path: Path) -> None:
    (tmp_path / "iter_0000040" / "mp_rank_00").mkdir(parents=True)
    shutil.copy(TORCH_FILE, tmp_path / "iter_0000040" / "mp_rank_00" / "model_optim_rng.pt")
    [checkpoint] = scan(tmp_path)
    assert (checkpoint.step, checkpoint.status, checkpoint.layout) == (40, CLEAN, "plain")


# -- Lightning --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "status", "reason"),
    [
        pytest.param("last.ckpt", CLEAN, "", id="complete"),
        pytest.param(
            "no_state_dict.ckpt", INCOMPLETE,
            "no_state_dict.ckpt: Lightning checkpoint without state_dict", id="no-state-dict",
        ),
    ],
)  # fmt: skip
def test_lightning_keys(
    tmp_path: Path, fixture: str, status: CheckpointStatus, reason: str
) -> None:
    shutil.copy(FIXTURES / "lightning" / fixture, tmp_path / fixture)
    assert only(tmp_path) == (status, reason, "lightning")
    [checkpoint] = scan(tmp_path)
    assert (checkpoint.step, checkpoint.epoch) == (30, 2)


# -- sentinel cannot tell -----------------------------------------------------------------


def test_a_file_that_cannot_be_read_is_unreadable_not_corrupt(tmp_path: Path) -> None:
    # A symlink loop: stat fails with ELOOP even for root, as an I/O error would.
    (tmp_path / "checkpoint-20").mkdir()
    os.symlink("model.pt", tmp_path / "checkpoint-20" / "model.pt")
    os.symlink("model_step30.pt", tmp_path / "model_step30.pt")
    found = scan(tmp_path)
    assert [(c.path.name, c.step, c.status) for c in found] == [
        ("checkpoint-20", 20, UNREADABLE),
        ("model_step30.pt", 30, UNREADABLE),
    ]
    assert all("symbolic links" in c.reason for c in found)


# -- a file of no format sentinel knows -----------------------------------------------------


def test_a_step_named_file_of_text_is_no_weights_and_binary_stays_clean(tmp_path: Path) -> None:
    """A ``checkpoint-800`` that is a note, or a symlink to ``/etc/passwd``, was listed clean
    and named the one a rollback resumes; a binary file of no format sentinel knows (Flax's
    msgpack ``checkpoint_900``, a torch file saved without a suffix) is still clean, and so
    is a state kept as text: JSON, a protocol-0 pickle, a table of numbers (oos47). A note
    in Latin-1 or UTF-16 is a note too."""
    saves, elsewhere = tmp_path / "saves", tmp_path / "etc"
    saves.mkdir()
    elsewhere.mkdir()
    (elsewhere / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.symlink(elsewhere / "passwd", saves / "checkpoint-850")
    (saves / "checkpoint-800").write_text("the good run, see notes\n")
    (saves / "checkpoint-810").write_text("step: 810\nlr: 0.001\n")
    (saves / "checkpoint-820").write_bytes("Résumé: la bonne exécution\n".encode("latin-1"))
    (saves / "checkpoint-830").write_text("Notes du modèle\r\n", encoding="utf-16")
    (saves / "checkpoint_900").write_bytes(b"\x82\xa6params\x81\xa1w\xc4\x04\x00\x00\x80?")
    shutil.copy(TORCH_FILE, saves / "checkpoint-950")
    (saves / "checkpoint-400").write_text(json.dumps({"step": 400, "w": [0.5, -1.25]}))
    (saves / "step_126").write_bytes(pickle.dumps({"w": [0.5, 1.5], "step": 126}, protocol=0))
    (saves / "step_220").write_text("# w\n5.000000000000000000e-01 -1.25e+00\n3.0 nan\n")
    found = {c.path.name: (c.status, c.reason) for c in scan(saves)}
    assert found["checkpoint-800"] == (CORRUPT, "checkpoint-800: a text file, not weights")
    assert found["checkpoint-810"] == (CORRUPT, "checkpoint-810: a text file, not weights")
    assert found["checkpoint-850"] == (CORRUPT, "checkpoint-850: a text file, not weights")
    # Notes of other encodings: Latin-1, and UTF-16 as Windows' Notepad saves it.
    assert found["checkpoint-820"] == (CORRUPT, "checkpoint-820: a text file, not weights")
    assert found["checkpoint-830"] == (CORRUPT, "checkpoint-830: a text file, not weights")
    for name in ("checkpoint_900", "checkpoint-950", "checkpoint-400", "step_126", "step_220"):
        assert found[name][0] is CLEAN, (name, found[name])
