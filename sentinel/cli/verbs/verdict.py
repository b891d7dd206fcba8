"""``sentinel verdict``: print the final verdict's code and exit with it.

With ``--wait`` it blocks until sentinel has decided, or no sentinel holds the state dir.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of, usage_error

VERB = "verdict"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verdict = verbs.add_parser(
        VERB,
        help="print the final verdict's code and exit with it (--wait: once sentinel decided)",
    )
    add_shared(
        verdict,
        takes=["--config", "--state-dir", "--verbose"],
        why="verdict only reads the state dir's verdict.json",
        because={"--json": "verdict prints the bare code; the record is in verdict.json"},
        own=["--wait"],
    )
    verdict.add_argument(
        "--wait",
        action="store_true",
        help="block until sentinel writes the final verdict, or no sentinel holds the state dir",
    )
    verdict.add_argument(
        "--timeout", type=float, metavar="S", help="with --wait: give up after S seconds"
    )
    verdict.add_argument(
        "--job-status",
        type=_exit_status,
        metavar="N",
        help="the job's own exit status: the exit code when no verdict comes (else 1)",
    )


def _exit_status(text: str) -> int:
    if not text.isdigit() or int(text) > 255:
        raise argparse.ArgumentTypeError(f"not an exit status (0 to 255): {text}")
    return int(text)


def handle(args: argparse.Namespace) -> int:
    from sentinel.service.verdict_wait import await_verdict

    if args.timeout is not None and not args.wait:
        return usage_error("sentinel verdict", "--timeout bounds --wait; give --wait too")
    # Its --wait is its own flag, never watch's --wait S: read as that, every wrapper of the
    # docs (no --state-dir) failed with a config error, exit 2, and lost each verdict.
    state_dir = (
        Path(args.state_dir) if args.state_dir else settings_of(args, own=("wait",)).state_dir
    )
    outcome = await_verdict(
        state_dir, wait=args.wait, timeout_s=args.timeout, job_status=args.job_status
    )
    if outcome.record is not None:
        print(outcome.code)
    else:
        print(f"sentinel verdict: {outcome.reason}", file=sys.stderr)
    return outcome.code
