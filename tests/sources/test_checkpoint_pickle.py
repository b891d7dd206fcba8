"""The inert pickle walk, on files torch.save wrote and on a pickle that would run code."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sentinel.checkpoints.files import read_content
from sentinel.checkpoints.scan import CheckpointStatus, scan
from sentinel.checkpoints.torch_pickle import (
    Global,
    Instance,
    PickleWalkError,
    top_level,
    torch_object,
    walk,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
EVIL = FIXTURES / "evil" / "ckpt.pt"
MARKER = "sentinel-pickle-ran"


@pytest.mark.parametrize(
    ("fixture", "step", "epoch", "key"),
    [
        pytest.param("plain/model_step40.pt", 40, None, "step", id="plain-step"),
        pytest.param("nanogpt/ckpt.pt", 60, None, "iter_num", id="nanogpt-iter_num"),
        pytest.param("epochs/last.pt", None, 3, "epoch", id="epoch-only"),
        pytest.param("legacy/model.pt", 70, None, "global_step", id="legacy-stream"),
        pytest.param("lightning/last.ckpt", 30, 2, "global_step", id="lightning"),
        pytest.param(
            "deepspeed/global_step40/mp_rank_00_model_states.pt", 40, None, "global_steps",
            id="deepspeed-model-states",
        ),
    ],
)  # fmt: skip
def test_step_read_from_files_torch_save_wrote(
    fixture: str, step: int | None, epoch: int | None, key: str
) -> None:
    content = read_content(FIXTURES / fixture)
    assert (content.step, content.epoch) == (step, epoch)
    assert content.where == f"{key} in its pickle"


def test_walk_keeps_structure_and_names_tensor_rebuilds_without_building_them() -> None:
    mapping = top_level(torch_object(FIXTURES / "plain" / "model_step40.pt"))
    assert set(mapping) == {"model", "optimizer", "step"}
    weight = top_level(mapping["model"])["weight"]
    assert isinstance(weight, Instance)
    assert weight.factory == Global("torch._utils", "_rebuild_tensor_v2")


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_walk_reads_every_protocol(protocol: int) -> None:
    data = pickle.dumps(
        {"step": 5, "nested": [1, (2, 3.5)], "flag": True, "none": None, "s": {1}}, protocol
    )
    mapping = top_level(walk(data))
    assert mapping["step"] == 5
    assert mapping["nested"] == [1, (2, 3.5)]
    assert (mapping["flag"], mapping["none"]) == (True, None)


def test_a_bool_is_not_a_step(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ckpt/data.pkl", pickle.dumps({"step": True, "epoch": 4}, 2))
    content = read_content(path)
    assert (content.step, content.epoch) == (None, 4)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x80\x02}q\x00(X\x04\x00\x00\x00step", id="cut-short"),
        pytest.param(b"not a pickle at all", id="text"),
        pytest.param(b"\x80\x02h\x07.", id="unset-memo"),
    ],
)
def test_walk_refuses_what_is_not_a_whole_pickle(data: bytes) -> None:
    with pytest.raises(PickleWalkError):
        walk(data)


def test_evil_fixture_really_runs_code_when_unpickled(tmp_path: Path) -> None:
    """The control: plain unpickling of the fixture's data.pkl creates the marker."""
    code = (
        "import pickle, sys, zipfile\n"
        "z = zipfile.ZipFile(sys.argv[1])\n"
        "pickle.loads(z.read(next(n for n in z.namelist() if n.endswith('data.pkl'))))\n"
    )
    subprocess.run([sys.executable, "-c", code, str(EVIL)], cwd=tmp_path, check=True)
    assert (tmp_path / MARKER).exists()


def test_evil_pickle_is_walked_without_running_and_still_gives_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    mapping = top_level(torch_object(EVIL))
    payload = mapping["payload"]
    assert isinstance(payload, Instance)
    assert payload.factory == Global("posix", "system")
    assert payload.args == (f"touch {MARKER}",)
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "ckpt.pt").write_bytes(EVIL.read_bytes())
    [checkpoint] = scan(tmp_path / "ckpts")
    assert (checkpoint.step, checkpoint.placed_by) == (12, "content: step in its pickle")
    assert checkpoint.status is CheckpointStatus.CLEAN
    assert not (tmp_path / MARKER).exists()


@pytest.mark.slow  # importing torch takes seconds
def test_real_torch_save_reads_back(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch not installed")
    torch.save({"model": {"w": torch.zeros(2)}, "global_step": 1234}, tmp_path / "last.pt")
    content = read_content(tmp_path / "last.pt")
    assert (content.step, content.where) == (1234, "global_step in its pickle")
