"""Judge one checkpoint by what it holds; a framework's rules only for that framework's own.

Every weights file found must parse (:mod:`sentinel.checkpoints.files`) and
every shard a ``*.index.json`` names must be there. Beyond that:

- HF Trainer (``trainer_state.json`` or ``training_args.bin`` present; or HF's weight
  names beside ``optimizer.pt``, ``scheduler.pt`` or ``rng_state*.pth``; or a
  ``checkpoint-<N>`` folder holding ``config.json`` and HF's weight names): needs a
  ``trainer_state.json`` that parses (written last) and its weights.
- DeepSpeed (``*model_states.pt`` / ``*optim_states.pt``): the ranks run from 0
  without a gap, and where the model states say ``dp_world_size`` / ``mp_world_size``,
  that many ranks are there.
- PyTorch Distributed Checkpoint (``.metadata`` and ``*.distcp``): ``.metadata`` is
  there (DCP writes it last) and every file it names holds the bytes it says.
- Lightning (a ``.ckpt`` whose pickle has ``pytorch-lightning_version``): it also
  holds ``state_dict``, ``global_step`` and ``epoch``.

Anything else (``checkpoint-20/model.pt`` from a plain script) is complete when its
weights parse; a folder with no weights file sentinel knows is not set aside.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sentinel.checkpoints.files import (
    LIGHTNING_VERSION_KEY,
    Content,
    check_weights,
    lightning_problem,
    read_content,
    text_problem,
)
from sentinel.checkpoints.names import (
    HDF5_SUFFIXES,
    KERAS_SUFFIX,
    SAFETENSORS_SUFFIX,
    checkpoint_suffix,
)
from sentinel.checkpoints.torch_pickle import (
    STEP_KEYS,
    PickleWalkError,
    instances_of,
    int_under,
    top_level,
    torch_object,
    walk,
)
from sentinel.model.untrusted import json_value

# Only this deep below a checkpoint directory are files checked
# (HF + DeepSpeed nests one level: checkpoint-N/global_stepN/*.pt).
MAX_DIR_DEPTH = 3
DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"

HF_WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
)
_HF_TRAINER_FILES = ("optimizer.pt", "scheduler.pt")
_DS_MODEL = re.compile(r"^(?:.*_)?mp_rank_(?P<mp>\d+)_model_states\.pt$")
_DS_ZERO = re.compile(
    r"^(?:bf16_)?zero_pp_rank_(?P<dp>\d+)_mp_rank_(?P<mp>\d+)_(?P<kind>optim|model)_states\.pt$"
)
_ZIP_LOCAL_HEADER = b"PK\x03\x04"
_ZIP_END_RECORD = b"PK\x05\x06"
_ZIP_END_RECORD_BYTES = 22


class CheckpointStatus(StrEnum):
    """Whether a checkpoint can be resumed from."""

    CLEAN = "clean"
    CORRUPT = "corrupt"
    INCOMPLETE = "incomplete"
    UNREADABLE = "unreadable"
    AFTER_ONSET = "after_onset"


@dataclass(frozen=True)
class Verdict:
    """A checkpoint's status, why, and the layout it was judged as."""

    status: CheckpointStatus
    reason: str
    layout: str


def walk_files(path: Path) -> Iterator[Path]:
    """Yield the files under ``path`` to :data:`MAX_DIR_DEPTH`, sorted; ``OSError`` propagates."""
    base_depth = len(path.parts)

    def fail(exc: OSError) -> None:
        raise exc

    for dirpath, dirnames, filenames in os.walk(path, onerror=fail):
        current = Path(dirpath)
        if len(current.parts) - base_depth >= MAX_DIR_DEPTH:
            dirnames.clear()
        dirnames.sort()
        for filename in sorted(filenames):
            yield current / filename


def holds_checkpoint(path: Path) -> bool:
    """Whether a directory holds, directly, something only a checkpoint holds."""
    with os.scandir(path) as entries:
        names = [entry.name for entry in entries]
    return any(
        name in (DCP_METADATA, "trainer_state.json")
        or (not name.startswith(".") and (checkpoint_suffix(name) or name.endswith(DCP_SUFFIX)))
        for name in names
    )


#: accelerate's ``save_state`` with ``automatic_checkpoint_naming``: ``checkpoint_<i>`` folders
#: numbered by save (0, 1, 2...), never by step, each with the random states of its processes.
ACCELERATE_SAVES = re.compile(r"checkpoint_\d+")
#: What accelerate's ``save_state`` writes last but for the objects registered for it.
RANDOM_STATES = "random_states_"


