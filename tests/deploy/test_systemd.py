"""The systemd units in ``systemd/``: valid to systemd, hardened, and doing what they say.

There is no systemd as PID 1 here. So:

- ``systemd-analyze verify`` checks each unit as shipped, under ``--root`` (a temp tree with
  the host's ``/usr/lib/systemd/system`` for the default dependencies, and stand-in
  executables at the absolute ExecStart= paths, which verify insists exist: they are
  only for verify, never run). It exits 0 on errors, so its stderr must be empty.
- ``systemd-analyze security --offline=true`` scores ``sentinel@.service``.
- A stand-in for systemd runs the units' ExecStart= command lines for real, as systemd would
  (specifiers and ``$$`` resolved, the EnvironmentFile= read, StandardOutput=append:, a
  notify socket, Restart= and RestartPreventExitStatus= decided from the unit), with /srv,
  /opt, /etc, /run, /var under a temp dir. It does not switch to User=, sandbox, or wait
  RestartSec=.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy import ptrace_probe
from tests.deploy.standin import TRAIN_PY
from tests.helpers.webhook import WebhookReceiver

UNITS_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNITS = ("sentinel@.service", "train@.service", "sentinel-run@.service")
ENV_EXAMPLE = UNITS_DIR / "sentinel.env.example"
HOST_UNITS = Path("/usr/lib/systemd/system")
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None or not HOST_UNITS.is_dir(),
    reason="systemd-analyze (or /usr/lib/systemd/system) is missing on this machine:"
    " the units are not checked against systemd here",
)
MAX_EXPOSURE = 3.0
#: A unit file: its sections' settings, in order (a key may repeat).
Unit = dict[str, list[tuple[str, str]]]


# --- reading a unit as systemd does ---------------------------------------------------------


def read_unit(path: Path) -> Unit:
    """Sections of ``Key=Value`` settings, in order; continuation lines joined, comments dropped."""
    sections: Unit = {}
    current: list[tuple[str, str]] = []
    logical = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            logical += line[:-1].rstrip() + " "
            continue
        logical += line
        if logical.startswith("["):
            current = sections.setdefault(logical.strip("[]"), [])
        else:
            key, _, value = logical.partition("=")
            current.append((key.strip(), value.strip()))
        logical = ""
    return sections


def values(unit: Unit, key: str, section: str = "Service") -> list[str]:
    return [value for name, value in unit.get(section, []) if name == key]


def value(unit: Unit, key: str, section: str = "Service") -> str:
    found = values(unit, key, section)
    assert found, f"{key}= is not set in [{section}]"
    return found[-1]


def option(argv: list[str], name: str) -> str:
    """The value after ``name`` in a command line."""
    assert name in argv, f"{name} not in {argv}"
    return argv[argv.index(name) + 1]


def exec_start(unit: Unit) -> list[str]:
    return shlex.split(value(unit, "ExecStart"))


@pytest.fixture(scope="module")
def units() -> dict[str, Unit]:
    return {name: read_unit(UNITS_DIR / name) for name in UNITS}


# --- systemd-analyze ------------------------------------------------------------------------


def _analyze_root(into: Path, units: dict[str, Path]) -> Path:
    """A tree for ``systemd-analyze --root``: the units, the host's units, stand-in binaries."""
    shutil.copytree(HOST_UNITS, into / "usr/lib/systemd/system", symlinks=True)
    unit_dir = into / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    for name, path in units.items():
        shutil.copy(path, unit_dir / name)
        for binary in values(read_unit(path), "ExecStart"):
            stand_in = into / shlex.split(binary)[0].lstrip("/")
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text("#!/bin/sh\nexit 0\n")  # only for verify: never run
            stand_in.chmod(0o755)
    return into


def _verify(root: Path, unit: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, f"--root={root}", "verify", unit],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.slow
@needs_analyze
@pytest.mark.parametrize("template", UNITS)
def test_systemd_analyze_verify_has_nothing_to_say(tmp_path: Path, template: str) -> None:
    root = _analyze_root(tmp_path, {name: UNITS_DIR / name for name in UNITS})
    instance = template.replace("@.", "@run1.")

    done = _verify(root, instance)

    assert done.stderr == "", done.stderr
    assert done.returncode == 0


