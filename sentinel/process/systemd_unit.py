"""What systemd says about a unit: its main process, its cgroup, how its main process ended.

Read with ``systemctl show -p ...``, whose output is one ``Key=Value`` line per property
asked for (in systemd's own order, not the order asked), so it works for system units
and, with ``systemctl --user``, for a user's units alike.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

#: The properties a unit's state is read from. ``ExecMainPID`` (the last main process,
#: kept after it exits) ties ``ExecMainCode``/``ExecMainStatus`` to one process.
PROPERTIES = (
    "MainPID",
    "ControlGroup",
    "ExecMainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "Result",
    "LoadState",
)
SYSTEMCTL_TIMEOUT_S = 10.0
#: Where cgroup v2 is mounted; a hybrid host keeps systemd's tree under ``systemd/``.
CGROUP_ROOT = Path("/sys/fs/cgroup")

# siginfo codes systemd reports as ExecMainCode (CLD_EXITED, CLD_KILLED, CLD_DUMPED).
_CLD_EXITED = 1
_CLD_KILLED = 2
_CLD_DUMPED = 3


class SystemctlError(OSError):
    """systemctl could not be run, or failed (no systemd, no bus, not permitted)."""


def systemctl_show(
    unit: str, properties: Sequence[str], *, systemctl: Sequence[str] = ("systemctl",)
) -> dict[str, str]:
    """``systemctl show -p P1,P2 UNIT`` as a dict; ``systemctl`` is the command to run
    (``("systemctl", "--user")`` for a user's unit)."""
    argv = [*systemctl, "show", "-p", ",".join(properties), unit]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SystemctlError(f"cannot run {' '.join(argv)}: {exc}") from exc
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        reason = said[-1] if said else f"exit status {done.returncode}"
        raise SystemctlError(f"{' '.join(argv)} failed: {reason}")
    return parse_show(done.stdout)


def parse_show(text: str) -> dict[str, str]:
    """``Key=Value`` lines (the value may hold ``=``); a blank line ends one unit's block."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if values:
                break
            continue
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value
    return values


@dataclass(frozen=True)
class UnitState:
    """One reading of a unit (0 and "" where systemd has nothing to say)."""

    main_pid: int
    control_group: str
    #: The main process last started, kept after it exits; None if systemd did not say.
    exec_main_pid: int | None
    exec_main_code: int
    exec_main_status: int
    #: "success", "exit-code", "signal", "core-dump", "oom-kill", "timeout", "watchdog", ...
    result: str
    load_state: str

    @classmethod
    def parse(cls, values: dict[str, str]) -> UnitState:
        exec_main_pid = values.get("ExecMainPID")
        return cls(
            main_pid=_int(values.get("MainPID")),
            control_group=values.get("ControlGroup", ""),
            exec_main_pid=None if exec_main_pid is None else _int(exec_main_pid),
            exec_main_code=_int(values.get("ExecMainCode")),
            exec_main_status=_int(values.get("ExecMainStatus")),
            result=values.get("Result", ""),
            load_state=values.get("LoadState", ""),
        )

    def exit_status_of(self, pid: int) -> int | None:
        """How main process ``pid`` ended, as a shell reports it (killed by N: 128 + N);
        None while it runs, or when the status systemd holds is another process's."""
        if self.exec_main_pid is not None and self.exec_main_pid != pid:
            return None
        if self.exec_main_pid is None and self.main_pid == pid:
            return None
        if self.exec_main_code == _CLD_EXITED:
            return self.exec_main_status
        if self.exec_main_code in (_CLD_KILLED, _CLD_DUMPED):
            return 128 + self.exec_main_status
        return None


def show_unit(unit: str, *, systemctl: Sequence[str] = ("systemctl",)) -> UnitState:
    """The unit's state now; SystemctlError if systemctl cannot tell."""
    return UnitState.parse(systemctl_show(unit, PROPERTIES, systemctl=systemctl))


def cgroup_pids(control_group: str, *, root: Path = CGROUP_ROOT) -> list[int]:
    """The pids in ``control_group`` and the cgroups below it (empty where unreadable)."""
    if not control_group:
        return []
    relative = control_group.lstrip("/")
    for base in (root, root / "unified", root / "systemd"):
        top = base / relative
        if (top / "cgroup.procs").is_file():
            break
    else:
        return []
    pids: list[int] = []
    for procs in sorted(top.rglob("cgroup.procs")):
        with contextlib.suppress(OSError):
            pids.extend(int(word) for word in procs.read_text().split() if word.isdigit())
    return pids


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0