#: Folders beside one that ``counts_saves`` looks into at most.
SAVES_LOOKED = 4


def counts_saves(path: Path) -> bool:
    """Whether the number in a checkpoint folder's name counts saves, not steps: accelerate's
    ``checkpoint_<i>`` holding its ``random_states_<rank>.pkl``, or, a save cut short before
    that file, beside such folders. Read as a step, save 7 (step 200 of a run that saves
    every 25) sorted before an onset at step 100 and was resumed; so was one the stop cut
    short, with no ``random_states`` yet to tell it by."""
    if ACCELERATE_SAVES.fullmatch(path.name) is None:
        return False
    return holds_random_states(path) or _beside_saves(path)


def holds_random_states(path: Path) -> bool:
    """Whether ``path`` holds accelerate's ``random_states_<rank>.pkl`` (its saves all do)."""
    try:
        with os.scandir(path) as entries:
            return any(entry.name.startswith(RANDOM_STATES) for entry in entries)
    except OSError:
        return False


def _beside_saves(path: Path) -> bool:
    looked = 0
    try:
        with os.scandir(path.parent) as entries:
            for entry in entries:
                if entry.name == path.name or not ACCELERATE_SAVES.fullmatch(entry.name):
                    continue
                if holds_random_states(Path(entry.path)):
                    return True
                looked += 1
                if looked >= SAVES_LOOKED:
                    return False
    except OSError:
        return False
    return False


def layout_of(path: Path) -> str:
    """Name the layout of a checkpoint without judging it (hf, dcp, torch, ...)."""
    if path.is_dir():
        return _layout(path)
    suffix = checkpoint_suffix(path.name)
    if suffix == KERAS_SUFFIX:
        return "keras"
    if suffix in HDF5_SUFFIXES:
        return "hdf5"
    return "safetensors" if suffix == SAFETENSORS_SUFFIX else "torch" if suffix else "unknown"


def judge_file(path: Path, content: Content | None = None) -> Verdict:
    """Judge a checkpoint that is one file; ``content`` is what :func:`read_content` found."""
    suffix = checkpoint_suffix(path.name)
    layout = layout_of(path)
    problem = check_weights(path)
    if not problem and not suffix:
        # No format to check: a note or a symlink to /etc/passwd was listed clean, and a
        # rollback would have resumed it.
        problem = text_problem(path)
    if problem:
        return Verdict(CheckpointStatus.CORRUPT, f"{path.name}: {problem}", layout)
    if suffix == ".ckpt" and content is None:
        content = read_content(path)
    if content is not None and LIGHTNING_VERSION_KEY in content.keys:
        missing = lightning_problem(content)
        if missing:
            return Verdict(CheckpointStatus.INCOMPLETE, f"{path.name}: {missing}", "lightning")
        return Verdict(CheckpointStatus.CLEAN, "", "lightning")
    return Verdict(CheckpointStatus.CLEAN, "", layout)


