"""Config keys that were renamed: the old spelling is accepted, with a warning, until 0.3.

Each rule lists its own old keys (``RuleConfig.renamed``); keys that moved from one
table to another are listed here. The loader moves them in each source (file,
secrets directory, environment) before the sources are merged, so a warning or an
error names the file or variable the old key came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sentinel.rules import DETECTORS, REMOVED_IN

__all__ = ["MOVED", "REMOVED_IN", "RENAMED", "Rename", "move_old_keys"]

KeyPath = tuple[str, ...]

#: Keys that moved to another table: old path -> new path.
MOVED: dict[KeyPath, KeyPath] = {
    # One gathering window for every line source: the job's output is read like a log.
    ("job", "output_batch_s"): ("tail", "batch_s"),
}


def _renamed() -> dict[KeyPath, KeyPath]:
    table = dict(MOVED)
    for rule, detector in DETECTORS.items():
        for old, new in detector.config_model.renamed.items():
            table[("rules", rule, old)] = ("rules", rule, new)
    return table


#: Every renamed key: old path -> new path.
RENAMED: dict[KeyPath, KeyPath] = _renamed()


@dataclass(frozen=True)
class Rename:
    """An old key found in a source, and the key that replaced it."""

    old: KeyPath
    new: KeyPath


def move_old_keys(values: dict[str, Any]) -> tuple[list[Rename], list[Rename]]:
    """Move each old key in ``values`` (one source's tables) to its new path, in place.

    Returns the keys moved, and the clashes: old keys left where they are because
    ``values`` holds the new key as well.
    """
    moved: list[Rename] = []
    clashes: list[Rename] = []
    for old, new in RENAMED.items():
        table = _table(values, old[:-1])
        if table is None or old[-1] not in table:
            continue
        target = _table(values, new[:-1])
        if target is not None and new[-1] in target:
            clashes.append(Rename(old, new))
            continue
        into: Any = values
        for part in new[:-1]:
            into = into.setdefault(part, {}) if isinstance(into, dict) else None
        if not isinstance(into, dict):
            continue  # the new key's table is set to a value: validation names that
        into[new[-1]] = table.pop(old[-1])
        moved.append(Rename(old, new))
    return moved, clashes


def _table(values: Any, path: KeyPath) -> dict[str, Any] | None:
    """The table at ``path`` inside ``values``, or None when there is none."""
    for part in path:
        if not isinstance(values, dict):
            return None
        values = values.get(part)
    return values if isinstance(values, dict) else None
