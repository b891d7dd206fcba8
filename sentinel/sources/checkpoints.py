"""Checkpoint directory scanning: find checkpoints, read their step, judge their integrity.

Integrity checks read headers and zip central directories only, never a whole
weights file: checkpoints are gigabytes and the scan runs while the job writes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

QUARANTINE_DIR = "quarantine"

WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt"})
TORCH_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt"})

# safetensors itself refuses headers above 100 MB; anything larger is garbage.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
# Only this deep below a checkpoint directory are weights files checked
# (HF + DeepSpeed nests one level: checkpoint-N/global_stepN/*.pt).
MAX_DIR_DEPTH = 3

HF_WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
)

_PICKLE_PROTOCOL_PREFIXES = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")

_STEP_PATTERNS = (
    re.compile(r"^checkpoint-(?P<step>\d+)$"),
    re.compile(r"^global_step(?P<step>\d+)$"),
    re.compile(r"^step[_-](?P<step>\d+)(?:\.(?:pt|pth|safetensors|ckpt|bin))?$"),
    re.compile(r"^epoch=\d+-step=(?P<step>\d+)(?:-v\d+)?\.ckpt$"),
    re.compile(r"^.+-(?P<step>\d+)\.(?:pt|pth|safetensors|ckpt)$"),
)
# "model-00001-of-00003.safetensors" is a shard of one checkpoint, not step 3.
_SHARD_NAME = re.compile(r"-\d+-of-\d+\.[a-z]+$")


class CheckpointStatus(StrEnum):
    """Whether a checkpoint can be resumed from."""

    CLEAN = "clean"
    CORRUPT = "corrupt"
    INCOMPLETE = "incomplete"
    AFTER_ONSET = "after_onset"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint (a file or a directory) found in the checkpoint directory."""

    path: Path
    step: int
    status: CheckpointStatus
    reason: str
    mtime: float


def step_of(name: str) -> int | None:
    """Return the training step a checkpoint file or directory name carries, or None."""
    if _SHARD_NAME.search(name):
        return None
    for pattern in _STEP_PATTERNS:
        match = pattern.match(name)
        if match:
            return int(match.group("step"))
    return None


def scan(directory: Path, *, onset_step: int | None = None) -> list[Checkpoint]:
    """List the checkpoints directly inside ``directory``, sorted by step, with a status each.

    A missing directory gives an empty list; the quarantine folder is never a checkpoint.
    """
    root = Path(os.path.abspath(directory))
    try:
        entries = list(os.scandir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    found: list[Checkpoint] = []
    for entry in entries:
        if entry.name == QUARANTINE_DIR:
            continue
        step = step_of(entry.name)
        if step is None:
            continue
        path = root / entry.name
        try:
            mtime = entry.stat().st_mtime
        except FileNotFoundError:
            continue  # removed between listing and stat (the job's own rotation)
        status, reason = _judge(path, entry.name, step, onset_step)
        found.append(Checkpoint(path, step, status, reason, mtime))
    found.sort(key=lambda c: (c.step, c.mtime, c.path.name))
    return found


def last_clean(
    checkpoints: Sequence[Checkpoint], onset_step: int | None = None
) -> Checkpoint | None:
    """Return the newest clean checkpoint written before ``onset_step`` (any step if None)."""
    candidates = [
        c
        for c in checkpoints
        if c.status is CheckpointStatus.CLEAN and (onset_step is None or c.step < onset_step)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c.step, c.mtime))


def _judge(
    path: Path, name: str, step: int, onset_step: int | None
) -> tuple[CheckpointStatus, str]:
    if onset_step is not None and step >= onset_step:
        return CheckpointStatus.AFTER_ONSET, f"step {step} >= onset step {onset_step}"
    try:
        if path.is_dir():
            return _judge_dir(path, name)
        problem = _check_file(path)
    except OSError as exc:
        return CheckpointStatus.CORRUPT, f"{name}: unreadable: {exc.strerror or exc}"
    if problem:
        return CheckpointStatus.CORRUPT, f"{name}: {problem}"
    return CheckpointStatus.CLEAN, ""


