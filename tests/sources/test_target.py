"""Finding the job to attach to: real reparented processes, real pidfiles, and a stand-in
``systemctl`` on PATH that prints what the real one prints and records what it was asked."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.process.attached import AttachedJob
from sentinel.process.identity import ProcessIdentity
from sentinel.process.systemd_unit import SystemctlError, UnitState, cgroup_pids, parse_show
from sentinel.process.target import (
    MatchTarget,
    PidfileTarget,
    PidTarget,
    SystemdUnitTarget,
    wait_for,
)
from tests.helpers.detached import (
    launch_detached,
    reaped,
    role_argv,
    running,
    start_with_pid,
    wait_for_pid,
    wait_until,
)


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """A folder whose name no other process's command line holds."""
    unique = tmp_path / uuid.uuid4().hex
    unique.mkdir()
    with reaped(unique) as path:
        yield path


def kill(identity: ProcessIdentity) -> None:
    os.kill(identity.pid, signal.SIGKILL)
    wait_until(lambda: not running(identity), what=f"pid {identity.pid} died")


def write_pidfile(path: Path, pid: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid}\n")
    os.replace(tmp, path)


# --- --pid ----------------------------------------------------------------------------------


def test_pid_names_that_process_until_it_ends(folder: Path) -> None:
    launch_detached(role_argv(folder, "sleeper"))
    sleeper = wait_for_pid(folder, "sleeper")
    target = PidTarget(sleeper.pid)

    assert target.find() == sleeper
    kill(sleeper)
    assert target.find() is None
    assert not target.follows_restarts


def test_no_target_resolves_to_sentinel_itself(tmp_path: Path) -> None:
    pidfile = tmp_path / "job.pid"
    write_pidfile(pidfile, os.getpid())

    assert PidTarget(os.getpid()).find() is None
    assert PidfileTarget(pidfile).find() is None


@pytest.mark.slow
def test_a_pid_not_there_at_the_first_look_is_never_found(folder: Path) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    target = PidTarget(done.pid)

    assert target.find() is None
    launch_detached(role_argv(folder, "sleeper"))
    wait_for_pid(folder, "sleeper")
    assert target.find() is None


@pytest.mark.skipif(
    not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK), reason="needs root to reuse a pid"
)
def test_pid_does_not_follow_its_number_to_another_process(folder: Path) -> None:
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    target = PidTarget(first.pid)
    old = target.find()
    first.kill()
    first.wait()
    time.sleep(0.05)  # create times have clock-tick resolution

    second = start_with_pid(first.pid, role_argv(folder, "sleeper"))
    if second is None:
        pytest.skip(f"pid {first.pid} went elsewhere on a busy host")
    try:
        assert wait_for_pid(folder, "sleeper").pid == first.pid
        assert old is not None
        assert target.find() is None
    finally:
        second.kill()
        second.wait()


# --- --pidfile ------------------------------------------------------------------------------


@pytest.mark.slow
def test_pidfile_is_read_again_after_the_target_dies_and_is_replaced(folder: Path) -> None:
    pidfile = folder / "job.pidfile"
    target = PidfileTarget(pidfile)
    assert target.find() is None  # not written yet

    launch_detached(role_argv(folder, "job"))
    first = wait_for_pid(folder, "job")
    write_pidfile(pidfile, first.pid)
    assert target.find() == first

    kill(first)
    assert target.find() is None  # the file still names the dead one

    (folder / "job.pid").unlink()
    launch_detached(role_argv(folder, "job"))
    second = wait_for_pid(folder, "job")
    write_pidfile(pidfile, second.pid)
    assert target.find() == second
    assert target.follows_restarts


@pytest.mark.parametrize("content", ["", "12ab\n", "-5", "0"], ids=["empty", "junk", "neg", "zero"])
def test_a_pidfile_without_a_pid_finds_nothing(tmp_path: Path, content: str) -> None:
    pidfile = tmp_path / "job.pid"
    pidfile.write_text(content)

    assert PidfileTarget(pidfile).find() is None


