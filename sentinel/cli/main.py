"""The ``sentinel`` command: its parser, its logging, and the dispatch to each verb.

Each verb's options and handler are in its module of ``sentinel/cli/verbs/``. Only
``sentinel/cli/main.py`` and ``sentinel/cli/verbs/`` print to the terminal or exit.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TextIO

from sentinel import __version__
from sentinel.cli import startup
from sentinel.cli.options import EXIT_USAGE
from sentinel.cli.verbs import (
    Command,
    check_config,
    checkpoints,
    demo,
    notify_test,
    replay,
    run,
    status,
    verdict,
    watch,
)
from sentinel.config import CLI_FIELDS, ConfigError, setting_default
from sentinel.config.addresses import CannotListen
from sentinel.model import secrets, terminal
from sentinel.model.untrusted import PrintableFilter, printable
from sentinel.store import verdict as verdict_codes
from sentinel.store.lock import StateDirLocked
from sentinel.store.state import StateDirUnusable

__all__ = ["EXIT_USAGE", "build_parser", "main"]

log = logging.getLogger("sentinel")

# The verbs, in the order ``sentinel --help`` lists them.
COMMANDS: dict[str, Command] = {
    command.VERB: command
    for command in (
        run,
        watch,
        replay,
        checkpoints,
        notify_test,
        status,
        check_config,
        demo,
        verdict,
    )
}


def build_parser() -> argparse.ArgumentParser:
    """The verbs; each takes the shared options it honours and refuses the rest (``options``)."""
    parser = argparse.ArgumentParser(
        prog="sentinel",
        description="A watchdog for ML training jobs: catches NaN, stalls and crashes,\n"
        "notifies, rolls back to the last clean checkpoint and restarts.",
        epilog=_exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sentinel {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for command in COMMANDS.values():
        command.add_parser(verbs)
    for verb in verbs.choices.values():
        _say_defaults(verb)
    return parser


def _say_defaults(parser: argparse.ArgumentParser) -> None:
    """Each option's default at the end of its ``-h`` line: the setting's default for an
    option that sets one (its argparse default is None, so that a config file's value
    stands), else argparse's own. Flags, and options with no default, say nothing."""
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        if isinstance(action, argparse._StoreConstAction | argparse._HelpAction):
            continue  # store_true/false, --help, --version: a flag has no value to show
        path = CLI_FIELDS.get(action.dest)
        default = setting_default(path) if path is not None else action.default
        if default in (None, "", [], (), argparse.SUPPRESS) or isinstance(default, bool):
            continue
        action.help = f"{action.help} (default: {str(default).replace('%', '%%')})"


def _exit_codes() -> str:
    """The exit-code table of ``sentinel --help`` (a contract: the manual (docs/), "Commands")."""
    rows = [
        ("0", "run: the job finished (after restarts, if any); watch: stopped"),
        ("1", "replay --fail-on: an alert that severe; verdict: no verdict and no --job-status"),
        ("2", "a usage or config error, or another sentinel holds the state dir"),
        *((str(code), meaning) for code, (_, meaning) in sorted(verdict_codes.CODES.items())),
        (
            str(verdict_codes.EXIT_UNREADABLE),
            "verdict: a verdict may be there but cannot be read (do not retry: it may be 90)",
        ),
        ("other", "run: the job's own last status; verdict: --job-status when no verdict came"),
    ]
    return "exit codes:\n" + "\n".join(f"  {code:<6} {meaning}" for code, meaning in rows)


def main(argv: Sequence[str] | None = None) -> int:
    startup.release()  # the job sentinel launches gets the environment as it was
    parser = build_parser()
    args = parser.parse_args(argv)
    secrets.install_excepthooks()
    _setup_logging(getattr(args, "verbose", False))
    try:
        return COMMANDS[args.verb].handle(args)
    except ConfigError as error:
        for problem in error.problems:  # one line each, whatever the value held
            print(printable(f"sentinel: config error: {problem}"), file=sys.stderr)
        return EXIT_USAGE
    except CannotListen as error:  # --http: in use, not this host's address, unresolvable
        print(printable(f"sentinel: --http: {error.strerror}"), file=sys.stderr)
        return EXIT_USAGE
    except (StateDirLocked, StateDirUnusable) as error:
        print(printable(f"sentinel: {error}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Whoever read stdout went away (``sentinel replay --json | head -1``): no traceback,
        # and nothing more written to the closed pipe at exit; the status a shell gives a
        # command SIGPIPE ended.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as error:  # the last word: its traceback may quote a URL's token
        secrets.print_exception(error)
        return 1


class _LineStartHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each record at the start of a line of the terminal, never after the job's
    half-drawn progress bar (``sentinel.model.terminal``)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._to_terminal = terminal.is_terminal(stream)

    def emit(self, record: logging.LogRecord) -> None:
        if self._to_terminal and terminal.take_mid_line():
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("\n")
        super().emit(record)


def _setup_logging(verbose: bool) -> None:
    handler = _LineStartHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("[sentinel %(asctime)s] %(levelname)s %(message)s", "%H:%M:%S")
    )
    secrets.install(handler)  # on the handler: masks the records of every logger reaching it
    # A path or the job's words in a message: shown with its control characters escaped.
    handler.addFilter(PrintableFilter())
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


if __name__ == "__main__":
    raise SystemExit(main())
