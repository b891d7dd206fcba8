"""``sentinel run [OPTIONS] -- COMMAND``: launch the job, watch it, act, restart."""

from __future__ import annotations

import argparse

from sentinel.cli import options as cli_options
from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of, usage_error
from sentinel.store import lock as state_lock

VERB = "run"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = verbs.add_parser(
        VERB,
        help="launch the job, watch it, act, restart",
        usage="sentinel run [OPTIONS] -- COMMAND [ARGS...]",
    )
    add_shared(
        run,
        takes=[n for n in cli_options.ALL if n != "--json" and n not in cli_options.TARGET],
        why="run launches its job; `sentinel watch` attaches to one started elsewhere",
        because={
            "--json": "the job's own output passes through stdout; the alerts are JSON lines"
            " in the state dir's alerts.jsonl"
        },
    )
    run.add_argument(
        "--no-pty",
        action="store_const",
        # A False would read as "not given": the setting takes the word.
        const="false",
        help="give the job a pipe each for its stdout and stderr, not one terminal for both"
        " (their order is lost) ([job] pty)",
    )
    run.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARGS...]",
        help="the job's command, after --; everything after -- goes to the job",
    )


def handle(args: argparse.Namespace) -> int:
    from sentinel.supervisor.core import Supervisor
    from sentinel.supervisor.restarts import preflight

    # REMAINDER keeps the "--"; without it an option meant for sentinel that comes
    # after the command's first word would silently go to the job.
    if args.command and args.command[0] != "--":
        return usage_error(
            "sentinel run",
            f"put -- before the job's command: sentinel run [OPTIONS] -- {args.command[0]} ...",
        )
    command = list(args.command[1:])
    if not command:
        return usage_error("sentinel run", "give the job's command after --")
    settings = settings_of(args)
    preflight(settings, command)
    with state_lock.acquire(settings.state_dir):  # one sentinel per state dir, for life
        return Supervisor(settings, command, reload=lambda: settings_of(args)).run()
