"""The words every parser shares: ``Garbled``, the ``ParseFn`` contract, metric names, steps, times.

A format module imports this, never the package (whose ``__init__`` loads every format).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from sentinel.model.records import Sample


class Garbled(ValueError):
    """The line is clearly in a parser's format but broken; the caller counts and skips it."""


ParseFn = Callable[[str], list[Sample] | None]


class LineFormat(Protocol):
    """A line format that needs an earlier line (a header, an epoch line): one instance
    per parser, fed that parser's stripped lines in order, made with no arguments.
    ``parse`` is a ``ParseFn``: the line's samples (maybe none; a header gives none),
    None for a line in another format."""

    def __init__(self) -> None: ...

    def parse(self, text: str) -> list[Sample] | None: ...


#: Lower-cased names, as written in logs, mapped to the canonical metric name.
ALIASES: dict[str, str] = {
    "train_loss": "loss",
    "train/loss": "loss",
    "training_loss": "loss",
    "loss/train": "loss",
    "total_loss": "loss",
    "reduced_train_loss": "loss",  # NeMo: the step's loss, averaged over data-parallel ranks
    "loss_train": "loss",  # "Loss Train: 1.23", LitGPT's "loss train: 1.23"
    "xent": "loss",  # OpenNMT-py: the cross-entropy it trains on, beside acc and ppl
    "loss_training": "loss",  # detectron2, YOLOX: the sum of the loss terms they log beside it
    "grad_norm": "grad_norm",
    "grad-norm": "grad_norm",
    "gradnorm": "grad_norm",
    "grad_norm/total": "grad_norm",
    "optim/total_grad_norm": "grad_norm",  # OLMo's
    "train/crossentropyloss": "loss",  # OLMo's training loss (beside train/ZLoss)
    "train/grad_norm": "grad_norm",
    "gnorm": "grad_norm",
    "gradient_norm": "grad_norm",
    "lr": "lr",
    "learning_rate": "lr",
    "train/learning_rate": "lr",
    "train/lr": "lr",
    "train_lr": "lr",  # DINO, DeiT and MAE log.txt (beside train_loss)
    "train_learning_rate": "lr",  # Flax's ImageNet example (CLU's metric writer)
    "lr/pg0": "lr",  # Ultralytics: the first parameter group's
    "current_lr": "lr",  # Coqui's trainer
    "current_lr_0": "lr",  # Coqui's trainer, its first optimizer's (a GAN's: two)
    "amp_scaler": "loss_scale",  # Coqui's trainer: the fp16 GradScaler's scale
    "fp16_grad_scale": "loss_scale",  # insightface's arcface_torch: its GradScaler's scale
    "grad_scale": "loss_scale",  # icefall's (k2) trainer, vall-e, ESPnet2: the same
    "tokens_per_sec": "tokens_per_sec",
    "tok/s": "tokens_per_sec",
    "tokens/s": "tokens_per_sec",
    "tokens_per_second": "tokens_per_sec",
    "train/tokens_per_second": "tokens_per_sec",
    "throughput": "tokens_per_sec",
    "eval_loss": "eval_loss",
    "val_loss": "eval_loss",
    "eval/loss": "eval_loss",
    "validation_loss": "eval_loss",
    "val/loss": "eval_loss",
    "valid_loss": "eval_loss",
    "loss_val": "eval_loss",
    "loss_valid": "eval_loss",
    "loss_validation": "eval_loss",
    "loss_eval": "eval_loss",
    "loss_test": "test_loss",
}

#: Field names (lower-cased) that carry the step rather than a metric, most specific first.
STEP_KEYS: tuple[str, ...] = ("step", "global_step", "iteration", "iter")
#: Every name a logged record or line gives its step under (lower-cased), most specific
#: first: ``STEP_KEYS`` and the counts of updates of fairseq and others.
RECORD_STEP_KEYS: tuple[str, ...] = (
    *STEP_KEYS,
    "num_updates",
    "updates",
    "current_steps",  # LLaMA-Factory's trainer_log.jsonl
    "steps",
    "global step",
    "global_step/max_steps",  # ms-swift: "601/2161"
    "total_timesteps",  # an RL run's environment steps (stable-baselines' progress.csv)
    "steps_done",  # the PyTorch DQN tutorial's count of environment steps
    "time/total_timesteps",
)
#: Field names (lower-cased) that carry the data's own timestamp.
TIME_KEYS: tuple[str, ...] = ("time", "timestamp", "ts", "wall_time")

# Above these, an epoch timestamp is in milliseconds, microseconds, nanoseconds.
EPOCH_MS = 1e11
_EPOCH_US = 1e14
_EPOCH_NS = 1e17

MAX_STEP = 1 << 63


#: Where a camel-case name's words meet (``TrainLoss``: before the ``L``).
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