@needs_analyze
def test_verify_would_report_a_bad_setting(tmp_path: Path) -> None:
    """The check above can fail: verify names a bad value on stderr (and still exits 0)."""
    broken = tmp_path / "sentinel@.service"
    text = (UNITS_DIR / "sentinel@.service").read_text()
    broken.write_text(text.replace("WatchdogSec=60s", "WatchdogSec=soon"))
    root = _analyze_root(tmp_path / "root", {"sentinel@.service": broken})

    done = _verify(root, "sentinel@run1.service")

    assert "Failed to parse sec value" in done.stderr


@needs_analyze
def test_sentinel_unit_exposure_is_3_or_less(tmp_path: Path) -> None:
    assert ANALYZE is not None
    shutil.copy(UNITS_DIR / "sentinel@.service", tmp_path)
    done = subprocess.run(
        [ANALYZE, "security", "--offline=true", "./sentinel@.service"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+) (\w+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found[1]) <= MAX_EXPOSURE, done.stdout


# --- what the units say, beyond what systemd checks -----------------------------------------


def test_sentinel_unit_is_a_notify_service_beside_its_job(units: dict[str, Unit]) -> None:
    sentinel = units["sentinel@.service"]
    assert value(sentinel, "Type") == "notify"
    assert value(sentinel, "WatchdogSec")
    assert value(sentinel, "PartOf", "Unit") == "train@%i.service"
    assert value(sentinel, "WantedBy", "Install") == "train@%i.service"
    assert value(sentinel, "StateDirectory") == "sentinel/%i"
    assert value(sentinel, "User") == value(units["train@.service"], "User")
    argv = exec_start(sentinel)
    assert argv[1] == "watch"
    # Rollback moves checkpoints: the one path it may write besides its state dir.
    assert value(sentinel, "ReadWritePaths") == option(argv, "--checkpoints")
    assert option(argv, "--state-dir") == "%S/" + value(sentinel, "StateDirectory")


def test_sentinel_unit_hardening_leaves_it_able_to_watch(units: dict[str, Unit]) -> None:
    sentinel = units["sentinel@.service"]
    settings = dict(sentinel["Service"])
    # Each of these hides the job, the GPU or the kernel log from sentinel (research file).
    assert settings.get("PrivateDevices", "no") == "no"
    assert settings.get("ProtectKernelLogs", "no") == "no"
    assert settings.get("ProtectProc", "default") in ("default", "ptraceable")
    assert settings.get("ProcSubset", "all") == "all"
    for key in ("PrivateUsers", "PrivatePIDs", "PrivateNetwork", "MemoryDenyWriteExecute"):
        assert settings.get(key, "no") == "no", key
    assert "char-nvidia* rw" in values(sentinel, "DeviceAllow")
    assert "/dev/kmsg r" in values(sentinel, "DeviceAllow")
    ambient = set(value(sentinel, "AmbientCapabilities").split())
    assert ambient == {"CAP_SYS_PTRACE", "CAP_SYSLOG"}
    assert ambient <= set(value(sentinel, "CapabilityBoundingSet").split()), "else dropped"
    allowed = values(sentinel, "SystemCallFilter")[0].split()
    assert {"ptrace", "process_vm_readv"} <= set(allowed), "what py-spy attaches with"


@pytest.mark.slow
@needs_analyze
def test_sentinel_unit_syscall_filter_denies_nothing_py_spy_needs(units: dict[str, Unit]) -> None:
    """The deny list (~@privileged ...) does not take back ptrace or process_vm_readv."""
    assert ANALYZE is not None
    denied: set[str] = set()
    for setting in values(units["sentinel@.service"], "SystemCallFilter"):
        if setting.startswith("~"):
            for name in setting[1:].split():
                denied |= _syscalls(name) if name.startswith("@") else {name}
    assert "setuid" in denied, "the deny list was read"
    assert not {"ptrace", "process_vm_readv"} & denied


def _syscalls(group: str) -> set[str]:
    """The system calls of a systemd group, nested groups expanded."""
    assert ANALYZE is not None
    listed = subprocess.run(
        [ANALYZE, "syscall-filter", group], capture_output=True, text=True, timeout=30, check=True
    ).stdout.splitlines()[1:]
    names = {line.strip() for line in listed if line.strip() and not line.strip().startswith("#")}
    found = {name for name in names if not name.startswith("@")}
    for nested in names - found:
        found |= _syscalls(nested)
    return found


@pytest.mark.slow
def test_sentinel_units_capabilities_reach_the_py_spy_it_runs(
    units: dict[str, Unit], tmp_path: Path
) -> None:
    """sentinel@'s CapabilityBoundingSet=, AmbientCapabilities= and NoNewPrivileges=, applied
    as systemd applies them to a non-root User=, let the py-spy sentinel starts read a job
    that is not its descendant (another user's: CAP_SYS_PTRACE is what allows both that and
    Yama's scope 1). Without the ambient capabilities the kernel refuses it."""
    reason = ptrace_probe.skip_reason()
    if reason:
        pytest.skip(reason)
    sentinel = units["sentinel@.service"]
    assert value(sentinel, "User") != "root"

    def caps(key: str) -> str:
        return ",".join(["-all", *(f"+{c.lower().removeprefix('cap_')}"
                                   for c in value(sentinel, key).split())])  # fmt: skip

    python = ptrace_probe.system_python()
    assert python is not None
    where = Path(tempfile.mkdtemp(prefix="sentinel-unit-"))
    try:
        where.chmod(0o755)
        py_spy = where / "py-spy"
        shutil.copy2(ptrace_probe.py_spy(), py_spy)
        no_new_privs = value(sentinel, "NoNewPrivileges") == "yes"
        unit_caps = ptrace_probe.as_user(
            ptrace_probe.SENTINEL_UID, [python, "-c", ptrace_probe.STAND_IN],
            bounding=caps("CapabilityBoundingSet"), ambient=caps("AmbientCapabilities"),
            no_new_privs=no_new_privs,
        )  # fmt: skip
        no_caps = ptrace_probe.as_user(
            ptrace_probe.SENTINEL_UID, [python, "-c", ptrace_probe.STAND_IN],
            bounding=caps("CapabilityBoundingSet"), no_new_privs=no_new_privs,
        )  # fmt: skip
        with ptrace_probe.stuck_job() as pid:
            taken = ptrace_probe.dump(unit_caps, py_spy, pid)
            assert taken["rc"] == 0, taken
            assert ptrace_probe.STUCK_IN in str(taken["out"])
            refused = ptrace_probe.dump(no_caps, py_spy, pid)
            assert refused["rc"] != 0 and "permission denied" in str(refused["err"]).lower()
    finally:
        shutil.rmtree(where)


def test_secrets_come_from_the_environment_file_never_the_units() -> None:
    for name in UNITS:
        unit = read_unit(UNITS_DIR / name)
        settings = [(k, v) for section in unit.values() for k, v in section if k != "Documentation"]
        for key, setting in settings:
            assert "://" not in setting, f"{name}: {key}={setting}"
            assert "--notify" not in setting, f"{name}: {key}"
        if name.startswith("sentinel"):
            assert value(unit, "EnvironmentFile") == "/etc/sentinel/%i.env"


def test_train_unit_hands_sentinel_its_pid_output_and_verdict(units: dict[str, Unit]) -> None:
    train, sentinel = units["train@.service"], units["sentinel@.service"]
    watch = exec_start(sentinel)
    assert value(train, "Restart") == "on-failure"
    # 90 give up; 92 a node fault (on a workstation the same GPU again); 94 unreadable verdict.
    assert {"90", "92", "94"} <= set(value(train, "RestartPreventExitStatus").split())
    assert "91" not in value(train, "RestartPreventExitStatus").split()
    assert value(train, "StandardOutput") == "append:" + option(watch, "--log")
    assert "PYTHONUNBUFFERED=1" in values(train, "Environment"), "lines reach the log at once"
    shell = exec_start(train)
    assert shell[:2] == ["/bin/sh", "-c"]
    script = shell[2].replace("$$", "$")
    assert f"echo $! > {option(watch, '--pidfile')};" in script
    verdict = shlex.split(script.rpartition("exec ")[2])
    assert verdict[1:2] == ["verdict"]
    assert option(verdict, "--state-dir") == option(watch, "--state-dir")
    assert option(verdict, "--job-status") == "$?"


def test_run_variant_states_its_trade_off(units: dict[str, Unit]) -> None:
    run = units["sentinel-run@.service"]
    argv = exec_start(run)
    assert argv[1] == "run" and "--" in argv
    assert {"90", "92"} <= set(value(run, "RestartPreventExitStatus").split())
    assert "kills the job" in (UNITS_DIR / "sentinel-run@.service").read_text()
    # The job inherits whatever ambient capability sentinel holds: none is given, and the
    # unit says where its stacks can be taken instead.
    assert values(run, "AmbientCapabilities") == []
    assert "ptrace_scope is 0" in (UNITS_DIR / "sentinel-run@.service").read_text()


def read_env_file(path: Path) -> dict[str, str]:
    """An EnvironmentFile= as systemd reads it: VAR=value lines, # and ; comments, quotes."""
    found: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, text = line.partition("=")
        assert sep, f"not VAR=value: {raw!r}"
        text = text.strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            text = text[1:-1]
        found[key.strip()] = text
    return found


@pytest.mark.slow
def test_env_file_example_is_a_valid_config_with_its_secrets_masked() -> None:
    env = read_env_file(ENV_EXAMPLE)
    assert "SENTINEL_NOTIFY__URLS" in env
    done = subprocess.run(
        [sys.executable, "-m", "sentinel", "check-config", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, **env}, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    assert len(config["notify"]["urls"]) == 2
    assert "password" not in done.stdout


# --- a stand-in for systemd, running the units' command lines -------------------------------


@dataclass
class StandInSystemd:
    """Runs a unit's ExecStart= as systemd would, under ``root``; records what it ran."""

    root: Path
    notify_socket: Path
    asked: list[tuple[str, list[str]]] = field(default_factory=list)
    notified: list[str] = field(default_factory=list)

    def resolve(self, text: str, instance: str) -> str:
        """Specifiers, ``$$``, and the system paths moved under the temp root."""
        specifiers = {"%i": instance, "%t": "/run", "%S": "/var/lib", "%L": "/var/log"}
        text = re.sub(r"%[a-zA-Z%]", lambda m: specifiers.get(m[0], m[0]), text)
        assert "%" not in text, f"a specifier the stand-in does not know: {text}"
        assert not re.search(r"(?<!\$)\$(?!\$)", text), f"an unescaped $ in {text}"
        text = text.replace("$$", "$")
        return re.sub(r"(?<![\w./-])/(srv|opt|etc|run|var)/", rf"{self.root}/\1/", text)

    def start(self, template: str, instance: str) -> subprocess.Popen[bytes]:
        unit = read_unit(UNITS_DIR / template)
        name = template.replace("@.", f"@{instance}.")
        env = {"PATH": os.environ["PATH"], "INVOCATION_ID": os.urandom(16).hex()}
        for path in values(unit, "EnvironmentFile"):
            optional = path.startswith("-")
            file = Path(self.resolve(path.lstrip("-"), instance))
            if file.exists() or not optional:
                env.update(read_env_file(file))
        for key, base in (("RuntimeDirectory", "run"), ("StateDirectory", "var/lib")):
            for directory in values(unit, key):
                (self.root / base / self.resolve(directory, instance)).mkdir(
                    parents=True, exist_ok=True
                )
        if value(unit, "Type") == "notify":
            env["NOTIFY_SOCKET"] = str(self.notify_socket)
            if values(unit, "WatchdogSec"):
                seconds = int(value(unit, "WatchdogSec").removesuffix("s"))
                env["WATCHDOG_USEC"] = str(seconds * 1_000_000)
        # StandardOutput=append:FILE, else what journald would get: a file of its own here.
        outputs = values(unit, "StandardOutput")
        if outputs and outputs[-1].startswith("append:"):
            output = Path(self.resolve(outputs[-1].removeprefix("append:"), instance))
        else:
            output = self.journal(name)
        cwd = str(self.root)
        if values(unit, "WorkingDirectory"):
            cwd = self.resolve(value(unit, "WorkingDirectory"), instance)
        argv = shlex.split(self.resolve(value(unit, "ExecStart"), instance))
        self.asked.append((name, argv))
        with output.open("ab") as out:
            return subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def journal(self, name: str) -> Path:
        return self.root / f"journal-{name}.log"

    @staticmethod
    def restarts(template: str, status: int) -> bool:
        """Whether Restart=on-failure with RestartPreventExitStatus= restarts after ``status``."""
        unit = read_unit(UNITS_DIR / template)
        assert value(unit, "Restart") == "on-failure"
        prevent = {int(word) for word in " ".join(values(unit, "RestartPreventExitStatus")).split()}
        return status != 0 and status not in prevent

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """The notify socket: records each line sent to it."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(self.notify_socket))
            sock.settimeout(0.2)
            stop = threading.Event()

            def receive() -> None:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        self.notified.extend(sock.recv(4096).decode().splitlines())

            thread = threading.Thread(target=receive, daemon=True)
            thread.start()
            try:
                yield
            finally:
                stop.set()
                thread.join()


def _wait_for(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _install(root: Path, hook: WebhookReceiver) -> None:
    """What the README's recipe installs, under ``root``; stand-ins for the two programs."""
    sentinel = root / "opt/sentinel/bin/sentinel"
    python = root / "srv/train/venv/bin/python"
    for path, target in ((sentinel, f"{sys.executable} -m sentinel"), (python, sys.executable)):
        path.parent.mkdir(parents=True)
        path.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        path.chmod(0o755)
    run_dir = root / "srv/train/run1"
    run_dir.mkdir(parents=True)
    (run_dir / "train.py").write_text(TRAIN_PY)
    (root / "var/log/train").mkdir(parents=True)
    (root / "var/lib/sentinel").mkdir(parents=True)
    env_file = root / "etc/sentinel/run1.env"
    env_file.parent.mkdir(parents=True)
    example = ENV_EXAMPLE.read_text()
    # The alerts go to a local receiver; sooner than the defaults would send them.
    urls = f"SENTINEL_NOTIFY__URLS={hook.url}"
    example = re.sub(r"(?m)^SENTINEL_NOTIFY__URLS=.*$", urls, example)
    faster = "SENTINEL_NOTIFY__GROUP_WAIT_S=0\nSENTINEL_JOB__GRACE_PERIOD_S=5\n"
    env_file.write_text(example + faster)
    env_file.chmod(0o600)


@pytest.mark.slow
def test_units_command_lines_roll_back_exit_91_and_the_restart_resumes_clean(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    with tempfile.TemporaryDirectory(prefix="sd") as short, WebhookReceiver() as hook:
        _install(root, hook)
        systemd = StandInSystemd(root, Path(short) / "notify")
        run_dir, ckpt = root / "srv/train/run1", root / "srv/train/run1/checkpoints"
        with systemd.listening():
            # systemctl enable --now train@run1 sentinel@run1: sentinel@ is After=train@.
            first = systemd.start("train@.service", "run1")
            sentinel = systemd.start("sentinel@.service", "run1")
            second = None
            try:
                assert first.wait(timeout=90) == 91, "the wrapper exits with the verdict"
                verdict_file = root / "var/lib/sentinel/run1/verdict"
                assert verdict_file.read_text().strip() == "91"
                assert systemd.restarts("train@.service", 91)
                assert not systemd.restarts("train@.service", 90)
                assert not systemd.restarts("train@.service", 92), "the same GPU again"
                assert not systemd.restarts("train@.service", 94), "an unread verdict"
                second = systemd.start("train@.service", "run1")  # Restart=on-failure
                assert second.wait(timeout=90) == 0, "attempt 2 trains to the end"
                hook.wait_for(1, timeout=30)
                _wait_for(lambda: "READY=1" in systemd.notified)
            finally:
                sentinel.terminate()  # systemctl stop: SIGTERM
                sentinel.wait(timeout=60)
                for job in (first, second):
                    if job is not None and job.poll() is None:
                        os.killpg(job.pid, signal.SIGKILL)
                        job.wait()
    err = systemd.journal("sentinel@run1.service").read_text()
    assert sentinel.returncode == 0, err
    attempts = [json.loads((run_dir / f"attempt-{n}").read_text()) for n in (1, 2)]
    assert [a["start"] for a in attempts] == [0, 20], "the restart resumed from clean step_20"
    pidfile = root / "run/train/run1/job.pid"
    assert int(pidfile.read_text()) == attempts[1]["pid"], "the wrapper wrote the job's pid"
    assert [p.name for p in (ckpt / "quarantine").rglob("step_*")] == ["step_25"]
    log = (root / "var/log/train/run1.log").read_text()
    assert log.count('"step": 25') == 1 + 1, "both attempts' output went to the log"
    assert any(line.startswith("STATUS=") for line in systemd.notified)
    assert "nan" in json.dumps([r.json for r in hook.accepted]).lower()
    (_, watch_argv) = next(asked for asked in systemd.asked if asked[0] == "sentinel@run1.service")
    assert option(watch_argv, "--pidfile") == str(pidfile)
