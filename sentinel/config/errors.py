"""How a bad setting is worded: the dotted key and the flag, variable or file it came from."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sentinel.config.models import CLI_FIELDS, Settings
from sentinel.config.renames import Rename


class ConfigError(Exception):
    """An invalid setting: names the key and the source of its value."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class Layer:
    """One source of values and how to name it in an error."""

    values: dict[str, Any]
    describe: Callable[[tuple[str | int, ...]], str]
    #: Whether the layer names a value by its variable (environment, secret files).
    by_variable: bool = False


def named_by(names: Mapping[tuple[str, ...], str], fallback: str) -> Any:
    """Describe a key by the variable or file that set it: the longest prefix of its path."""

    def describe(loc: tuple[str | int, ...]) -> str:
        parts = tuple(str(part).lower() for part in loc)
        for end in range(len(parts), 0, -1):
            if parts[:end] in names:
                return names[parts[:end]]
        return fallback

    return describe


def clash(rename: Rename, old_layer: Layer, new_layer: Layer) -> str:
    old, new = dotted(rename.old), dotted(rename.new)
    return (
        f"{old} (from {old_layer.describe(rename.old)}) and {new} (from"
        f" {new_layer.describe(rename.new)}) are one setting: give only {new}"
        f" ({rename.old[-1]} is its old name)"
    )


def as_written(layer: Layer, moved: list[Rename]) -> Callable[[tuple[str | int, ...]], str]:
    """``layer.describe``, naming a moved value by its old key where the user wrote it."""
    if not moved:
        return layer.describe

    def describe(loc: tuple[str | int, ...]) -> str:
        for rename in moved:
            if loc[: len(rename.new)] == rename.new:
                where = layer.describe(rename.old)
                return where if layer.by_variable else f"{dotted(rename.old)} in {where}"
        return layer.describe(loc)

    return describe


def flag_for(loc: tuple[str | int, ...]) -> str:
    for dest, path in CLI_FIELDS.items():
        if tuple(loc[: len(path)]) == path:
            return dest
    return ".".join(str(part) for part in loc)


def describe_problem(problem: Any, layers: list[Layer]) -> str:
    loc: tuple[str | int, ...] = tuple(problem["loc"])
    message = str(problem["msg"]).removeprefix("Value error, ")
    if problem["type"] == "extra_forbidden":
        message = "unknown setting" + _suggestion(loc)
    return f"{key_and_source(loc, layers)}: {message}"


def key_and_source(loc: tuple[str | int, ...], layers: list[Layer]) -> str:
    """The dotted key and the source of its value: ``job.max_restarts (from c.toml)``."""
    key = dotted(loc)
    for layer in layers:
        if has_path(layer.values, loc):
            # A table-level error (e.g. hard <= soft) names the keys this layer set inside it.
            sources = sorted({layer.describe(leaf) for leaf in _leaves(layer.values, loc)})
            return f"{key} (from {', '.join(sources)})"
    return key


def _leaves(values: Any, loc: tuple[str | int, ...]) -> list[tuple[str | int, ...]]:
    """The full paths of the values set at or below ``loc``."""
    for part in loc:
        values = values[part]
    if isinstance(values, dict) and values:
        return [loc + rest for rest in _sub_leaves(values)]
    return [loc]


def _sub_leaves(values: dict[str, Any]) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = []
    for sub_key, sub_value in values.items():
        if isinstance(sub_value, dict) and sub_value:
            out += [(sub_key, *rest) for rest in _sub_leaves(sub_value)]
        else:
            out.append((sub_key,))
    return out


def _suggestion(loc: tuple[str | int, ...]) -> str:
    model: Any = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not isinstance(field.annotation, type):
            return ""
        model = field.annotation
    if not hasattr(model, "model_fields"):
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def has_path(values: Any, loc: tuple[str | int, ...]) -> bool:
    for part in loc:
        in_dict = isinstance(values, dict) and part in values
        in_list = isinstance(values, list) and isinstance(part, int) and part < len(values)
        if in_dict or in_list:
            values = values[part]
        else:
            return False
    return True
