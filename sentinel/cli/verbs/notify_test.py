"""``sentinel notify-test``: send a test alert to every target and say how each went."""

from __future__ import annotations

import argparse
import json

from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of, usage_error
from sentinel.model.untrusted import printable

VERB = "notify-test"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    notify_test = verbs.add_parser(VERB, help="send a test alert to every target")
    add_shared(
        notify_test,
        takes=["--config", "--notify", "--json", "--verbose"],
        why="notify-test watches no job: it sends one test alert to each target",
        because={
            "--dry-run": "notify-test only sends a test alert, which --dry-run would send too",
            "--state-dir": "notify-test sends at once and keeps no state",
        },
    )


def handle(args: argparse.Namespace) -> int:
    import socket
    import time

    from sentinel.notify.dispatch import routes
    from sentinel.notify.notices import JobInfo
    from sentinel.notify.notifier import send_notify_test

    settings = settings_of(args)
    targets = [route.target for route in routes(settings.notify)]
    if not targets:
        return usage_error(
            "sentinel notify-test",
            "no targets (give --notify URL, [notify] urls or [[notify.targets]])",
        )
    job = JobInfo(settings.job.name or "notify-test", socket.gethostname(), "notify-test")
    results = send_notify_test(targets, job, settings.notify.timeout_s, time.time())
    for target, error in results:
        if args.json:
            print(json.dumps({"name": target.name, "ok": error is None, "error": error}))
        elif error is None:
            print(f"ok      {printable(target.name)}")
        else:
            print(printable(f"FAILED  {target.name}: {error}"))  # the error may quote a server
    return 1 if any(error is not None for _, error in results) else 0
