"""Parsers: one line of log text in, metric samples out.

A parser is a pure function of one line (no I/O, no clock, no state) with the
``ParseFn`` contract:

- it returns ``None`` when the line is not in its format (try the next parser);
- it returns a list, maybe empty, when it recognised the line: its samples;
- it raises ``Garbled`` when the line clearly is its format but broken (a
  truncated JSON object). Nothing else may escape a parser.

``LineParser`` auto-detects the format of each line, tries user regexes first,
and counts what it could not read.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sentinel.records import Sample

logger = logging.getLogger(__name__)


class Garbled(ValueError):
    """The line is clearly in a parser's format but broken; the caller counts and skips it."""


ParseFn = Callable[[str], list[Sample] | None]

#: Lower-cased names, as written in logs, mapped to the canonical metric name.
ALIASES: dict[str, str] = {
    "train_loss": "loss",
    "train/loss": "loss",
    "training_loss": "loss",
    "loss/train": "loss",
    "grad_norm": "grad_norm",
    "grad-norm": "grad_norm",
    "gradnorm": "grad_norm",
    "grad_norm/total": "grad_norm",
    "train/grad_norm": "grad_norm",
    "gnorm": "grad_norm",
    "lr": "lr",
    "learning_rate": "lr",
    "train/learning_rate": "lr",
    "train/lr": "lr",
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
}

#: Field names (lower-cased) that carry the step rather than a metric, most specific first.
STEP_KEYS: tuple[str, ...] = ("step", "global_step", "iteration", "iter")
#: Field names (lower-cased) that carry the data's own timestamp.
TIME_KEYS: tuple[str, ...] = ("time", "timestamp", "ts", "wall_time")

# Above these, an epoch timestamp is in milliseconds, microseconds, nanoseconds.
_EPOCH_MS = 1e11
_EPOCH_US = 1e14
_EPOCH_NS = 1e17

_DIGIT = re.compile(r"\d")
_MAX_STEP = 1 << 63


