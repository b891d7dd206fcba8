"""The training step or epoch a checkpoint's name carries, as people name them.

A keyword before the number says what it counts: ``checkpoint-40``, ``global_step40``,
``model_step40.pt``, ``ckpt_40.pt``, ``iter_0000040`` (steps); ``epoch_3.pt``,
``epoch=3.ckpt`` (epochs, never read as a step; so is the number of Keras's
``model_06.keras`` and ``w_06.weights.h5``, its ``{epoch}``); Lightning's ``epoch=2-step=4500.ckpt``
(both); or after it, where none comes before it (ESPnet's ``3epoch.pth``,
``model_1000_steps.pt``). Lightning's SLURM saves (``hpc_ckpt_3.ckpt``) count saves, not
steps: their place comes from what they hold. Without a keyword the last number that
stands as its own token is the step (``model-1200.pt``), except shard numbers
(``model-00001-of-00003``), version suffixes (``-v1``), dates (``20240501``,
``2024-05-01``) and the number after ``rank``, ``shard``, ``seed`` and similar words. A
number glued to letters (``resnet50.pth``, ``gpt2.pt``) is part of a model's name, not a
step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Longest first: "x.pth.tar" is a torch file, not a ".tar".
CHECKPOINT_SUFFIXES = (
    ".safetensors", ".pth.tar", ".pt.tar", ".pt", ".pth", ".bin", ".ckpt", ".zip", ".keras",
    ".weights.h5", ".hdf5", ".h5",
)  # fmt: skip
#: Keras 3's whole-model file (a zip), which ``ModelCheckpoint`` names by its 1-based
#: ``{epoch}`` (``model_06.keras``): a number with no keyword is its epoch, never a step.
KERAS_SUFFIX = ".keras"
#: Keras's HDF5 files (``ModelCheckpoint(save_weights_only=True)``'s ``w_06.weights.h5``,
#: ``BackupAndRestore``'s ``latest.weights.h5``, Keras 2's ``.h5``/``.hdf5``): numbered by
#: its ``{epoch}`` as a ``.keras`` file is.
HDF5_SUFFIXES = (".weights.h5", ".hdf5", ".h5")
SAFETENSORS_SUFFIX = ".safetensors"
#: A zip is a checkpoint only when its name carries a step: Stable-Baselines3's
#: ``CheckpointCallback`` saves ``rl_model_512_steps.zip``; a ``dataset.zip`` is no checkpoint.
_ZIP_SUFFIX = ".zip"

_STEP_KEYED = re.compile(
    r"(?<![a-z])(?:global[_-]?steps?|steps?|iter|iteration|checkpoint|ckpt)[-_=]?(\d+)(?![0-9a-z])"
)
#: Step keywords that say only that the file is a checkpoint (``NamePosition.generic``).
_GENERIC_KEYS = ("checkpoint", "ckpt")
_EPOCH_KEYED = re.compile(r"(?<![a-z])epochs?[-_=]?(\d+)(?![0-9a-z])")
# The keyword after the number: ESPnet's ``3epoch.pth``, ``model_1000_steps.pt``.
_STEP_AFTER = re.compile(r"(?<![0-9a-z])(\d+)[-_]?steps?(?![0-9a-z])")
_EPOCH_AFTER = re.compile(r"(?<![0-9a-z])(\d+)[-_]?epochs?(?![0-9a-z])")
_VERSION_SUFFIX = re.compile(r"[-_.]v\d+$")
# Lightning's hpc_save numbers its saves 1, 2, 3...: a counter, not a training step.
_SAVE_COUNTER = re.compile(r"^hpc_ckpt_\d+$")
_SHARD = re.compile(r"\d+-of-\d+")
_TOKEN_SPLIT = re.compile(r"[-_.=\s]+")
# The number after these words counts something other than training progress.
_NOT_A_STEP_AFTER = frozenset(
    {"rank", "shard", "part", "of", "mp", "pp", "tp", "dp", "world", "gpu", "node", "seed"}
)
_IN_PROGRESS_PREFIXES = ("tmp-", "tmp_", "tmp.", "temp-", "temp_")
_IN_PROGRESS_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".incomplete", ".lock")


@dataclass(frozen=True)
class NamePosition:
    """Where a name places a checkpoint in training: its step, its epoch, or neither."""

    step: int | None = None
    epoch: int | None = None
    keyed: bool = False  # a keyword said what the number counts (not the last-number guess)
    #: The keyword was ``checkpoint`` or ``ckpt``, which says it is a checkpoint, not what its
    #: number counts: HF's ``checkpoint-400`` is a step, a loop's ``checkpoint_3.pth`` an
    #: epoch. What it holds (a step, an epoch) tells, where it holds one.
    generic: bool = False


def checkpoint_suffix(name: str) -> str:
    """Return the checkpoint file suffix ``name`` ends with (e.g. ``.pt``), or "" (a zip
    whose name carries no step: see ``_ZIP_SUFFIX``)."""
    lowered = name.lower()
    suffix = next((s for s in CHECKPOINT_SUFFIXES if lowered.endswith(s)), "")
    if suffix == _ZIP_SUFFIX:
        stem = lowered[: -len(suffix)]
        if not (_STEP_KEYED.search(stem) or _STEP_AFTER.search(stem)):
            return ""
    return suffix


def is_in_progress(name: str) -> bool:
    """Whether ``name`` is a temporary name a writer renames when done (``tmp-checkpoint-5``)."""
    lowered = name.lower()
    return lowered.startswith(_IN_PROGRESS_PREFIXES) or lowered.endswith(_IN_PROGRESS_SUFFIXES)


def is_shard(name: str) -> bool:
    """Whether ``name`` is one shard of a checkpoint (``model-00001-of-00003.safetensors``)."""
    return bool(_SHARD.search(name))


def position_of(name: str) -> NamePosition:
    """Return the step and epoch that a checkpoint file or directory name carries."""
    suffix = checkpoint_suffix(name)
    stem = name[: len(name) - len(suffix)] if suffix else name
    if not suffix and "." in stem.lstrip("."):
        return NamePosition()  # "trainer_state.json", "model-12.txt": not a checkpoint's name
    if is_shard(stem) or is_in_progress(name):
        return NamePosition()
    if _SAVE_COUNTER.match(stem):
        return NamePosition(keyed=True)  # the number is known, and known not to be a step
    stem = _VERSION_SUFFIX.sub("", stem.lower())
    keyed = [m for m in _STEP_KEYED.finditer(stem) if not _is_date_token(m.group(1))]
    steps = [m.group(1) for m in keyed] or _STEP_AFTER.findall(stem)
    epochs = _EPOCH_KEYED.findall(stem) or _EPOCH_AFTER.findall(stem)
    if steps or epochs:
        generic = bool(keyed) and not epochs and keyed[-1].group(0).startswith(_GENERIC_KEYS)
        return NamePosition(
            step=int(steps[-1]) if steps else None,
            epoch=int(epochs[-1]) if epochs else None,
            keyed=True,
            generic=generic,
        )
    if suffix == KERAS_SUFFIX or suffix in HDF5_SUFFIXES:
        return NamePosition(epoch=_last_number(stem))
    return NamePosition(step=_last_number(stem))


def step_of(name: str) -> int | None:
    """Return the training step a checkpoint file or directory name carries, or None."""
    return position_of(name).step


def _last_number(stem: str) -> int | None:
    tokens = [t for t in _TOKEN_SPLIT.split(stem) if t]
    numbers: list[int] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        date_tokens = _date_length(tokens, index)
        if date_tokens:
            index += date_tokens
            if index < len(tokens) and _is_time(tokens[index]):
                index += 1
            continue
        after_word = index > 0 and tokens[index - 1] in _NOT_A_STEP_AFTER
        if token.isdigit() and not after_word:
            numbers.append(int(token))
        index += 1
    return numbers[-1] if numbers else None


def _date_length(tokens: list[str], index: int) -> int:
    """How many tokens from ``index`` spell a date (20240501, or 2024 05 01), else 0."""
    token = tokens[index]
    if _is_date_token(token):
        return 1
    parts = tokens[index : index + 3]
    if len(parts) == 3 and len(token) == 4 and all(p.isdigit() for p in parts):
        return 3 if _is_date(*parts) else 0
    return 0


def _is_date_token(token: str) -> bool:
    return len(token) == 8 and token.isdigit() and _is_date(token[:4], token[4:6], token[6:])


def _is_date(year: str, month: str, day: str) -> bool:
    return 1990 <= int(year) <= 2099 and 1 <= int(month) <= 12 and 1 <= int(day) <= 31


def _is_time(token: str) -> bool:
    return len(token) in (4, 6) and token.isdigit() and int(token[:2]) < 24 and int(token[2:4]) < 60
