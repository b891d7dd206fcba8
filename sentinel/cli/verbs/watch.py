"""``sentinel watch``: attach to a job started elsewhere and follow it across restarts."""

from __future__ import annotations

import argparse

from sentinel.cli import options as cli_options
from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of, usage_error
from sentinel.store import lock as state_lock

VERB = "watch"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watch = verbs.add_parser(
        VERB,
        help="attach to a job started elsewhere; follow it across restarts",
        usage="sentinel watch [OPTIONS] (--pid PID | --pidfile FILE | --match REGEX"
        " | --systemd-unit UNIT)",
    )
    add_shared(
        watch,
        takes=[n for n in cli_options.ALL if n not in ("--json", "--resume-command")],
        because={
            "--json": "alerts are JSON lines in the state dir's alerts.jsonl",
            "--resume-command": "watch does not relaunch the job; whoever started it does,"
            " and sentinel rewrites the resume pointers to the clean checkpoint",
        },
    )


def handle(args: argparse.Namespace) -> int:
    from sentinel.supervisor.core import Supervisor
    from sentinel.supervisor.holders import Attached, target_of
    from sentinel.supervisor.restarts import preflight

    settings = settings_of(args)
    try:
        target = target_of(settings)
    except ValueError as error:
        return usage_error("sentinel watch", error)
    preflight(settings, [])
    with state_lock.acquire(settings.state_dir):  # one sentinel per state dir, for life
        supervisor = Supervisor(settings, holder=Attached(target), reload=lambda: settings_of(args))
        return supervisor.run()
