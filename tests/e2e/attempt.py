"""What a test job of this folder knows of its attempt under ``sentinel run``: which
restart it is, where to resume from, and a record to append what it did to (one JSON
object a line, with its pid and restart)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def attempt(record: Path) -> tuple[int, str, Callable[..., None]]:
    """(``SENTINEL_RESTART``, ``SENTINEL_RESUME_FROM``, ``note(**fields)``)."""
    restart = int(os.environ.get("SENTINEL_RESTART") or 0)
    resume_from = os.environ.get("SENTINEL_RESUME_FROM") or ""

    def note(**fields: object) -> None:
        fields.update(pid=os.getpid(), restart=restart)
        with record.open("a") as handle:
            handle.write(json.dumps(fields) + "\n")

    return restart, resume_from, note
