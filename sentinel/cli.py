"""The ``sentinel`` command. The only module that prints to the terminal or exits."""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sentinel import __version__, cli_options, secrets, state_lock, toml_text
from sentinel import verdict as verdict_codes
from sentinel.cli_options import EXIT_USAGE, add_shared
from sentinel.config import ConfigError, Settings, effective_config, load_settings
from sentinel.parsers.files import require_extras
from sentinel.parsers.tensorboard import MissingExtra
from sentinel.records import Severity
from sentinel.state_lock import StateDirLocked

log = logging.getLogger("sentinel")


_REPLAY_ACTS = "replay sends, signals, moves and restarts nothing"


def build_parser() -> argparse.ArgumentParser:
    """The verbs; each takes the shared options it honours and refuses the rest (cli_options)."""
    parser = argparse.ArgumentParser(
        prog="sentinel",
        description="A watchdog for ML training jobs: catches NaN, stalls and crashes,\n"
        "notifies, rolls back to the last clean checkpoint and restarts.",
        epilog=_exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sentinel {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    run = verbs.add_parser(
        "run",
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
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND [ARGS...]",
        help="the job's command, after --; everything after -- goes to the job",
    )

    watch = verbs.add_parser(
        "watch",
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

    replay = verbs.add_parser("replay", help="run the detectors over finished logs")
    add_shared(
        replay,
        takes=["--config", "--log", "--json", "--verbose"],
        why=_REPLAY_ACTS,
        because={"--state-dir": "replay keeps no state: it reads its files and writes nothing"},
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

    checkpoints = verbs.add_parser(
        "checkpoints", help="list checkpoints and their status, and the resume pointers"
    )
    add_shared(
        checkpoints,
        takes=["--json"],
        why="checkpoints only reads DIR: it uses no settings and moves nothing",
        because={"--verbose": "checkpoints logs nothing: it prints what it finds"},
    )
    checkpoints.add_argument("directory", type=Path, metavar="DIR", help="the directory to list")
    checkpoints.add_argument(
        "--restore",
        metavar="INCIDENT",
        help="undo a rollback: move the quarantine INCIDENT (its folder's name, or a unique"
        " prefix) back where each item came from, and the resume pointers it rewrote as they"
        " were; refuses if any of those places is taken",
    )

    notify_test = verbs.add_parser("notify-test", help="send a test alert to every target")
    add_shared(
        notify_test,
        takes=["--config", "--notify", "--json", "--verbose"],
        why="notify-test watches no job: it sends one test alert to each target",
        because={
            "--dry-run": "notify-test only sends a test alert, which --dry-run would send too",
            "--state-dir": "notify-test sends at once and keeps no state",
        },
    )

    status = verbs.add_parser(
        "status", help="the last run, the job, pending messages, each target's last delivery"
    )
    add_shared(
        status,
        takes=["--config", "--state-dir", "--checkpoints", "--json", "--verbose"],
        why="status only reads the state dir; it changes nothing",
    )

    check = verbs.add_parser("check-config", help="validate and print the effective config")
    add_shared(check, takes=cli_options.ALL)  # each one shows in the config it prints

    demo = verbs.add_parser("demo", help="watch a bundled toy job diverge, roll back and finish")
    add_shared(
        demo,
        takes=["--verbose"],
        why="demo runs its bundled job with settings of its own",
        because={"--json": "demo tells its story for people to read"},
    )
    demo.add_argument("--keep", type=Path, metavar="DIR", help="work in DIR and keep it")

    verdict = verbs.add_parser(
        "verdict",
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
    return parser


def _exit_status(text: str) -> int:
    if not text.isdigit() or int(text) > 255:
        raise argparse.ArgumentTypeError(f"not an exit status (0 to 255): {text}")
    return int(text)


def _exit_codes() -> str:
    """The exit-code table of ``sentinel --help`` (a contract: DESIGN.md, README)."""
    rows = [
        ("0", "run: the job finished (after restarts, if any); watch: stopped"),
        ("1", "replay --fail-on: an alert that severe; verdict: no verdict and no --job-status"),
        ("2", "a usage or config error, or another sentinel holds the state dir"),
        *((str(code), meaning) for code, (_, meaning) in sorted(verdict_codes.CODES.items())),
        ("other", "run: the job's own last status; verdict: --job-status when no verdict came"),
    ]
    return "exit codes:\n" + "\n".join(f"  {code:<6} {meaning}" for code, meaning in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    secrets.install_excepthooks()
    _setup_logging(getattr(args, "verbose", False))
    handler = {
        "run": _run,
        "watch": _watch,
        "replay": _replay,
        "checkpoints": _checkpoints,
        "notify-test": _notify_test,
        "status": _status,
        "check-config": _check_config,
        "demo": _demo,
        "verdict": _verdict,
    }[args.verb]
    try:
        return handler(args)
    except ConfigError as error:
        for problem in error.problems:
            print(f"sentinel: config error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except StateDirLocked as error:
        print(f"sentinel: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # the last word: its traceback may quote a URL's token
        secrets.print_exception(error)
        return 1


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[sentinel %(asctime)s] %(levelname)s %(message)s", "%H:%M:%S")
    )
    secrets.install(handler)  # on the handler: masks the records of every logger reaching it
    root = logging.getLogger("sentinel")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False
    # requests, urllib3 and apprise log through the root logger; without a handler there
    # their warnings would reach stderr unmasked through logging's last resort.
    top = logging.getLogger()
    if not top.handlers:
        top.addHandler(handler)
        top.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("apprise").propagate = verbose  # its failures are in our own warnings


def _settings(args: argparse.Namespace) -> Settings:
    from sentinel.config import CLI_FIELDS

    cli: dict[str, Any] = {dest: getattr(args, dest, None) for dest in CLI_FIELDS}
    return load_settings(args.config, cli=cli)


def _run(args: argparse.Namespace) -> int:
    from sentinel.restarts import preflight
    from sentinel.supervisor import Supervisor

    # REMAINDER keeps the "--"; without it an option meant for sentinel that comes
    # after the command's first word would silently go to the job.
    if args.command and args.command[0] != "--":
        print(
            f"sentinel run: put -- before the job's command: sentinel run [OPTIONS] --"
            f" {args.command[0]} ...",
            file=sys.stderr,
        )
        return EXIT_USAGE
    command = list(args.command[1:])
    if not command:
        print("sentinel run: give the job's command after --", file=sys.stderr)
        return EXIT_USAGE
    settings = _settings(args)
    try:
        require_extras(settings.logs)
    except MissingExtra as error:
        print(f"sentinel run: {error}", file=sys.stderr)
        return EXIT_USAGE
    preflight(settings, command)
    with state_lock.acquire(settings.state_dir):  # one sentinel per state dir, for life
        return Supervisor(settings, command, reload=lambda: _settings(args)).run()


def _watch(args: argparse.Namespace) -> int:
    from sentinel.holders import Attached, target_of
    from sentinel.restarts import preflight
    from sentinel.supervisor import Supervisor

    settings = _settings(args)
    try:
        target = target_of(settings)
        require_extras(settings.logs)
    except (ValueError, MissingExtra) as error:
        print(f"sentinel watch: {error}", file=sys.stderr)
        return EXIT_USAGE
    preflight(settings, [])
    with state_lock.acquire(settings.state_dir):  # one sentinel per state dir, for life
        supervisor = Supervisor(
            settings, holder=Attached(target), reload=lambda: _settings(args)
        )
        return supervisor.run()


def _replay(args: argparse.Namespace) -> int:
    from sentinel.replay import replay

    given = [str(path) for path in args.paths] + (args.log or [])
    if not given:
        print("sentinel replay: give a PATH or --log to read", file=sys.stderr)
        return EXIT_USAGE
    settings = _settings(args)
    paths, missing = _replay_inputs(given)
    if missing:
        print(f"sentinel replay: no such file: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = replay(paths, settings)
    except (MissingExtra, FileNotFoundError) as error:
        print(f"sentinel replay: {error}", file=sys.stderr)
        return EXIT_USAGE
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
            missing.append(pattern)
        paths += [Path(match) for match in matches if Path(match) not in paths]
    return paths, missing


def _print_replay_table(result: Any, settings: Settings) -> None:
    from sentinel.detectors import DETECTORS

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
            print(f"  step {alert.step}: {alert.severity} {alert.rule}: {alert.message}")
            diagnosis = alert.details.get("diagnosis")
            if diagnosis:
                print(f"    diagnosis: {diagnosis['cause']}: {diagnosis['advice']}")
                if diagnosis["sparkline"]:
                    print(f"    {diagnosis['sparkline']}")


def _checkpoints(args: argparse.Namespace) -> int:
    from sentinel.actions.pointers import find_pointers
    from sentinel.sources.checkpoints import last_clean, scan

    if args.restore is not None:
        return _restore(args)
    if not args.directory.is_dir():
        print(f"sentinel checkpoints: not a directory: {args.directory}", file=sys.stderr)
        return EXIT_USAGE
    found = scan(args.directory)
    clean = last_clean(found)
    pointers = find_pointers(args.directory)
    if args.json:
        print(
            json.dumps(
                {
                    "directory": str(args.directory.resolve()),
                    "last_clean": str(clean.path) if clean else None,
                    "checkpoints": [
                        {
                            "path": str(c.path),
                            "step": c.step,
                            "epoch": c.epoch,
                            "status": str(c.status),
                            "reason": c.reason,
                            "layout": c.layout,
                            "placed_by": c.placed_by,
                        }
                        for c in found
                    ],
                    "pointers": [p.to_json() for p in pointers],
                },
                indent=2,
            )
        )
        return 0
    if not found:
        print(f"no checkpoints in {args.directory}")
        _print_pointers(pointers)
        return 0
    print(f"{'step':>8}  {'status':<11} {'checkpoint':<32} {'layout':<11} reason")
    for c in found:
        place = "-" if c.epoch is None else f"epoch={c.epoch}"
        place = place if c.step is None else str(c.step)
        notes = [c.reason] if c.reason else []
        if c.placed_by != "name":
            notes.append(f"placed by {c.placed_by}")
        if clean is not None and c.path == clean.path:
            notes.append("<- last clean: a rollback resumes here")
        print(f"{place:>8}  {c.status!s:<11} {c.path.name:<32} {c.layout:<11} {'; '.join(notes)}")
    if clean is None:
        print("no clean checkpoint: a rollback would have nothing to resume from")
    _print_pointers(pointers)
    return 0


def _print_pointers(pointers: Sequence[Any]) -> None:
    """Each framework's resume pointer and what it names (a job restarted by others reads it)."""
    for pointer in pointers:
        print(f"{'pointer':>8}  {pointer.describe()}")


def _restore(args: argparse.Namespace) -> int:
    """``sentinel checkpoints --restore INCIDENT DIR``: put a rollback's quarantine back."""
    from sentinel.actions.restore import RestoreRefused, restore_quarantine

    if not args.directory.is_dir():
        print(f"sentinel checkpoints: not a directory: {args.directory}", file=sys.stderr)
        return EXIT_USAGE
    try:
        moves = restore_quarantine(args.directory, args.restore)
    except RestoreRefused as error:
        print(f"sentinel checkpoints --restore: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        restored = [{"from": str(m.source), "to": str(m.destination)} for m in moves]
        print(json.dumps({"restored": restored}, indent=2))
        return 0
    for move in moves:
        print(f"restored {move.destination} (from {move.source.parent})")
    print(f"{len(moves)} item(s) back from the quarantine")
    return 0


def _notify_test(args: argparse.Namespace) -> int:
    import socket
    import time

    from sentinel.actions.dispatch import routes
    from sentinel.actions.notices import JobInfo
    from sentinel.actions.notify import send_notify_test

    settings = _settings(args)
    targets = [route.target for route in routes(settings.notify)]
    if not targets:
        print(
            "sentinel notify-test: no targets (give --notify URL, [notify] urls or"
            " [[notify.targets]])",
            file=sys.stderr,
        )
        return EXIT_USAGE
    job = JobInfo(settings.job.name or "notify-test", socket.gethostname(), "notify-test")
    results = send_notify_test(targets, job, settings.notify.timeout_s, time.time())
    for target, error in results:
        if args.json:
            print(json.dumps({"name": target.name, "ok": error is None, "error": error}))
        elif error is None:
            print(f"ok      {target.name}")
        else:
            print(f"FAILED  {target.name}: {error}")
    return 1 if any(error is not None for _, error in results) else 0


def _status(args: argparse.Namespace) -> int:
    from sentinel.status import NoState, gather

    settings = _settings(args)
    state_dir = Path(args.state_dir) if args.state_dir else settings.state_dir
    try:
        status = gather(
            state_dir,
            checkpoints=settings.checkpoints,
            warn_disk_bytes=settings.keep.warn_disk_bytes,
        )
    except NoState as error:
        print(f"sentinel status: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        print("\n".join(status.lines()))
    return 0


def _check_config(args: argparse.Namespace) -> int:
    shown = effective_config(_settings(args))  # secrets masked, whichever the form
    if args.json:
        print(json.dumps(shown, indent=2))
    else:
        print(toml_text.dumps(shown))
    return 0


def _verdict(args: argparse.Namespace) -> int:
    """``sentinel verdict``: print the final verdict's code and exit with it."""
    from sentinel.verdict_wait import await_verdict

    if args.timeout is not None and not args.wait:
        print("sentinel verdict: --timeout bounds --wait; give --wait too", file=sys.stderr)
        return EXIT_USAGE
    state_dir = Path(args.state_dir) if args.state_dir else _settings(args).state_dir
    outcome = await_verdict(
        state_dir, wait=args.wait, timeout_s=args.timeout, job_status=args.job_status
    )
    if outcome.record is not None:
        print(outcome.code)
    else:
        print(f"sentinel verdict: {outcome.reason}", file=sys.stderr)
    return outcome.code


def _demo(args: argparse.Namespace) -> int:
    from sentinel.demo import run_demo

    return run_demo(args.keep, out=sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
