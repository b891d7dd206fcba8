"""The limits every setting keeps: numbers finite and within generous bounds, whole numbers
whole, texts of a sane length.

A setting that passes its own checks can still stop sentinel from doing its work:
``grace_period_s = inf`` (then no SIGKILL ever comes), ``max_restarts = 1e26`` or
``= true`` (read as 1), a job name of ten megabytes in every message. Every table of
settings derives from ``SettingsTable``, which refuses them at load time with one line
naming the key; ``Settings`` itself takes the same checks (``number_checks``).

A number is bounded by its own ``le``/``lt`` when it declares one, else by what its name
says it is (sentinel's settings carry their unit in the name): a duration (``_s``) at most
30 days, a size (``_bytes``) at most 1 PiB, any other whole number at most 10**9, any
other number at most 10**12. A whole number is given as one (``3``, or ``"3"`` from the
environment): never ``3.0``, ``1e26`` or ``true``.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from annotated_types import Le, Lt, MaxLen
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

#: The longest text a setting takes (a path, a command, a pattern, a URL).
MAX_TEXT_CHARS = 4096
#: The longest name (a job's, a target's) a setting takes: it goes in every message.
MAX_NAME_CHARS = 256
MAX_DURATION_S = 30 * 86400.0
MAX_BYTES = 1 << 50
MAX_COUNT = 10**9
MAX_NUMBER = 1e12


def _number_kind(annotation: Any) -> type | None:
    """``int`` or ``float`` for a field of that type (or optional), else None."""
    if annotation in (int, float):
        return typing.cast(type, annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = {arg for arg in typing.get_args(annotation) if arg is not type(None)}
        if len(kinds) == 1 and (kind := kinds.pop()) in (int, float):
            return typing.cast(type, kind)
    return None


def _field(model: type[BaseModel], info: ValidationInfo) -> Any:
    return model.model_fields.get(info.field_name or "")


def plain_input(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """Before a field is read: a text not too long; a number not a truth value; a whole
    number not written as a fraction or with an exponent."""
    field = _field(model, info)
    too_long = isinstance(value, str) and len(value) > MAX_TEXT_CHARS
    if too_long and not (field is not None and any(isinstance(r, MaxLen) for r in field.metadata)):
        raise ValueError(f"at most {MAX_TEXT_CHARS} characters (this one has {len(value)})")
    kind = None if field is None else _number_kind(field.annotation)
    if kind is None:
        return value
    what = "a whole number" if kind is int else "a number"
    if isinstance(value, bool):
        raise ValueError(f"must be {what}, not {str(value).lower()}")
    if kind is int and isinstance(value, float):
        raise ValueError(f"must be a whole number, not {value!r}")
    return value


def within_bounds(model: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """After a field is read: a number within the generous bound its name implies, unless
    it declares a bound of its own."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    field = _field(model, info)
    if field is None or any(isinstance(rule, Le | Lt) for rule in field.metadata):
        return value
    name = info.field_name or ""
    if name.endswith("_s"):
        ceiling, unit = MAX_DURATION_S, " seconds (30 days)"
    elif name.endswith("_bytes"):
        ceiling, unit = float(MAX_BYTES), " bytes (1 PiB)"
    elif isinstance(value, int):
        ceiling, unit = float(MAX_COUNT), ""
    else:
        ceiling, unit = MAX_NUMBER, ""
    if abs(value) > ceiling:
        raise ValueError(f"must be at most {ceiling:.12g}{unit}, not {value!r}")
    return value


class SettingsTable(BaseModel):
    """A table of settings: an unknown key is an error, and every value keeps the bounds
    above (NaN and infinities refused too)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    _plain_input = field_validator("*", mode="before")(classmethod(plain_input))
    _within_bounds = field_validator("*", mode="after")(classmethod(within_bounds))