def test_a_stale_pidfile_naming_a_newer_process_finds_nothing(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    launch_detached(role_argv(folder, "sleeper"))
    sleeper = wait_for_pid(folder, "sleeper")
    pidfile = folder / "old.pidfile"
    write_pidfile(pidfile, sleeper.pid)
    # Written a minute before its process started: the pid was someone else's then.
    written = sleeper.create_time - 60
    os.utime(pidfile, (written, written))

    with caplog.at_level(logging.WARNING):
        assert PidfileTarget(pidfile).find() is None
    assert "stale pidfile" in caplog.text


# --- --match --------------------------------------------------------------------------------


@pytest.mark.slow
def test_match_resolves_to_the_root_not_its_children(folder: Path) -> None:
    launch_detached(role_argv(folder, "job", "tree"))
    roles = {role: wait_for_pid(folder, role) for role in ("job", "child", "grandchild")}
    target = MatchTarget(re.escape(str(folder)))

    assert target.find() == roles["job"]


def test_match_never_resolves_to_sentinel_itself(folder: Path) -> None:
    token = str(folder)
    # A stand-in for sentinel whose own command line matches, and which is older than the job
    # (not pytest itself: under xdist its sibling workers share its command line).
    with subprocess.Popen(
        [sys.executable, "-c", SENTINEL_STAND_IN, re.escape(token), token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as sentinel:
        assert sentinel.stdout is not None and sentinel.stdin is not None
        assert sentinel.stdout.readline().strip() == "ready"
        assert re.search(re.escape(token), " ".join(psutil.Process(sentinel.pid).cmdline()))
        launch_detached(role_argv(folder, "job"))
        job = wait_for_pid(folder, "job")
        sentinel.stdin.write("look\n")
        sentinel.stdin.flush()
        found = sentinel.stdout.readline().strip()
        sentinel.kill()

    assert found == str(job.pid)


SENTINEL_STAND_IN = """
import sys
from sentinel.process.target import MatchTarget
print("ready", flush=True)
sys.stdin.readline()
found = MatchTarget(sys.argv[1]).find()
print(found.pid if found else "none", flush=True)
"""
WRAPPER = """
import subprocess, sys
sys.exit(subprocess.call([sys.executable, "-c", *sys.argv[1:]]))
"""


@pytest.mark.slow
def test_match_never_resolves_to_an_ancestor_of_sentinel(folder: Path) -> None:
    token = str(folder)
    # A wrapper and the sentinel it runs both match, and both are older than the job.
    with subprocess.Popen(
        [sys.executable, "-c", WRAPPER, SENTINEL_STAND_IN, re.escape(token), token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as sentinel:
        assert sentinel.stdout is not None and sentinel.stdin is not None
        assert sentinel.stdout.readline().strip() == "ready"
        wrapper = psutil.Process(sentinel.pid)
        for older in (wrapper, *wrapper.children()):
            assert re.search(re.escape(token), " ".join(older.cmdline()))
        launch_detached(role_argv(folder, "job"))
        job = wait_for_pid(folder, "job")
        sentinel.stdin.write("look\n")
        sentinel.stdin.flush()
        found = sentinel.stdout.readline().strip()
        sentinel.kill()

    assert found == str(job.pid)


@pytest.mark.slow
def test_match_takes_no_job_while_two_unrelated_ones_match(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unrelated job started first and the watched one both match: the oldest was taken,
    the unrelated one, and it got the watched job's SIGTERM. None is taken (said once) until
    one is left."""
    launch_detached(role_argv(folder, "sleeper"))
    other = wait_for_pid(folder, "sleeper")
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    target = MatchTarget(re.escape(str(folder)))
    with caplog.at_level(logging.WARNING):
        assert target.find() is None
        assert target.find() is None
    assert caplog.text.count("not guessing which is the job") == 1
    assert f"pids {min(other.pid, job.pid)}, {max(other.pid, job.pid)}" in caplog.text
    os.kill(other.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while target.find() != job:
        assert time.monotonic() < deadline, "the one job left was not found"
        time.sleep(0.05)


@pytest.mark.slow
def test_match_with_user(folder: Path) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    owner = psutil.Process(job.pid).username()
    other = "nobody" if owner != "nobody" else "root"

    assert MatchTarget(re.escape(str(folder)), user=owner).find() == job
    assert MatchTarget(re.escape(str(folder)), user=other).find() is None


@pytest.mark.slow
def test_match_finds_the_next_attempt_after_the_job_ends(folder: Path) -> None:
    target = MatchTarget(re.escape(str(folder)))
    assert target.find() is None
    launch_detached(role_argv(folder, "job"))
    first = wait_for_pid(folder, "job")
    assert target.find() == first

    kill(first)
    assert target.find() is None
    (folder / "job.pid").unlink()
    launch_detached(role_argv(folder, "job"))
    second = wait_for_pid(folder, "job")
    assert target.find() == second


def test_match_refuses_a_bad_pattern_or_an_unknown_user() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        MatchTarget("train(")
    with pytest.raises(ValueError, match="no such user"):
        MatchTarget("train", user="no-such-user-" + uuid.uuid4().hex[:8])


# --- --systemd-unit -------------------------------------------------------------------------

#: The order systemd prints these in (its D-Bus property order), whatever order -p asks.
SYSTEMD_ORDER = (
    "MainPID",
    "Result",
    "ExecMainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "ControlGroup",
    "LoadState",
)
NOT_FOUND = {
    "MainPID": "0",
    "Result": "success",
    "ExecMainPID": "0",
    "ExecMainCode": "0",
    "ExecMainStatus": "0",
    "ControlGroup": "",
    "LoadState": "not-found",
}
SYSTEMCTL = """\
#!{python}
import json, sys
from pathlib import Path
here = Path({here!r})
with open(here / "asked.jsonl", "a") as asked:
    asked.write(json.dumps(sys.argv[1:]) + "\\n")
units = json.loads((here / "units.json").read_text())
if "fail" in units:
    print(units["fail"], file=sys.stderr)
    sys.exit(1)
args = [a for a in sys.argv[1:] if a != "--user"]
assert args[0] == "show" and args[1] == "-p", args
wanted = args[2].split(",")
unit = units.get(args[3], {not_found!r})
for key in {order!r}:
    if key in wanted:
        print(f"{{key}}={{unit[key]}}")
"""


class StandInSystemd:
    """The units the stand-in ``systemctl`` reports, and what it was asked."""

    def __init__(self, here: Path) -> None:
        self.here = here
        self.units: dict[str, dict[str, str]] = {}
        self.set_units({})

    def set_units(self, units: dict[str, dict[str, str]]) -> None:
        tmp = self.here / "units.tmp"
        tmp.write_text(json.dumps(units))
        os.replace(tmp, self.here / "units.json")

    def running(self, unit: str, pid: int, control_group: str = "") -> None:
        self.set_units(
            {
                unit: {
                    "MainPID": str(pid),
                    "Result": "success",
                    "ExecMainPID": str(pid),
                    "ExecMainCode": "0",
                    "ExecMainStatus": "0",
                    "ControlGroup": control_group or f"/system.slice/{unit}",
                    "LoadState": "loaded",
                }
            }
        )

    def ended(self, unit: str, pid: int, code: int, status: int, result: str) -> None:
        self.set_units(
            {
                unit: {
                    "MainPID": "0",
                    "Result": result,
                    "ExecMainPID": str(pid),
                    "ExecMainCode": str(code),
                    "ExecMainStatus": str(status),
                    "ControlGroup": "",
                    "LoadState": "loaded",
                }
            }
        )

    def asked(self) -> list[list[str]]:
        path = self.here / "asked.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandInSystemd:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(
        SYSTEMCTL.format(
            python=sys.executable, here=str(tmp_path), not_found=NOT_FOUND, order=SYSTEMD_ORDER
        )
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return StandInSystemd(tmp_path)


def test_parse_show_reads_real_systemctl_output() -> None:
    text = textwrap.dedent(
        """\
        MainPID=4242
        Result=success
        ExecMainPID=4242
        ExecMainCode=0
        ExecMainStatus=0
        ControlGroup=/system.slice/system-train.slice/train@run-7.service
        Environment=A=1 B=x=y

        MainPID=1
        """
    )

    values = parse_show(text)
    state = UnitState.parse(values)

    assert values["Environment"] == "A=1 B=x=y"
    assert state.main_pid == 4242
    assert state.control_group == "/system.slice/system-train.slice/train@run-7.service"
    assert state.exit_status_of(4242) is None  # still running


@pytest.mark.parametrize(
    ("code", "status", "result", "expected"),
    [
        (1, 0, "success", 0),
        (1, 3, "exit-code", 3),
        (2, 15, "signal", 143),
        (2, 9, "oom-kill", 137),
        (3, 6, "core-dump", 134),
    ],
    ids=["success", "exit-code", "signal", "oom-kill", "core-dump"],
)
def test_exit_status_from_exec_main_code_and_status(
    code: int, status: int, result: str, expected: int
) -> None:
    values = {
        "MainPID": "0",
        "ExecMainPID": "77",
        "ExecMainCode": str(code),
        "ExecMainStatus": str(status),
        "Result": result,
    }

    state = UnitState.parse(values)

    assert state.exit_status_of(77) == expected
    assert state.exit_status_of(78) is None  # another process's status


@pytest.mark.slow
def test_systemd_unit_main_pid_is_found_and_its_exit_status_read(
    folder: Path, systemd: StandInSystemd
) -> None:
    unit = "train@run-7.service"
    target = SystemdUnitTarget(unit)
    assert target.find() is None  # systemd knows no such unit yet

    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    systemd.running(unit, job.pid)
    assert target.find() == job
    assert target.control_group == f"/system.slice/{unit}"
    asked = systemd.asked()[-1]
    assert asked[0] == "show" and asked[-1] == unit
    assert {"MainPID", "ControlGroup", "ExecMainStatus", "ExecMainCode", "Result"} <= set(
        asked[asked.index("-p") + 1].split(",")
    )

    exits: list[int | None] = []
    attached = AttachedJob(job, on_exit=exits.append, exit_status=target.exit_status)
    attached.start()
    os.kill(job.pid, signal.SIGTERM)  # the job exits 0 on SIGTERM; systemd would say so
    wait_until(lambda: not running(job), what="the job ended")
    time.sleep(0.2)  # systemd takes a moment to notice: exit_status waits for it
    systemd.ended(unit, job.pid, code=1, status=0, result="success")
    assert attached.wait(5.0)
    wait_until(lambda: bool(exits), what="on_exit was called")
    assert exits == [0]
    attached.stop()

    # Restarted by systemd: the new main process is the next attempt.
    (folder / "job.pid").unlink()
    launch_detached(role_argv(folder, "job"))
    second = wait_for_pid(folder, "job")
    systemd.running(unit, second.pid)
    assert target.find() == second


def test_an_exit_status_of_an_earlier_main_process_is_not_taken(
    folder: Path, systemd: StandInSystemd
) -> None:
    unit = "train.service"
    systemd.ended(unit, 99999, code=2, status=9, result="signal")
    target = SystemdUnitTarget(unit, settle_s=0.1)

    assert target.exit_status(ProcessIdentity(12345, 1.0)) is None


def test_a_unit_systemd_does_not_know_is_said_once(
    systemd: StandInSystemd, caplog: pytest.LogCaptureFixture
) -> None:
    target = SystemdUnitTarget("trian.service")

    with caplog.at_level(logging.WARNING):
        assert target.find() is None
        assert target.find() is None

    assert caplog.text.count("systemd knows no unit trian.service") == 1


def test_systemctl_that_fails_is_reported_not_raised_by_find(
    systemd: StandInSystemd, caplog: pytest.LogCaptureFixture
) -> None:
    systemd.set_units({"fail": "Failed to connect to bus: Host is down"})  # type: ignore[dict-item]
    target = SystemdUnitTarget("train.service")

    with caplog.at_level(logging.WARNING):
        assert target.find() is None
    assert "Failed to connect to bus: Host is down" in caplog.text
    with pytest.raises(SystemctlError, match="Host is down"):
        target.show()


@pytest.mark.slow
def test_a_users_unit_is_asked_with_systemctl_user(folder: Path, systemd: StandInSystemd) -> None:
    launch_detached(role_argv(folder, "job"))
    job = wait_for_pid(folder, "job")
    systemd.running("train.service", job.pid)

    found = SystemdUnitTarget("train.service", systemctl=("systemctl", "--user")).find()

    assert found == job
    assert all(argv[0] == "--user" for argv in systemd.asked())


@pytest.mark.slow
def test_members_are_the_processes_in_the_units_cgroup(folder: Path, tmp_path: Path) -> None:
    launch_detached(role_argv(folder, "job", "tree"))
    roles = {role: wait_for_pid(folder, role) for role in ("job", "child", "grandchild")}
    # Laid out as cgroupfs is: the unit's cgroup.procs, and a sub-cgroup of its own.
    unit_dir = tmp_path / "cgroup" / "system.slice" / "train.service"
    (unit_dir / "worker").mkdir(parents=True)
    (unit_dir / "cgroup.procs").write_text(f"{roles['job'].pid}\n{roles['child'].pid}\n")
    (unit_dir / "worker" / "cgroup.procs").write_text(f"{roles['grandchild'].pid}\n")
    target = SystemdUnitTarget("train.service", cgroup_root=tmp_path / "cgroup")
    target.control_group = "/system.slice/train.service"

    assert set(target.members()) == set(roles.values())
    assert cgroup_pids("/system.slice/none.service", root=tmp_path / "cgroup") == []


# --- waiting --------------------------------------------------------------------------------


@pytest.mark.slow
def test_wait_for_returns_once_the_target_appears_and_says_once_that_it_waits(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pidfile = folder / "job.pidfile"
    launch_detached(role_argv(folder, "sleeper"))
    sleeper = wait_for_pid(folder, "sleeper")
    writer = threading.Timer(0.3, write_pidfile, (pidfile, sleeper.pid))
    writer.start()

    with caplog.at_level(logging.INFO, logger="sentinel.process.target"):
        found = wait_for(PidfileTarget(pidfile), stop=threading.Event(), interval_s=0.05)

    writer.join()
    assert found == sleeper
    assert caplog.text.count("waiting for pidfile") == 1


@pytest.mark.slow
def test_wait_for_gives_up_on_stop_or_timeout(tmp_path: Path) -> None:
    target = PidfileTarget(tmp_path / "never.pid")
    stop = threading.Event()
    stop.set()

    assert wait_for(target, stop=stop, interval_s=10.0) is None
    started = time.monotonic()
    assert wait_for(target, stop=threading.Event(), interval_s=0.05, timeout_s=0.2) is None
    assert 0.15 <= time.monotonic() - started < 2.0
