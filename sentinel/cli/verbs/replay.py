"""``sentinel replay PATH...``: run the detectors over finished logs and say what they found."""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sentinel.cli.options import add_shared
from sentinel.cli.verbs.common import settings_of, usage_error
from sentinel.config import Settings
from sentinel.model.records import Severity
from sentinel.model.untrusted import printable

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from sentinel.engine.replay import ReplayResult

VERB = "replay"


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay = verbs.add_parser(VERB, help="run the detectors over finished logs")
    add_shared(
        replay,
        takes=["--config", "--log", "--reference", "--json", "--verbose"],
        why="replay sends, signals, moves and restarts nothing",
        because={
            "--state-dir": "replay keeps no state: it reads its files and writes nothing",
            "--discover": "replay reads the files and folders it is given",
        },
    )
    replay.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="a log, metrics file, trainer_state.json or run folder, or a glob; read in"
        " order, then each --log (PATH is optional with --log)",
    )
    replay.add_argument(
        "--fail-on",
        choices=[str(severity) for severity in Severity],
        help="exit 1 if an alert this severe or worse was found",
    )


def handle(args: argparse.Namespace) -> int:
    from sentinel.engine.replay import replay

    given = [str(path) for path in args.paths] + (args.log or [])
    if not given:
        return usage_error("sentinel replay", "give a PATH or --log to read")
    settings = settings_of(args)
    paths, missing = _replay_inputs(given)
    if missing:
        return usage_error("sentinel replay", f"no such file: {', '.join(missing)}")
    try:
        result = replay(paths, settings)
    except FileNotFoundError as error:
        return usage_error("sentinel replay", error)
    if result.lines and not result.samples:
        # Nothing read: a format sentinel does not know, whose NaN would go by in silence.
        log.warning(
            "no metric was read from %d lines: their form is none sentinel knows; a"
            " [parsers] regexes pattern with (?P<step>...) and the metric's name reads it"
            " (docs/configuration.md, Log formats)",
            result.lines,
        )
    if args.json:
        for alert in result.alerts:
            print(json.dumps(alert.to_json(), allow_nan=False))
    else:
        _print_replay_table(result, settings)
    worst = result.worst()
    if args.fail_on and worst is not None and worst >= Severity(args.fail_on):
        return 1
    return 0


def _replay_inputs(given: list[str]) -> tuple[list[Path], list[str]]:
    """The files to replay, in the order given, each glob expanded; and what matched nothing."""
    paths: list[Path] = []
    missing: list[str] = []
    for pattern in given:
        if os.path.exists(pattern) or not glob.has_magic(pattern):
            matches = [pattern] if os.path.exists(pattern) else []
        else:
            matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            # A link to nothing (dangling, or a loop) is there, but names no file to read.
            link = not glob.has_magic(pattern) and os.path.lexists(pattern)
            missing.append(f"{pattern} (a symbolic link to no file)" if link else pattern)
        paths += [Path(match) for match in matches if Path(match) not in paths]
    return paths, missing


def _print_replay_table(result: ReplayResult, settings: Settings) -> None:
    from sentinel.rules import DETECTORS

    rules = [rule for rule in DETECTORS if settings.rule(rule).enabled]
    print(
        f"{result.lines} lines, {result.samples} samples, {result.garbled} garbled lines skipped,"
        f" {result.incidents} incident(s)"
    )
    print(
        f"{'rule':<17} {'fired':<6} {'worst':<9} {'first step':>10} {'episodes':>8}"
        f" {'alerts':>6}  lead before first nan_inf"
    )
    for row in result.summary(rules):
        fired = "yes" if row.count else "no"
        worst = str(row.worst) if row.worst else "-"
        first = "-" if row.first_step is None else str(row.first_step)
        lead = ""
        if row.lead_steps is not None:
            lead = f"{row.lead_steps} steps"
            if row.lead_s is not None:
                lead += f" ({row.lead_s:.0f} s)"
        print(
            f"{row.rule:<17} {fired:<6} {worst:<9} {first:>10} {row.episodes:>8}"
            f" {row.count:>6}  {lead}".rstrip()
        )
    for alert in result.alerts:
        if not alert.resolves:
            message = printable(alert.message)  # it may quote the log: one line, no escapes
            where = "no step" if alert.step is None else f"step {alert.step}"
            print(f"  {where}: {alert.severity} {alert.rule}: {message}")
            diagnosis = alert.details.get("diagnosis")
            if diagnosis:
                reading = printable(f"{diagnosis['cause']}: {diagnosis['advice']}")
                print(f"    diagnosis: {reading}")
                if diagnosis["sparkline"]:
                    print(f"    {diagnosis['sparkline']}")
