"""Records of named values (a decoded JSON object, an HF log dict) and their samples.

``loads`` and ``decode_prefix`` decode JSON with orjson when it is installed
(the ``fast`` extra), else with the stdlib; ``samples_from_mapping`` turns one
record into samples. ``jsonl`` and ``hf_trainer`` both build on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sentinel.model.records import PROGRESS, Sample
from sentinel.parsing.values import (
    EPOCH_MS,
    MAX_STEP,
    RECORD_STEP_KEYS,
    TIME_KEYS,
    as_epoch_seconds,
    as_step,
    normalise_name,
)

#: Which library decodes JSON: "orjson" when it is installed (the ``fast`` extra), else "json".
JSON_LIBRARY: str
try:
    import orjson  # type: ignore[import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    JSON_LIBRARY = "json"
else:  # pragma: no cover - depends on the environment
    JSON_LIBRARY = "orjson"

_STDLIB_DECODER = json.JSONDecoder()


def _orjson_loads(text: str) -> Any:
    """orjson's decode, or the stdlib's where orjson refuses the text.

    orjson refuses bare NaN/Infinity (which HF and ``json.dumps`` write), numbers
    beyond a double, nesting past 1024 and lone surrogates, all of which the stdlib
    reads. Where both decode a text they agree, but for integers beyond 64 bits,
    which orjson returns as floats: the samples are the same all the same (floats
    either way; ``as_step`` takes no step that large).
    """
    try:
        return orjson.loads(text)
    except ValueError:  # orjson.JSONDecodeError
        return json.loads(text)


def _orjson_decode_prefix(text: str) -> tuple[Any, int]:
    """``decode_prefix`` with orjson, which decodes whole documents only."""
    try:
        return orjson.loads(text), len(text)
    except ValueError:  # orjson.JSONDecodeError
        return _STDLIB_DECODER.raw_decode(text)


#: Decode one JSON document, accepting bare NaN/Infinity.
loads: Callable[[str], Any]
#: Decode the JSON document at the start of a string (no leading whitespace):
#: (value, index where it ends). The stdlib's ``raw_decode`` skips the wrapper
#: layers of ``json.loads``, which cost more than the decoding on a short line.
decode_prefix: Callable[[str], tuple[Any, int]]
if JSON_LIBRARY == "orjson":  # pragma: no cover - depends on the environment
    loads, decode_prefix = _orjson_loads, _orjson_decode_prefix
else:  # pragma: no cover - depends on the environment
    loads, decode_prefix = json.loads, _STDLIB_DECODER.raw_decode


#: orjson's own decode (raises on what it refuses), or None without orjson.
fast_loads: Callable[[str], Any] | None = (
    orjson.loads if JSON_LIBRARY == "orjson" else None  # pragma: no cover - environment
)

_STEP_PRIORITY = {key: rank for rank, key in enumerate(RECORD_STEP_KEYS)}
_new_tuple = tuple.__new__
_TIME_PRIORITY = {key: rank for rank, key in enumerate(TIME_KEYS)}
#: Fields that say how far a run is, not how it does (LLaMA-Factory's ``trainer_log.jsonl``).
_NOT_METRICS = frozenset({"total_steps", "percentage"})


@dataclass(frozen=True, slots=True)
class Schema:
    """How to read records with one set of field names, in their order: each field's
    sample name (None for the step and time fields), and the step and time fields in
    order of preference."""

    names: tuple[str | None, ...]
    step_keys: tuple[str, ...]
    time_keys: tuple[str, ...]


# Field names -> schema. A metrics file repeats one set of names on every line, so the
# names are normalised once per file, not once per line. Bounded against unique keys.
SCHEMAS: dict[tuple[str, ...], Schema] = {}
_SCHEMAS_MAX = 1024


#: Fields only a record of sampled completions has (TRL's ``GRPOTrainer``, and the RL
#: trainers built like it): its ``loss`` is a policy objective.
_SAMPLED_COMPLETIONS = frozenset({"reward_std", "frac_reward_zero_std", "completion_length"})


def samples_completions(names: Iterable[str]) -> bool:
    """Whether a record (a dict's keys, a table's header) is one of sampled completions:
    its ``loss`` is a policy objective, near 0 and either sign by design (TRL's GRPO)."""
    return any(name in _SAMPLED_COMPLETIONS or name[:12] == "completions/" for name in names)


def schema_of(keys: tuple[str, ...]) -> Schema:
    """The schema of a record with these field names, cached."""
    names: list[str | None] = []
    step_keys: list[str] = []
    time_keys: list[str] = []
    for key in keys:
        lowered = key.strip().lower()
        if lowered in _STEP_PRIORITY:
            step_keys.append(key)
            names.append(None)
        elif lowered in _TIME_PRIORITY:
            time_keys.append(key)
            names.append(None)
        elif lowered in _NOT_METRICS:
            names.append(None)
        else:
            names.append(normalise_name(key))
    if "loss" in names and samples_completions(keys):
        # TRL's GRPO record: its loss is the policy objective, near 0 and either sign by
        # design (its advantages are normalised in each group), rising with the KL term; a
        # ratio to it means nothing. Its NaN is still a loss's (``nan_inf``).
        names[names.index("loss")] = "policy_loss"
    step_keys.sort(key=lambda key: _STEP_PRIORITY[key.strip().lower()])
    time_keys.sort(key=lambda key: _TIME_PRIORITY[key.strip().lower()])
    schema = Schema(tuple(names), tuple(step_keys), tuple(time_keys))
    if len(SCHEMAS) < _SCHEMAS_MAX:
        SCHEMAS[keys] = schema
    return schema


def samples_from_mapping(fields: Mapping[str, object]) -> list[Sample]:
    """The samples of one record of named values (a decoded JSON object, an HF log dict).

    A record with a step and no metric gives one ``PROGRESS`` sample, so a
    step-only line still counts as progress.
    """
    keys = tuple(fields)
    schema = SCHEMAS.get(keys) or schema_of(keys)
    step: int | None = None
    for key in schema.step_keys:
        value = fields[key]
        # as_step's common case inlined: this runs for every line of a metrics file.
        if type(value) is int and -MAX_STEP < value < MAX_STEP:
            step = value
            break
        step = as_step(value)
        if step is not None:
            break
    time: float | None = None
    for key in schema.time_keys:
        value = fields[key]
        # as_epoch_seconds' common case inlined: a finite float in seconds (not NaN).
        if type(value) is float and -EPOCH_MS < value < EPOCH_MS:
            time = value
            break
        time = as_epoch_seconds(value)
        if time is not None:
            break
    samples: list[Sample] = []
    # The schema was built from these very keys, so names and values line up.
    for name, value in zip(schema.names, fields.values(), strict=True):
        if name is None:
            continue
        # as_float inlined: this loop runs for every field of every line of a metrics file.
        if type(value) is not float:
            if type(value) is not int and type(value) is not str:
                continue
            try:
                value = float(value)
            except (ValueError, OverflowError):
                continue
        # tuple.__new__ rather than Sample(): the same tuple without a Python-level call.
        samples.append(_new_tuple(Sample, (name, value, step, time, None)))
    if not samples and step is not None:
        samples.append(Sample(PROGRESS, float(step), step, time))
    return samples
