"""Write the manual's two generated pages: the CLI reference from the parser, the configuration
reference from the settings models. ``python docs/gen_reference.py`` (the suite checks that
the pages in the repository are what this writes: tests/test_docs.py).

Each setting's description is the ``#:`` comment above it in its model's source, as the code
documents it for its readers.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sentinel.cli.main import build_parser  # noqa: E402
from sentinel.config import ENV_PREFIX, Settings  # noqa: E402
from sentinel.rules import DETECTORS  # noqa: E402

CLI_PAGE = HERE / "reference" / "cli.md"
#: The width the CLI's help is written at.
HELP_COLUMNS = 100
CONFIG_PAGE = HERE / "reference" / "config.md"


def cli_page() -> str:
    """Every verb's ``--help``, as the parser writes it (at ``HELP_COLUMNS`` columns)."""
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    parser = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from sentinel's parser (`python docs/gen_reference.py`): what",
        "`sentinel VERB --help` prints. Exit codes are at the end of `sentinel --help`.",
        "",
        "```",
        _help(parser, "sentinel"),
        "```",
    ]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            lines += ["", f"## `sentinel {name}`", "", "```", _help(sub, f"sentinel {name}"), "```"]
    return "\n".join(lines) + "\n"


def _help(parser: argparse.ArgumentParser, prog: str) -> str:
    parser.prog = prog
    text = parser.format_help()
    # The terminal's width must not change the page: argparse wraps to $COLUMNS.
    return text.rstrip()


def config_page() -> str:
    """Every setting: its key in a config file, its environment variable, type, default."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings models (`python docs/gen_reference.py`). Each key goes in",
        "a TOML (or YAML) file given with `--config`, or in the environment as",
        f"`{ENV_PREFIX}` + the path joined by `__` (`{ENV_PREFIX}JOB__MAX_RESTARTS=2`); an",
        "option on the command line beats the environment, which beats the file.",
        "`sentinel check-config` prints the effective configuration.",
    ]
    lines += _table("Top level", Settings, ())
    for name, field in Settings.model_fields.items():
        model = _model_of(field.annotation)
        if model is not None and name != "rules":
            lines += _table(f"[{name}]", model, (name,))
    for rule, detector in sorted(DETECTORS.items()):
        lines += _table(f"[rules.{rule}]", detector.config_model, ("rules", rule))
    return "\n".join(lines) + "\n"


def _table(title: str, model: type[BaseModel], path: tuple[str, ...]) -> list[str]:
    notes = _comments(model)
    rows = []
    for name, field in model.model_fields.items():
        if _model_of(field.annotation) is not None and not path:
            continue  # a section of its own
        env = ENV_PREFIX + "__".join((*path, name)).upper()
        default = (
            "required"
            if field.is_required()
            else _default(field.get_default(call_default_factory=True))
        )
        note = notes.get(name, "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type(field.annotation)} | {default} | `{env}` | {note} |")
    doc = inspect.getdoc(model) or ""
    first = doc.split("\n\n", 1)[0].replace("\n", " ")
    return [
        "",
        f"## {title}",
        "",
        *([first, ""] if first else []),
        "| key | type | default | environment | what it is |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The ``#:`` comments above each field in ``model``'s class body and its bases'."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        found.update(_field_comments(source))
    return found


def _field_comments(source: str) -> Iterator[tuple[str, str]]:
    pending: list[str] = []
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        match = re.match(r"([a-z_][a-z0-9_]*)\s*:", text)
        if match and pending:
            yield match.group(1), " ".join(pending)
        if not text.startswith("#"):
            pending = []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _type(annotation: Any) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    for prefix in ("typing.", "pathlib.", "sentinel.model.records.", "collections.abc."):
        text = text.replace(prefix, "")
    text = re.sub(r"<class '([^']+)'>", r"\1", text)
    text = re.sub(r"Annotated\[([^,\]]+(?:\[[^\]]*\])?),.*\]$", r"\1", text)
    if typing.get_origin(annotation) is typing.Literal:
        return " or ".join(f"`{arg!r}`" for arg in typing.get_args(annotation))
    escaped = text.replace("|", "\\|")
    return f"`{escaped}`"


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, str) and not value:
        return '`""`'
    if isinstance(value, BaseModel):
        return "(its keys)"
    text = str(value) if isinstance(value, Path) else repr(value)
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def main() -> None:
    CLI_PAGE.parent.mkdir(exist_ok=True)
    os.environ["COLUMNS"] = str(HELP_COLUMNS)  # argparse wraps to it: the same page anywhere
    CLI_PAGE.write_text(cli_page())
    CONFIG_PAGE.write_text(config_page())
    print(f"wrote {CLI_PAGE.relative_to(HERE.parent)} and {CONFIG_PAGE.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