def _judge_dir(path: Path, name: str) -> tuple[CheckpointStatus, str]:
    files = list(_walk_files(path))
    if not files:
        return CheckpointStatus.INCOMPLETE, "empty directory"
    indexes = [f for f in files if f.name.endswith(".index.json")]
    for file in files:
        if file.suffix in WEIGHT_SUFFIXES:
            problem = _check_file(file)
        elif file in indexes:
            problem = _check_shard_index(file)
        else:
            continue
        if problem:
            return CheckpointStatus.CORRUPT, f"{file.relative_to(path).as_posix()}: {problem}"
    missing = _missing_shards(path, indexes) or _missing_required(path, name)
    if missing:
        return CheckpointStatus.INCOMPLETE, missing
    return CheckpointStatus.CLEAN, ""


def _walk_files(path: Path) -> Iterator[Path]:
    base_depth = len(path.parts)
    for dirpath, dirnames, filenames in os.walk(path):
        current = Path(dirpath)
        if len(current.parts) - base_depth >= MAX_DIR_DEPTH:
            dirnames.clear()
        dirnames.sort()
        for filename in sorted(filenames):
            yield current / filename


def _missing_required(path: Path, name: str) -> str:
    if name.startswith("checkpoint-"):
        if not (path / "trainer_state.json").is_file():
            return "missing trainer_state.json"
        if not _has_hf_weights(path):
            return "missing weights (model.safetensors, pytorch_model.bin, shard index, adapter)"
    elif name.startswith("global_step") and not _has_deepspeed_states(path):
        return "missing DeepSpeed *model_states.pt / *optim_states.pt"
    return ""


def _has_hf_weights(path: Path) -> bool:
    if any((path / weights).is_file() for weights in HF_WEIGHT_FILES):
        return True
    if any(path.glob("*.index.json")):
        return True
    # HF Trainer under DeepSpeed may keep the weights only in its global_stepN subfolder.
    return any(_has_deepspeed_states(sub) for sub in path.glob("global_step*") if sub.is_dir())


def _has_deepspeed_states(path: Path) -> bool:
    return any(path.glob("*model_states.pt")) or any(path.glob("*optim_states.pt"))


def _check_file(path: Path) -> str:
    """Return what is wrong with one weights file, or "" when it parses."""
    size = path.stat().st_size
    if size == 0:
        return "empty file"
    if path.suffix == ".safetensors":
        return _check_safetensors(path, size)
    if path.suffix in TORCH_SUFFIXES:
        return _check_torch(path, size)
    return ""


def _check_safetensors(path: Path, size: int) -> str:
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            return f"file of {size} bytes is shorter than the 8-byte header length"
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len == 0 or header_len > MAX_SAFETENSORS_HEADER_BYTES:
            return f"header length {header_len} is not sane"
        if 8 + header_len > size:
            return f"header length {header_len} exceeds file size {size}"
        raw = handle.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return "header is not JSON"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    data_size = size - 8 - header_len
    max_end = 0
    for tensor_name, info in header.items():
        if tensor_name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            return f"tensor {tensor_name!r} has invalid data_offsets {offsets!r}"
        if offsets[1] > data_size:
            return (
                f"tensor {tensor_name!r} ends at {offsets[1]} beyond the "
                f"{data_size} data bytes (truncated)"
            )
        max_end = max(max_end, offsets[1])
    if max_end != data_size:
        return f"tensors end at {max_end} but the file holds {data_size} data bytes"
    return ""


def _check_torch(path: Path, size: int) -> str:
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic[:2] in _PICKLE_PROTOCOL_PREFIXES:
        return ""  # legacy (pre-1.6) torch.save: a bare pickle stream, no index to verify
    if not magic.startswith(b"PK"):
        return "neither a torch zip archive nor a legacy pickle"
    try:
        # ZipFile reads the end record and the central directory only.
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"zip member {info.filename!r} extends past the end of the file"
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError) as exc:
        return f"torch zip archive unreadable: {exc}"
    return ""


def _shard_names(index_path: Path) -> list[str] | None:
    """Return the shard files a ``*.index.json`` names, or None when it does not parse."""
    try:
        index = json.loads(index_path.read_bytes())
    except (UnicodeDecodeError, ValueError):
        return None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return None
    return sorted({str(shard) for shard in weight_map.values()})


def _check_shard_index(path: Path) -> str:
    if _shard_names(path) is None:
        return "shard index is not JSON with a weight_map object"
    return ""


def _missing_shards(path: Path, indexes: Sequence[Path]) -> str:
    for index_path in indexes:
        for shard in _shard_names(index_path) or ():
            if not (index_path.parent / shard).is_file():
                rel = index_path.relative_to(path).as_posix()
                return f"{rel}: missing shard {shard} named in weight_map"
    return ""