def judge_dir(path: Path) -> Verdict:
    """Judge a checkpoint that is a directory."""
    files = list(walk_files(path))
    layout = _layout(path)
    if not files:
        return Verdict(CheckpointStatus.INCOMPLETE, "empty directory", layout)
    indexes = [f for f in files if f.name.endswith(".index.json")]
    for file in files:
        # A file sentinel cannot open makes the checkpoint unreadable (PermissionError up to
        # the scan), whatever it holds: what cannot be checked is not trusted.
        os.close(os.open(file, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
        if file.name.endswith(DCP_SUFFIX):
            continue  # judged against .metadata below
        if checkpoint_suffix(file.name):
            problem = check_weights(file)
        elif file in indexes and _shard_names(file) is None:
            problem = "shard index is not JSON with a weight_map object"
        else:
            continue
        if problem:
            rel = file.relative_to(path).as_posix()
            return Verdict(CheckpointStatus.CORRUPT, f"{rel}: {problem}", layout)
    verdict = _missing_shards(path, indexes)
    if verdict is None:
        verdict = _LAYOUT_RULES.get(layout, _no_rules)(path)
    if verdict is None:
        known = layout != "plain" or any(checkpoint_suffix(f.name) for f in files)
        note = "" if known else "no weights file sentinel knows: nothing to check"
        return Verdict(CheckpointStatus.CLEAN, note, layout)
    status, reason = verdict
    return Verdict(status, reason, layout)


def dir_content(path: Path) -> Content:
    """Return the step or epoch a directory's own files hold (trainer_state, weights)."""
    state = _trainer_state(path)
    if isinstance(state, dict):
        mapping = {k: v for k, v in state.items() if isinstance(k, str)}
        step = int_under(mapping, STEP_KEYS)
        if step:
            return Content(step=step[1], where=f"{step[0]} in trainer_state.json")
    for file in sorted(path.iterdir()):
        if file.is_file() and checkpoint_suffix(file.name):
            content = read_content(file)
            if content.step is not None or content.epoch is not None:
                return Content(content.step, content.epoch, f"{content.where} of {file.name}")
    return Content()


def _layout(path: Path) -> str:
    with os.scandir(path) as entries:
        names = {entry.name for entry in entries}
    if counts_saves(path):
        return "accelerate"
    if DCP_METADATA in names or any(n.endswith(DCP_SUFFIX) for n in names):
        return "dcp"
    if _is_hf_trainer(path, names):
        return "hf"
    if any(_DS_MODEL.match(n) or _DS_ZERO.match(n) for n in names) or (
        path.name.startswith("global_step")
    ):
        return "deepspeed"
    return "plain"


def _is_hf_trainer(path: Path, names: set[str]) -> bool:
    if "trainer_state.json" in names or "training_args.bin" in names:
        return True
    hf_weights = any(n in HF_WEIGHT_FILES or n.endswith(".index.json") for n in names)
    if not hf_weights:
        return False
    beside = any(n in _HF_TRAINER_FILES or n.startswith("rng_state") for n in names)
    return beside or (path.name.startswith("checkpoint-") and "config.json" in names)


_Finding = tuple[CheckpointStatus, str]


def _no_rules(path: Path) -> _Finding | None:
    return None


def _hf_rules(path: Path) -> _Finding | None:
    state_file = path / "trainer_state.json"
    if not state_file.is_file():
        return CheckpointStatus.INCOMPLETE, "missing trainer_state.json"
    if _trainer_state(path) is None:
        return CheckpointStatus.CORRUPT, "trainer_state.json is not JSON"
    if not _has_hf_weights(path):
        return (
            CheckpointStatus.INCOMPLETE,
            "missing weights (model.safetensors, pytorch_model.bin, shard index, adapter)",
        )
    for sub in sorted(path.glob("global_step*")):
        if sub.is_dir():
            finding = _deepspeed_rules(sub)
            if finding is not None:
                return finding[0], f"{sub.name}/: {finding[1]}"
    return None


def _has_hf_weights(path: Path) -> bool:
    if any((path / weights).is_file() for weights in HF_WEIGHT_FILES):
        return True
    if any(path.glob("*.index.json")):
        return True
    # HF Trainer under DeepSpeed may keep the weights only in its global_stepN subfolder.
    return any(_deepspeed_rules(sub) is None for sub in path.glob("global_step*") if sub.is_dir())


def _trainer_state(path: Path) -> object:
    try:
        return json_value((path / "trainer_state.json").read_bytes())
    except FileNotFoundError:
        return {}
    except (UnicodeDecodeError, ValueError):
        return None


def _deepspeed_rules(path: Path) -> _Finding | None:
    model_ranks: set[int] = set()
    zero_ranks: dict[str, set[int]] = {}
    first_model: Path | None = None
    for file in sorted(path.iterdir()):
        if match := _DS_ZERO.match(file.name):
            zero_ranks.setdefault(match["kind"], set()).add(int(match["dp"]))
            model_ranks.add(int(match["mp"]))
            if match["kind"] == "model" and first_model is None:
                first_model = file
        elif match := _DS_MODEL.match(file.name):
            model_ranks.add(int(match["mp"]))
            first_model = first_model or file
    if not model_ranks:
        return CheckpointStatus.INCOMPLETE, "missing DeepSpeed *model_states.pt / *optim_states.pt"
    sizes = _world_sizes(first_model) if first_model is not None else {}
    gap = _rank_gap("model-parallel", model_ranks, sizes.get("mp_world_size"))
    for kind, ranks in sorted(zero_ranks.items()):
        gap = gap or _rank_gap(f"ZeRO {kind}-state", ranks, sizes.get("dp_world_size"))
    return (CheckpointStatus.INCOMPLETE, gap) if gap else None


def _world_sizes(model_states: Path) -> dict[str, int]:
    try:
        mapping = top_level(torch_object(model_states))
    except PickleWalkError:
        return {}
    sizes = {}
    for key in ("dp_world_size", "mp_world_size"):
        found = int_under(mapping, (key,))
        if found and found[1] > 0:
            sizes[key] = found[1]
    return sizes


def _rank_gap(what: str, ranks: set[int], world_size: int | None) -> str:
    expected = world_size if world_size is not None else max(ranks) + 1
    missing = sorted(set(range(expected)) - ranks)
    if missing:
        size = f" of world size {world_size}" if world_size is not None else ""
        return f"{what} files for rank(s) {_ranks(missing)}{size} missing"
    return ""


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def _dcp_rules(path: Path) -> _Finding | None:
    metadata = path / DCP_METADATA
    if not metadata.is_file():
        return (
            CheckpointStatus.INCOMPLETE,
            "no .metadata: DCP writes it last, so the save is unfinished",
        )
    try:
        tree = walk(metadata.read_bytes())
    except PickleWalkError as exc:
        return CheckpointStatus.CORRUPT, f".metadata: {exc}"
    extents: dict[str, list[tuple[int, int, bool]]] = {}
    for info in instances_of(tree, "_StorageInfo"):
        state = top_level(info.state)
        relative, offset, length = (state.get(k) for k in ("relative_path", "offset", "length"))
        if not (isinstance(relative, str) and isinstance(offset, int) and isinstance(length, int)):
            return CheckpointStatus.CORRUPT, f".metadata: storage entry {state!r} is not readable"
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            return CheckpointStatus.CORRUPT, f".metadata names a file outside: {relative!r}"
        plain = state.get("transform_descriptors") is None
        extents.setdefault(relative, []).append((offset, length, plain))
    if not extents:
        return CheckpointStatus.CORRUPT, ".metadata names no storage file"
    for relative, items in sorted(extents.items()):
        finding = _dcp_file(path / relative, relative, items)
        if finding is not None:
            return finding
    return None


def _dcp_file(file: Path, relative: str, items: list[tuple[int, int, bool]]) -> _Finding | None:
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        return CheckpointStatus.INCOMPLETE, f"missing shard {relative} named in .metadata"
    end = max(offset + length for offset, length, _ in items)
    if size < end:
        return CheckpointStatus.CORRUPT, f"{relative}: {size} bytes, .metadata says {end}"
    with file.open("rb") as handle:
        for offset, length, plain in items:
            if not plain or length < _ZIP_END_RECORD_BYTES + len(_ZIP_LOCAL_HEADER):
                continue
            handle.seek(offset)
            if handle.read(len(_ZIP_LOCAL_HEADER)) != _ZIP_LOCAL_HEADER:
                continue  # not a torch.save item (safetensors format): its length was checked
            handle.seek(offset + length - _ZIP_END_RECORD_BYTES)
            if handle.read(len(_ZIP_END_RECORD)) != _ZIP_END_RECORD:
                return (
                    CheckpointStatus.CORRUPT,
                    f"{relative}: the item at offset {offset} has no zip end record",
                )
    return None


def _accelerate_rules(path: Path) -> _Finding | None:
    if holds_random_states(path):
        return None
    return (
        CheckpointStatus.INCOMPLETE,
        f"no {RANDOM_STATES}<rank>.pkl: accelerate's save_state writes it last, so this save"
        " was cut short",
    )


_LAYOUT_RULES = {
    "hf": _hf_rules,
    "deepspeed": _deepspeed_rules,
    "dcp": _dcp_rules,
    "accelerate": _accelerate_rules,
}


def _shard_names(index_path: Path) -> list[str] | None:
    """Return the shard files a ``*.index.json`` names, or None when it does not parse."""
    try:
        index = json_value(index_path.read_bytes())
    except (UnicodeDecodeError, ValueError):
        return None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return None
    return sorted({str(shard) for shard in weight_map.values()})


def _missing_shards(path: Path, indexes: Sequence[Path]) -> _Finding | None:
    for index_path in indexes:
        for shard in _shard_names(index_path) or ():
            if not (index_path.parent / shard).is_file():
                rel = index_path.relative_to(path).as_posix()
                reason = f"{rel}: missing shard {shard} named in weight_map"
                return CheckpointStatus.INCOMPLETE, reason
    return None
