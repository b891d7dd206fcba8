"""The verbs of the ``sentinel`` command: a module each, with its options and its handler.

Only ``sentinel/cli/main.py`` and ``sentinel/cli/verbs/`` print to the terminal or exit; the
library below them logs, returns and raises. Imports run one way: ``cli`` imports the
verbs, a verb imports what it runs, and nothing here imports ``cli``. A verb imports what
only it needs (the supervisor, the notify action and apprise behind it) inside its
handler, so ``sentinel verdict`` or ``sentinel status`` does not load them.
"""

from __future__ import annotations

import argparse
from typing import Protocol


class Command(Protocol):
    """One verb; its module is the implementation (``commands/run.py`` for ``sentinel run``)."""

    VERB: str
    """The verb as typed: ``run``, ``notify-test``."""

    def add_parser(self, verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add the verb's parser to ``verbs``: its help, its shared options, its own."""

    def handle(self, args: argparse.Namespace) -> int:
        """Do what the verb does with the parsed ``args``; the exit status."""
