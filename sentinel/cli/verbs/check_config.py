"""``sentinel check-config``: validate the settings and print them, secrets masked."""

from __future__ import annotations

import argparse
import json

from sentinel.cli import options as cli_options
from sentinel.cli import toml_text
from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of
from sentinel.config import effective_config

VERB = "check-config"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = verbs.add_parser(VERB, help="validate and print the effective config")
    add_shared(check, takes=cli_options.ALL)  # each one shows in the config it prints


def handle(args: argparse.Namespace) -> int:
    shown = effective_config(settings_of(args))  # secrets masked, whichever the form
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        print(toml_text.dumps(shown))
    return 0
