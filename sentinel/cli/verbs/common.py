"""What the verbs share: their settings, and the one-line refusal of a usage error."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from typing import Any

from sentinel.cli.options import EXIT_USAGE
from sentinel.config import CLI_FIELDS, Settings, load_settings
from sentinel.model.untrusted import printable


def settings_of(args: argparse.Namespace, own: Collection[str] = ()) -> Settings:
    """The settings: the config file, then the environment, then the verb's options; not
    those of ``own``, the verb's own options of a shared name (``verdict --wait``, a flag,
    is not ``watch --wait S``)."""
    cli: dict[str, Any] = {
        dest: getattr(args, dest, None) for dest in CLI_FIELDS if dest not in own
    }
    return load_settings(args.config, cli=cli)


def usage_error(where: str, problem: object) -> int:
    """Say ``where: problem`` on stderr; the usage exit status."""
    print(printable(f"{where}: {problem}"), file=sys.stderr)  # one line, whatever it quotes
    return EXIT_USAGE