@functools.lru_cache(maxsize=4096)
def normalise_name(name: str) -> str:
    """The canonical metric name for a name as logged: ``train/loss`` -> ``loss``."""
    stripped = name.strip()
    lowered = stripped.lower()
    alias = ALIASES.get(lowered)
    if alias is not None:
        return alias
    if lowered != stripped and (camel := _CAMEL_BOUNDARY.sub("_", stripped).lower()) in ALIASES:
        return ALIASES[camel]  # ``TrainLoss``, ``ValLoss``, ``gradNorm``: as their snake case
    if lowered.startswith("train/") and len(lowered) > len("train/"):
        return lowered[len("train/") :]
    if lowered.startswith(("main/", "validation/main/")) and lowered[-1] != "/":
        # Chainer's reports: the model its ``main`` optimizer trains (``main/loss``), and
        # the ``Evaluator``'s ``validation/`` run of it (``validation/main/loss``).
        rest = normalise_name(lowered.rpartition("main/")[2])
        return f"eval_{rest}" if lowered[0] == "v" else rest
    if "-" in lowered:
        # MXNet's ``Train-Perplexity``, ``Validation-accuracy``: the split's name, a hyphen.
        split, _, rest = lowered.partition("-")
        if split == "train" and rest:
            return normalise_name(rest)
        if split == "validation" and rest:
            return normalise_name(f"eval_{rest}")
    return lowered


def as_float(value: object) -> float | None:
    """A metric value as a float: numbers and numeric strings ("nan", "2.5"); else None."""
    kind = type(value)
    if kind is float:
        return value  # type: ignore[return-value]
    if kind is int or kind is str:
        try:
            return float(value)  # type: ignore[arg-type]
        except (ValueError, OverflowError):
            return None
    return None


def as_step(value: object) -> int | None:
    """A step as an int: ints, integral floats and their strings, below 2**63, and the
    first of a string's ``N/M`` (ms-swift's ``"global_step/max_steps": "601/2161"``); else
    None.

    The bound: no run counts that far, and orjson returns larger integers as
    floats, so without it a huge step would depend on the JSON library.
    """
    kind = type(value)
    if kind is int:
        return _bounded_step(value)  # type: ignore[arg-type]
    if kind is str:
        try:
            return _bounded_step(int(value))  # type: ignore[call-overload]
        except ValueError:
            if "/" in value:  # type: ignore[operator]
                done, _, _ = value.partition("/")  # type: ignore[attr-defined]
                return as_step(done.strip()) if done.strip().isdigit() else None
    number = as_float(value)
    if number is None or not math.isfinite(number) or not number.is_integer():
        return None
    return _bounded_step(int(number))


def _bounded_step(step: int) -> int | None:
    return step if -MAX_STEP < step < MAX_STEP else None


def as_epoch_seconds(value: object) -> float | None:
    """A timestamp as epoch seconds: numbers (s, ms, us, ns) or ISO-8601 strings; else None.

    A naive ISO timestamp is read as UTC, so the result never depends on the
    machine's time zone.
    """
    number = as_float(value)
    if number is None and isinstance(value, str):
        return iso_to_epoch_seconds(value)
    if number is None or not math.isfinite(number):
        return None
    magnitude = abs(number)
    if magnitude >= _EPOCH_NS:
        return number / 1e9
    if magnitude >= _EPOCH_US:
        return number / 1e6
    if magnitude >= EPOCH_MS:
        return number / 1e3
    return number


def iso_to_epoch_seconds(text: str) -> float | None:
    """An ISO-8601 date-time (``2024-05-01 12:00:01,5Z``) as epoch seconds; None if unreadable."""
    try:
        moment = datetime.fromisoformat(text.strip().replace(",", "."))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


class EpochBatches:
    """The step of a log that names the epoch and the batch within it, but not the batches
    an epoch has (ESPnet's ``2epoch:train:1-10batch``, ``Epoch 1, Batch 100``): the batches
    of the epochs before plus the line's batch.

    An epoch's batches are taken from the last batch its lines reached (one whose batches
    are not a multiple of the print interval counts a few short: the step stays in order, a
    little behind). A log that starts after its first epoch (0 or 1: loops count from
    either) cannot tell the epochs before: ``step`` is None there, or, ``from_any_epoch``,
    the batches since the first epoch the log shows began (an excerpt's own count, in
    order, under the run's: its lines each at a step of their own, not all at one).
    """

    __slots__ = ("_epoch", "_from_any", "_known", "_last", "_offset")

    def __init__(self, *, from_any_epoch: bool = False) -> None:
        self._epoch: int | None = None  # the epoch of the last line
        self._offset = 0  # the batches of the epochs before it
        self._last = 0  # the last batch its lines reached
        self._known = False  # whether the log began at its first epoch
        self._from_any = from_any_epoch

    def step(self, epoch: int, batch: int) -> int | None:
        """The step of ``batch`` in ``epoch``; None where the epochs before are unknown
        (unless ``from_any_epoch``)."""
        if epoch != self._epoch:
            counting = self._known or self._from_any
            if counting and self._epoch is not None and epoch == self._epoch + 1:
                self._offset += self._last
            else:
                self._known, self._offset = epoch <= 1, 0
            self._epoch, self._last = epoch, 0
        self._last = max(self._last, batch)
        return self._offset + batch if self._known or self._from_any else None

    def epoch_end(self, epoch: int) -> int | None:
        """The step of ``epoch``'s last line so far; None for another epoch, or unknown."""
        counting = self._known or self._from_any
        return self._offset + self._last if counting and epoch == self._epoch else None