@functools.lru_cache(maxsize=4096)
def normalise_name(name: str) -> str:
    """The canonical metric name for a name as logged: ``train/loss`` -> ``loss``."""
    lowered = name.strip().lower()
    alias = ALIASES.get(lowered)
    if alias is not None:
        return alias
    if lowered.startswith("train/") and len(lowered) > len("train/"):
        return lowered[len("train/") :]
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
    """A step as an int: ints, integral floats and their strings, below 2**63; else None.

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
            pass
    number = as_float(value)
    if number is None or not math.isfinite(number) or not number.is_integer():
        return None
    return _bounded_step(int(number))


def _bounded_step(step: int) -> int | None:
    return step if -_MAX_STEP < step < _MAX_STEP else None


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
    if magnitude >= _EPOCH_MS:
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


# The format modules import the names above, so they are imported after them.
from sentinel.parsers import hf_trainer, jsonl, keyvalue, tqdm  # noqa: E402
from sentinel.parsers.files import FileReader  # noqa: E402
from sentinel.parsers.regex import UserRegex, compile_regexes, parse_with_regexes  # noqa: E402

#: Built-in parsers by name, in the order auto-detection tries them.
PARSERS: dict[str, ParseFn] = {
    "jsonl": jsonl.parse_jsonl,
    "hf_trainer": hf_trainer.parse_hf_dict,
    "tqdm": tqdm.parse_tqdm,
    "keyvalue": keyvalue.parse_keyvalue,
}


@dataclass(slots=True)
class ParseStats:
    """Counts of lines by outcome; ``lines == parsed + garbled + unparsed``.

    ``errors`` counts lines on which a parser raised something other than
    ``Garbled`` (a bug, logged with its traceback); they are also in ``garbled``.
    """

    lines: int = 0
    parsed: int = 0
    garbled: int = 0
    unparsed: int = 0
    errors: int = 0


class LineParser:
    """Auto-detects each line's format and turns it into samples; counts what it could not read."""

    def __init__(
        self, *, regexes: Sequence[str] = (), enabled: Sequence[str] | None = None
    ) -> None:
        names = list(PARSERS) if enabled is None else list(enabled)
        unknown = [name for name in names if name not in PARSERS]
        if unknown:
            raise ValueError(
                f"unknown parser(s) {', '.join(map(repr, unknown))}; known: {', '.join(PARSERS)}"
            )
        self.stats = ParseStats()
        self._regexes: tuple[UserRegex, ...] = compile_regexes(regexes)
        # "{" lines go to JSON (which falls back to the HF dict form) or to HF alone.
        self._brace: ParseFn | None = None
        if "jsonl" in names:
            self._brace = jsonl.parse_jsonl
        elif "hf_trainer" in names:
            self._brace = hf_trainer.parse_hf_dict
        self._human: tuple[ParseFn, ...] = tuple(
            PARSERS[name] for name in ("tqdm", "keyvalue") if name in names
        )
        # User regexes come first, so with any the fast path is off.
        self._brace_fast = self._brace is not None and not self._regexes
        self._fast_loads = jsonl.fast_loads if self._brace is jsonl.parse_jsonl else None
        #: Whether JSON lines may be read many at once (``parsers.columns``): only when
        #: they read as JSON, with no user regex in front.
        self.reads_json_blocks = self._brace is jsonl.parse_jsonl and not self._regexes
        #: Whether HF Trainer output may be read many lines at once (``parsers.hf_blocks``):
        #: its dicts by the brace parser and its bars by tqdm's, with no user regex in front.
        self.reads_hf_blocks = (
            self._brace is not None and not self._regexes and self._human[:1] == (tqdm.parse_tqdm,)
        )

    def parse(self, text: str) -> list[Sample]:
        """The samples in one line; an empty list for plain text or a garbled line."""
        stats = self.stats
        stats.lines += 1
        if self._brace_fast and text[:1] == "{":
            fast_loads = self._fast_loads
            if fast_loads is not None and text[1:2] != "'":
                # _parse_brace's orjson case inlined (a metrics file is all such lines):
                # a whole line that orjson decodes to an object.
                try:
                    decoded = fast_loads(text)
                except ValueError:
                    decoded = None
                if type(decoded) is dict:
                    read = jsonl.samples_from_mapping(decoded)
                    if read:
                        stats.parsed += 1
                    else:
                        stats.unparsed += 1
                    return read
            found = self._parse_brace(text)
            if found is not None:
                return found
        if "\r" not in text:
            return self._counted(self._parse_segment, text) or []
        samples: list[Sample] = []
        garbled = False
        for segment in text.split("\r"):
            try:
                samples.extend(self._parse_segment(segment))
            except Garbled:
                garbled = True
            except Exception:
                self._bug(segment)
                return []
        if garbled:
            stats.garbled += 1
        elif samples:
            stats.parsed += 1
        else:
            stats.unparsed += 1
        return samples

    def _counted(self, parse: ParseFn, text: str) -> list[Sample] | None:
        """``parse(text)``, counted in the stats: a garbled line or a parser's bug gives
        an empty list; None (the parser declines the line) is passed on uncounted."""
        stats = self.stats
        try:
            found = parse(text)
        except Garbled:
            stats.garbled += 1
            return []
        except Exception:
            self._bug(text)
            return []
        if found:
            stats.parsed += 1
        elif found is not None:
            stats.unparsed += 1
        return found

    def _parse_brace(self, text: str) -> list[Sample] | None:
        """Fast path for a line that starts with ``{``: a JSON object or an HF dict, the
        lines of a metrics file. Counted; None sends the line down the full path.

        The full path would reach the same parser after stripping and splitting the
        line and trying other forms; here a JSON line is decoded in place, and other
        ``{`` lines go straight to the brace parser.
        """
        stats = self.stats
        if text[1:2] != "'" and self._brace is jsonl.parse_jsonl:
            try:
                decoded, end = jsonl.decode_prefix(text)
            except Exception:
                decoded, end = None, 0
            if type(decoded) is dict and (end == len(text) or text[end:].isspace()):
                samples = jsonl.samples_from_mapping(decoded)
                if samples:
                    stats.parsed += 1
                else:
                    stats.unparsed += 1
                return samples
        if "\r" in text:
            return None  # a progress bar's redraws may hide in it: split it first
        # An HF dict is what parse_jsonl would hand on to parse_hf_dict anyway.
        parse = hf_trainer.parse_hf_dict if text[1:2] == "'" else self._brace
        assert parse is not None
        return self._counted(parse, text)

    def parse_with(self, reader: FileReader, text: str) -> list[Sample]:
        """One line of a structured file, read by its file's own reader; counted like ``parse``."""
        self.stats.lines += 1
        return self._counted(reader.parse, text) or []

    def _parse_segment(self, text: str) -> list[Sample]:
        """One ``\\r``-free piece of a line; raises ``Garbled``."""
        stripped = text.strip()
        if not stripped:
            return []
        if self._regexes:
            found = parse_with_regexes(self._regexes, stripped)
            if found:
                return found
        if stripped[0] == "{" and self._brace is not None:
            found = self._brace(stripped)
            if found is not None:
                return found
        if stripped[-1] == "}" and self._brace is not None:
            # A dict glued to the end of a progress bar: with stdout buffered, the HF
            # Trainer's first dict after a flush lands right after tqdm's bar text.
            brace = stripped.find("{")
            found = self._brace(stripped[brace:]) if brace > 0 else None
            if found is not None:
                return self._parse_segment(stripped[:brace]) + found
        if not _has_digit(stripped):
            return []
        for parse in self._human:
            found = parse(stripped)
            if found is not None:
                return found
        return []

    def _bug(self, text: str) -> None:
        """Count a parser's unexpected exception; log the first one's traceback."""
        self.stats.garbled += 1
        self.stats.errors += 1
        if self.stats.errors == 1:
            logger.exception("a parser failed on line %r (a bug; line skipped)", text[:200])


def _has_digit(text: str) -> bool:
    """Whether the text contains an ASCII digit; cheap gate before the human-line regexes."""
    return _DIGIT.search(text) is not None


__all__ = [
    "ALIASES",
    "PARSERS",
    "STEP_KEYS",
    "TIME_KEYS",
    "Garbled",
    "LineParser",
    "ParseFn",
    "ParseStats",
    "as_epoch_seconds",
    "as_float",
    "as_step",
    "iso_to_epoch_seconds",
    "normalise_name",
]
