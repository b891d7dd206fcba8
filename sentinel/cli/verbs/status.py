"""``sentinel status``: the last run, the job, the last incident, the verdict, pending messages,
each target's last delivery."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of, usage_error

VERB = "status"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = verbs.add_parser(
        VERB,
        help="the last run, the job, the last incident and its report, the verdict, pending"
        " messages, each target's last delivery",
        description="Read the state dir (never write it) and show what it holds. What cannot"
        " be read is named in one line and the rest is shown; the exit status is then 1.",
    )
    add_shared(
        status,
        takes=["--config", "--state-dir", "--checkpoints", "--json", "--verbose"],
        why="status only reads the state dir; it changes nothing",
    )


def handle(args: argparse.Namespace) -> int:
    from sentinel.service.status import NoState, gather

    settings = settings_of(args)
    state_dir = Path(args.state_dir) if args.state_dir else settings.state_dir
    try:
        status = gather(
            state_dir,
            checkpoints=settings.checkpoints,
            warn_disk_bytes=settings.keep.warn_disk_bytes,
        )
    except NoState as error:
        return usage_error("sentinel status", error)
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        print("\n".join(status.lines()))
    return 1 if status.unreadable else 0
