"""The restart protocol: the resume command's template, and the job's restart environment.

The template is split into arguments once, when the config loads, and each
placeholder is filled inside its own argument: a checkpoint path with a space
or a brace stays one argument, taken literally, and no value can inject
another. Only ``{checkpoint}`` and ``{step}`` are placeholders; every other
character, braces of JSON included, is the command's own text. An unknown
``{name}`` (a typo such as ``{checkpiont}``) is refused at load, before
anything starts, never discovered at restart time after the job was stopped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

PLACEHOLDERS = ("checkpoint", "step")
#: What a placeholder looks like; ``{"a": 1}`` is not one and stays literal.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: Variables sentinel sets for the job it restarts (docs/rollback.md, "Restart protocol").
RESUME_FROM = "SENTINEL_RESUME_FROM"
RESUME_STEP = "SENTINEL_RESUME_STEP"
RESTART = "SENTINEL_RESTART"
RESTART_ENV = (RESUME_FROM, RESUME_STEP, RESTART)


def parse_template(template: str) -> list[str]:
    """The template's arguments; ValueError saying what is wrong with it."""
    try:
        argv = shlex.split(template)
    except ValueError as error:
        raise ValueError(f"cannot be split into arguments: {error}") from None
    if not argv:
        raise ValueError("is empty")
    unknown = sorted(
        {name for arg in argv for name in _PLACEHOLDER.findall(arg)} - set(PLACEHOLDERS)
    )
    if unknown:
        shown = ", ".join("{" + name + "}" for name in unknown)
        raise ValueError(
            f"unknown placeholder {shown}: only {{checkpoint}} and {{step}} are filled in"
        )
    return argv


def names(argv: list[str], placeholder: str) -> bool:
    """Whether any argument of the template holds ``{placeholder}``."""
    token = "{" + placeholder + "}"
    return any(token in arg for arg in argv)


def fill(argv: list[str], values: Mapping[str, str]) -> list[str]:
    """The template with each placeholder replaced inside its argument, in one pass.

    A value is never read as a template itself: a path holding ``{step}`` stays as it is.
    """

    def value(match: re.Match[str]) -> str:
        return values[match.group(1)]

    return [_PLACEHOLDER.sub(value, arg) for arg in argv]


def restart_env(checkpoint: str, step: int | None, restart: int) -> dict[str, str]:
    """The variables a restarted job gets: where to resume, at which step, which restart."""
    return {
        RESUME_FROM: checkpoint,
        RESUME_STEP: "" if step is None else str(step),
        RESTART: str(restart),
    }
