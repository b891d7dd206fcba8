"""The options the verbs share, each declared once, and the refusal of those a verb cannot honour.

A verb takes the shared options it honours and refuses the rest: a user who
types ``sentinel replay --notify URL`` learns in one line why replay has no use
for it, rather than argparse's bare "unrecognized arguments", and no verb
accepts an option it would ignore. Options that set a setting map onto it
through ``config.CLI_FIELDS`` (by their dest).
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_USAGE = 2


@dataclass(frozen=True)
class SharedOption:
    """One shared option: its flags (the long one last), its ``-h`` group, its argparse spec."""

    flags: tuple[str, ...]
    group: str
    spec: Mapping[str, Any]

    @property
    def name(self) -> str:
        return self.flags[-1]


SHARED: tuple[SharedOption, ...] = (
    SharedOption(
        ("--config",),
        "input",
        {"type": Path, "metavar": "FILE", "help": "TOML or YAML config file"},
    ),
    SharedOption(
        ("--log",),
        "input",
        {
            "action": "append",
            "metavar": "PATH",
            "help": "log or metrics file, or glob (repeatable)",
        },
    ),
    SharedOption(
        ("--discover",),
        "input",
        {
            "metavar": "DIR",
            "help": "follow the metric files written under DIR as they appear"
            " (run: the job's working directory unless told)",
        },
    ),
    SharedOption(
        ("--reference",),
        "input",
        {
            "metavar": "PATH",
            "help": "a finished run of the same recipe (trainer_state.json, metrics file, log"
            " or run folder): warn when the run leaves its band",
        },
    ),
    SharedOption(
        ("--notify",),
        "notify",
        {"action": "append", "metavar": "URL", "help": "apprise URL to alert (repeatable)"},
    ),
    SharedOption(
        ("--checkpoints",),
        "job control",
        {"metavar": "DIR", "help": "the job's checkpoint directory"},
    ),
    SharedOption(
        ("--state-dir",),
        "job control",
        {"metavar": "DIR", "help": "where sentinel keeps its state"},
    ),
    SharedOption(
        ("--max-restarts",),
        "job control",
        {"type": int, "metavar": "N", "help": "restarts before giving up"},
    ),
    SharedOption(
        ("--resume-command",),
        "job control",
        {"metavar": "CMD", "help": "command to restart with ({checkpoint}, {step})"},
    ),
    SharedOption(
        ("--dry-run",),
        "job control",
        {"action": "store_true", "help": "detect and notify; never signal, move or restart"},
    ),
    SharedOption(
        ("--stop-signal",),
        "job control",
        {
            "metavar": "SIG",
            "help": "first signal to the job's tree (SIGKILL: see docs/rollback.md)",
        },
    ),
    SharedOption(
        ("--pid",),
        "target",
        {
            "type": int,
            "metavar": "PID",
            "help": "the job's process (its tree is the job); watching ends with it",
        },
    ),
    SharedOption(
        ("--pidfile",),
        "target",
        {"metavar": "FILE", "help": "a file naming the job's pid, read again when it is gone"},
    ),
    SharedOption(
        ("--match",),
        "target",
        {"metavar": "REGEX", "help": "the job's command line; its root process is the job"},
    ),
    SharedOption(("--user",), "target", {"metavar": "NAME", "help": "with --match: whose"}),
    SharedOption(
        ("--systemd-unit",),
        "target",
        {"metavar": "UNIT", "help": "the job's systemd unit (MainPID, exit status)"},
    ),
    SharedOption(
        ("--systemd-user",),
        "target",
        {"action": "store_true", "help": "with --systemd-unit: a unit of systemctl --user"},
    ),
    SharedOption(
        ("--wait",),
        "target",
        {"type": float, "metavar": "S", "help": "give up if the job has not appeared in S s"},
    ),
    SharedOption(
        ("--http",),
        "service",
        {"metavar": "ADDR:PORT", "help": "serve /metrics, /livez, /readyz (loopback by default)"},
    ),
    SharedOption(
        ("--metrics-textfile",),
        "service",
        {"metavar": "PATH", "help": "write metrics for node_exporter's textfile collector"},
    ),
    SharedOption(
        ("--verdict-file",),
        "service",
        {"metavar": "PATH", "help": "write the final verdict's code (90, 91, 92) here"},
    ),
    SharedOption(
        ("--drain-timeout",),
        "service",
        {"type": float, "metavar": "S", "help": "on SIGTERM, deliver pending alerts this long"},
    ),
    SharedOption(
        ("--run-id",),
        "service",
        {"metavar": "ID", "help": "the run's id on every node: one verdict, one page (many nodes)"},
    ),
    SharedOption(
        ("--json",), "output", {"action": "store_true", "help": "machine-readable output"}
    ),
    SharedOption(("-v", "--verbose"), "output", {"action": "store_true", "help": "debug logging"}),
)

ALL = tuple(option.name for option in SHARED)
#: The options that say which job ``watch`` attaches to.
TARGET = ("--pid", "--pidfile", "--match", "--user", "--systemd-unit", "--systemd-user", "--wait")


class Refused(argparse.Action):
    """A shared option the verb cannot honour: exit 2 at once with the reason, on one line.

    It takes an optional value, so ``--notify URL`` and ``--notify=URL`` get the
    reason too; it is left out of ``-h``.
    """

    def __init__(self, option_strings: list[str], dest: str, reason: str) -> None:
        super().__init__(
            option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        self.reason = reason

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        verb = parser.prog.rsplit(" ", 1)[-1]
        parser.exit(
            EXIT_USAGE, f"{parser.prog}: {option_string} is not taken by {verb}: {self.reason}\n"
        )


def add_shared(
    parser: argparse.ArgumentParser,
    takes: Collection[str],
    why: str = "",
    because: Mapping[str, str] | None = None,
    own: Collection[str] = (),
) -> None:
    """Add the shared options named in ``takes``; refuse the others.

    A refusal gives ``because[name]``, else ``why``. The options taken show in
    ``-h`` under their group's title. ``own``: names the verb declares itself with a
    meaning of its own (``verdict --wait``), neither taken nor refused here.
    """
    unknown = set(takes) - set(ALL)
    if unknown:
        raise ValueError(f"not shared options: {sorted(unknown)}")
    groups: dict[str, Any] = {}
    for option in SHARED:
        if option.name in own:
            continue  # the verb declares it itself, with a meaning of its own
        if option.name in takes:
            if option.group not in groups:
                groups[option.group] = parser.add_argument_group(option.group)
            groups[option.group].add_argument(*option.flags, **option.spec)
        else:
            reason = (because or {}).get(option.name, why)
            parser.add_argument(*option.flags, action=Refused, reason=reason)
