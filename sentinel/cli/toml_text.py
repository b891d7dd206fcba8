"""Plain data as TOML text: ``check-config``'s form for people.

The text reads back (``tomllib.loads``) as the data it came from, less its
nulls: TOML has no null, so an unset key is written as a comment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def dumps(table: Mapping[str, Any]) -> str:
    """``table`` (JSON-like data: dicts, lists, str, int, float, bool, None) as TOML."""
    return "\n".join(_lines(table, ""))


def _lines(table: Mapping[str, Any], name: str) -> list[str]:
    """The table's values, then its sub-tables (TOML puts a key under the last header)."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for key, value in table.items():
        bare = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
        if isinstance(value, dict) or _is_table_array(value):
            tables.append((f"{name}.{bare}" if name else bare, value))
        elif value is None:
            lines.append(f"# {bare} is not set")
        else:
            lines.append(f"{bare} = {_value(value)}")
    for path, value in tables:
        if isinstance(value, dict):
            lines += ["", f"[{path}]", *_lines(value, path)]
        else:
            for item in value:
                lines += ["", f"[[{path}]]", *_lines(item, path)]
    return lines


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, dict) for x in value)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # inf, nan and 1e-05 read the same in TOML
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{json.dumps(str(key))} = {_value(item)}" for key, item in value.items())
        return "{" + ", ".join(pairs) + "}"
    # A JSON string is a TOML basic string, but for DEL, which TOML wants escaped.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")
