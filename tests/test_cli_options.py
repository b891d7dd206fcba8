"""Every verb honours each shared option it takes, and refuses the others with a one-line reason.

The walk takes the verbs and their options from ``build_parser()`` itself, so a
verb given an option that no check here shows it honouring fails
``test_a_taken_option_is_honoured`` until someone writes that check.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sentinel.cli import main as cli
from sentinel.cli import options as cli_options
from sentinel.cli.verbs.common import settings_of
from sentinel.config import Settings, effective_config
from sentinel.process.target import SystemdUnitTarget
from sentinel.store.lock import acquire
from sentinel.store.state import StateStore
from sentinel.store.verdict import mark_deciding, write_final
from sentinel.supervisor.holders import target_of
from tests.helpers.cli import main_undone
from tests.helpers.env import clean_env
from tests.helpers.webhook import WebhookReceiver

TOKEN = "tok3nZq81xWvPk22"
HOOK_URL = f"json://127.0.0.1:9/hooks/{TOKEN}"


@dataclass
class Result:
    code: int
    out: str
    err: str


Run = Callable[..., Result]


@pytest.fixture
def sentinel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Run]:
    """``sentinel ARGS`` in this process (the real ``main``), in ``tmp_path``, with no SENTINEL_*.

    ``main`` sets up logging and the excepthooks for the whole process; both are
    put back afterwards.
    """
    for name in [name for name in os.environ if name.startswith("SENTINEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SENTINEL_EVIDENCE__CHART", "false")  # as clean_env() has it
    monkeypatch.chdir(tmp_path)

    def run(*args: str | Path) -> Result:
        capsys.readouterr()
        with main_undone():
            try:
                code = cli.main([str(arg) for arg in args])
            except SystemExit as exit_:
                code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    yield run


def verbs() -> dict[str, argparse.ArgumentParser]:
    (action,) = [
        a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return dict(action.choices)


def options(verb: str) -> dict[str, argparse.Action]:
    """Each option of the verb by its long name (``-h`` left out)."""
    return {
        action.option_strings[-1]: action
        for action in verbs()[verb]._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    }


def parse(*args: str | Path) -> argparse.Namespace:
    return cli.build_parser().parse_args([str(arg) for arg in args])


# Positionals a verb needs before its options are looked at.
NEEDS = {"run": ["--", sys.executable, "-c", "pass"], "checkpoints": ["."]}


def nan_log(path: Path) -> Path:
    records = [{"step": s, "loss": 2.5 - s / 20, "grad_norm": 0.8} for s in range(1, 16)]
    records[6]["loss"] = float("nan")  # step 7
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def alerts(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


# --- what each taken option does, by verb --------------------------------------------------

# A settings option's arguments and what the effective config then holds (in tmp_path,
# where CONFIG is written).
CONFIG = 'state_dir = "from-file"\n[job]\nmax_restarts = 5\n'
SETTINGS: dict[str, tuple[list[str], Callable[[dict[str, Any]], bool]]] = {
    "--config": (["--config", "sentinel.toml"], lambda c: c["job"]["max_restarts"] == 5),
    "--log": (["--log", "a.log", "--log", "b*.log"], lambda c: c["logs"] == ["a.log", "b*.log"]),
    "--discover": (["--discover", "runs"], lambda c: c["tail"]["discover_dir"] == "runs"),
    "--checkpoints": (["--checkpoints", "ckpts"], lambda c: c["checkpoints"] == "ckpts"),
    "--notify": (
        ["--notify", HOOK_URL],
        lambda c: c["notify"]["urls"] == ["json://127.0.0.1:9/hooks/****"],
    ),
    "--state-dir": (["--state-dir", "st"], lambda c: c["state_dir"] == "st"),
    "--max-restarts": (["--max-restarts", "7"], lambda c: c["job"]["max_restarts"] == 7),
    "--resume-command": (
        ["--resume-command", "python train.py --resume latest"],
        lambda c: c["job"]["resume_command"] == "python train.py --resume latest",
    ),
    "--dry-run": (["--dry-run"], lambda c: c["dry_run"] is True),
    "--verdict-file": (["--verdict-file", "v.txt"], lambda c: c["verdict_file"] == "v.txt"),
    "--stop-signal": (["--stop-signal", "int"], lambda c: c["job"]["stop_signal"] == "SIGINT"),
    "--http": (["--http", "127.0.0.1:9464"], lambda c: c["http"] == "127.0.0.1:9464"),
    "--metrics-textfile": (
        ["--metrics-textfile", "s.prom"],
        lambda c: c["metrics_textfile"] == "s.prom",
    ),
    "--drain-timeout": (["--drain-timeout", "2.5"], lambda c: c["drain_timeout_s"] == 2.5),
    "--pid": (["--pid", "4242"], lambda c: c["watch"]["pid"] == 4242),
    "--pidfile": (["--pidfile", "job.pid"], lambda c: c["watch"]["pidfile"] == "job.pid"),
    "--match": (["--match", "train.py"], lambda c: c["watch"]["match"] == "train.py"),
    "--user": (["--user", "root"], lambda c: c["watch"]["user"] == "root"),
    "--systemd-unit": (
        ["--systemd-unit", "train.service"],
        lambda c: c["watch"]["systemd_unit"] == "train.service",
    ),
    "--systemd-user": (["--systemd-user"], lambda c: c["watch"]["systemd_user"] is True),
    "--wait": (["--wait", "0.5"], lambda c: c["watch"]["wait_s"] == 0.5),
    "--run-id": (["--run-id", "job-7.a_1"], lambda c: c["run_id"] == "job-7.a_1"),
    "--reference": (
        ["--reference", "reference.jsonl"],
        lambda c: c["reference"]["path"] == "reference.jsonl",
    ),
}


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "sentinel.toml"
    path.write_text(CONFIG)
    # What ``--reference`` names: a finished run, read when the settings are made.
    (tmp_path / "reference.jsonl").write_text('{"step": 10, "loss": 2.0}\n')
    return path


def run_takes(option: str, run: Run, tmp_path: Path) -> None:
    """``run`` hands the option to the settings the supervisor runs with."""
    config_file(tmp_path)
    args, check = SETTINGS[option]
    settings = settings_of(parse("run", *args, *NEEDS["run"]))
    assert check(effective_config(settings))


# What ``watch`` then looks for: a target option, the job it names (--user goes with
# --match); any other option, with --pid 1 as the target.
WATCH_TARGETS = {
    "--pid": ([], "pid 4242"),
    "--pidfile": ([], "pidfile job.pid"),
    "--match": ([], "the one process matching 'train.py'"),
    "--user": (["--match", "train"], "the one process of user root matching 'train'"),
    "--systemd-unit": ([], "systemd unit train.service"),
}


def watch_takes(option: str, run: Run, tmp_path: Path) -> None:
    """``watch`` hands the option to the settings the supervisor runs with."""
    config_file(tmp_path)
    args, check = SETTINGS[option]
    target, says = WATCH_TARGETS.get(option, (["--pid", "1"], "pid 1"))
    settings = settings_of(parse("watch", *args, *target))
    assert check(effective_config(settings))
    assert target_of(settings).describe() == says


def check_config_takes(option: str, run: Run, tmp_path: Path) -> None:
    """``check-config`` prints what the option set (secrets masked)."""
    config_file(tmp_path)
    args, check = SETTINGS[option]
    result = run("check-config", "--json", *args)
    assert result.code == 0, result.err
    assert check(json.loads(result.out))
    assert TOKEN not in result.out


def check_config_json(run: Run, tmp_path: Path) -> None:
    data = json.loads(run("check-config", "--json", "--max-restarts", "7").out)
    assert data["job"]["max_restarts"] == 7
    assert "max_restarts = 7" in run("check-config", "--max-restarts", "7").out.splitlines()


def replay_config(run: Run, tmp_path: Path) -> None:
    log = nan_log(tmp_path / "m.jsonl")
    config = tmp_path / "off.toml"
    config.write_text("[rules.nan_inf]\nenabled = false\n")
    assert "nan_inf" in {a["rule"] for a in alerts(run("replay", "--json", log).out)}
    quiet = run("replay", "--json", "--config", config, log)
    assert quiet.code == 0, quiet.err
    assert "nan_inf" not in {a["rule"] for a in alerts(quiet.out)}


def replay_log(run: Run, tmp_path: Path) -> None:
    nan_log(tmp_path / "m.jsonl")
    result = run("replay", "--json", "--log", tmp_path / "m*.jsonl")
    assert result.code == 0, result.err
    assert alerts(result.out)[0]["rule"] == "nan_inf"


def replay_reference(run: Run, tmp_path: Path) -> None:
    reference = tmp_path / "reference.jsonl"
    reference.write_text("".join(f'{{"step": {s}, "loss": 2.0}}\n' for s in range(1, 31)))
    live = tmp_path / "live.jsonl"
    live.write_text("".join(f'{{"step": {s}, "loss": 5.0}}\n' for s in range(1, 31)))
    assert "reference" not in {a["rule"] for a in alerts(run("replay", "--json", live).out)}
    found = alerts(run("replay", "--json", "--reference", reference, live).out)
    assert [a["rule"] for a in found if a["rule"] == "reference"] == ["reference"]


def replay_json(run: Run, tmp_path: Path) -> None:
    log = nan_log(tmp_path / "m.jsonl")
    assert alerts(run("replay", "--json", log).out)[0]["step"] == 7
    assert run("replay", log).out.startswith("15 lines")


def replay_fail_on(run: Run, tmp_path: Path) -> None:
    log = nan_log(tmp_path / "m.jsonl")
    assert run("replay", log).code == 0
    assert run("replay", "--fail-on", "critical", log).code == 1


def notify_test_notify(run: Run, tmp_path: Path) -> None:
    with WebhookReceiver() as hook:
        result = run("notify-test", "--notify", hook.url)
        (request,) = hook.wait_for(1)
    assert result.code == 0, result.err
    assert "notify_test" in request.json["message"]


def notify_test_config(run: Run, tmp_path: Path) -> None:
    with WebhookReceiver() as hook:
        config = tmp_path / "c.toml"
        config.write_text(f'[notify]\nurls = ["{hook.url}"]\n')
        result = run("notify-test", "--config", config)
        hook.wait_for(1)
    assert result.code == 0, result.err


def notify_test_json(run: Run, tmp_path: Path) -> None:
    with WebhookReceiver() as live:
        dead = WebhookReceiver(listening=False)
        result = run("notify-test", "--json", "--notify", live.url, "--notify", dead.url)
        live.wait_for(1)
    assert result.code == 1
    ok, failed = [json.loads(line) for line in result.out.splitlines()]
    assert ok == {"name": live.url, "ok": True, "error": None}
    assert failed["name"] == dead.url and failed["ok"] is False
    assert "Connection error" in failed["error"]


def status_state_dir(run: Run, tmp_path: Path) -> None:
    StateStore(tmp_path / "st").close()
    result = run("status", "--json", "--state-dir", tmp_path / "st")
    assert result.code == 0, result.err
    assert json.loads(result.out)["state_dir"] == str(tmp_path / "st")


def status_config(run: Run, tmp_path: Path) -> None:
    StateStore(tmp_path / "from-file").close()
    result = run("status", "--json", "--config", config_file(tmp_path))
    assert result.code == 0, result.err
    assert json.loads(result.out)["state_dir"] == "from-file"


def status_json(run: Run, tmp_path: Path) -> None:
    StateStore(tmp_path / "st").close()
    assert "state_dir" in json.loads(run("status", "--json", "--state-dir", "st").out)
    assert run("status", "--state-dir", "st").out.startswith("state dir:")


def checkpoints_json(run: Run, tmp_path: Path) -> None:
    (tmp_path / "ckpts" / "checkpoint-10").mkdir(parents=True)
    listing = json.loads(run("checkpoints", "--json", tmp_path / "ckpts").out)
    assert [c["step"] for c in listing["checkpoints"]] == [10]


def checkpoints_state_dir(run: Run, tmp_path: Path) -> None:
    from sentinel.store import verdict

    plain = Path(__file__).parent / "fixtures" / "checkpoints" / "plain" / "model_step40.pt"
    (tmp_path / "ckpts").mkdir()
    for step in (10, 20):
        shutil.copyfile(plain, tmp_path / "ckpts" / f"model_step{step}.pt")
    incident = {"id": "i", "rule": "nan_inf", "severity": "critical", "opened_at": 0.0,
                "onset_step": 15, "onset_time": 0.0, "alerts": [], "actions": [],
                "open_rules": []}  # fmt: skip
    stop = {"phase": "stopping", "incident": incident, "restart": True, "attempt": 1,
            "job": None, "signal": "SIGTERM", "grace_s": 30.0, "signalled_at": 0.0}  # fmt: skip
    verdict.mark_deciding(tmp_path / "st", rule="nan_inf", step=15, attempt=1, time=0.0, stop=stop)
    listing = json.loads(run("checkpoints", "--json", "--state-dir", "st", tmp_path / "ckpts").out)
    assert Path(listing["last_clean"]).name == "model_step10.pt", listing


def checkpoints_restore(run: Run, tmp_path: Path) -> None:
    origin = tmp_path / "ckpts" / "checkpoint-10"
    quarantine = tmp_path / "ckpts" / "quarantine" / "20261121T140600-nan_inf"
    quarantine.mkdir(parents=True)
    (quarantine / "checkpoint-10").mkdir()
    items = [{"name": "checkpoint-10", "origin": str(origin)}]
    (quarantine / ".sentinel-manifest.json").write_text(json.dumps({"items": items}))
    assert run("checkpoints", "--restore", "20261121", tmp_path / "ckpts").code == 0
    assert origin.is_dir()


def status_checkpoints(run: Run, tmp_path: Path) -> None:
    StateStore(tmp_path / "st").close()
    (tmp_path / "ckpts" / "quarantine").mkdir(parents=True)
    (tmp_path / "ckpts" / "quarantine" / "model.pt").write_bytes(b"\0" * 10)
    result = run("status", "--json", "--state-dir", "st", "--checkpoints", "ckpts")
    assert json.loads(result.out)["disk"]["quarantine_bytes"] == 10


def demo_keep(run: Run, tmp_path: Path) -> None:
    env = clean_env()
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "demo", "--keep", str(tmp_path / "kept")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "kept" / "state" / "alerts.jsonl").is_file()


def verdict_state_dir(run: Run, tmp_path: Path) -> None:
    write_final(tmp_path / "st", 91, None, "nan_inf", 40, None, 1, 0.0)
    result = run("verdict", "--state-dir", "st")
    assert (result.code, result.out) == (91, "91\n"), result.err


def verdict_config(run: Run, tmp_path: Path) -> None:
    write_final(tmp_path / "from-file", 90, None, "nan_inf", 40, None, 2, 0.0)
    result = run("verdict", "--config", config_file(tmp_path))
    assert (result.code, result.out) == (90, "90\n"), result.err


def verdict_wait(run: Run, tmp_path: Path) -> None:
    """A sentinel holds the state dir and decides while ``verdict --wait`` waits."""
    with acquire(tmp_path / "st"):
        mark_deciding(tmp_path / "st", rule="gpu_health", step=None, attempt=1, time=0.0)
        args = (tmp_path / "st", 92, None, "gpu_health", None, None, 1, 0.0)
        timer = threading.Timer(0.2, write_final, args)
        timer.start()
        result = run("verdict", "--state-dir", "st", "--wait", "--job-status", "143")
        timer.join()
    assert (result.code, result.out) == (92, "92\n"), result.err


def verdict_timeout(run: Run, tmp_path: Path) -> None:
    with acquire(tmp_path / "st"):
        mark_deciding(tmp_path / "st", rule="nan_inf", step=40, attempt=1, time=0.0)
        result = run("verdict", "--state-dir", "st", "--wait", "--timeout", "0.2")
    assert (result.code, result.out) == (1, "")
    assert "within 0.2 s" in result.err


def verdict_job_status(run: Run, tmp_path: Path) -> None:
    """No sentinel holds the state dir and there is no verdict: the job's own status."""
    assert run("verdict", "--state-dir", "st", "--wait", "--job-status", "7").code == 7
    assert run("verdict", "--state-dir", "st", "--job-status", "0").code == 0
    assert run("verdict", "--state-dir", "st").code == 1


# --- options shown on real runs, where the settings alone do not show the effect ---------

# A training job in miniature: a step_5 checkpoint, a NaN loss at step 7 every attempt (a
# restart resumes after step 5), then it waits to be stopped and writes down by which signal.
NAN_JOB = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    ckpt, stopped_by = Path(sys.argv[1]), Path(sys.argv[2])

    def stop(signum, frame):
        with stopped_by.open("a") as f:
            f.write(signal.Signals(signum).name + "\\n")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for step in range(int(os.environ.get("SENTINEL_RESUME_STEP") or 0) + 1, 8):
        if step == 5:
            (ckpt / "step_5").mkdir(parents=True, exist_ok=True)
            (ckpt / "step_5" / "weights.json").write_text(json.dumps({"step": 5}))
        loss = float("nan") if step == 7 else 2.0 - step / 100
        print(json.dumps({"step": step, "loss": loss}), flush=True)
    time.sleep(30)
    """
)
# A job that runs until the file it is given exists (at most 30 s); 0 if it came.
WAIT_JOB = textwrap.dedent(
    """
    import pathlib, sys, time
    path, deadline = pathlib.Path(sys.argv[1]), time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(0 if path.exists() else 1)
    """
)
# Ticks and restarts quick enough for a test.
FAST = "tick_interval_s = 0.1\n[job]\nrestart_backoff_s = 0.1\n"


def run_job(run: Run, tmp_path: Path, *args: str | Path) -> Result:
    """``sentinel run --config FAST --state-dir st ARGS`` (ARGS ends with -- and the job)."""
    (tmp_path / "fast.toml").write_text(FAST)
    return run("run", "--config", "fast.toml", "--state-dir", "st", *args)


def nan_job(tmp_path: Path) -> list[str | Path]:
    (tmp_path / "job.py").write_text(NAN_JOB)
    return ["--", sys.executable, tmp_path / "job.py", tmp_path / "ckpt", tmp_path / "stopped_by"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_stop_signal(run: Run, tmp_path: Path) -> None:
    """The NaN stops the job with the signal given (SIGTERM otherwise), and it arrives."""
    result = run_job(
        run, tmp_path, "--max-restarts", "0", "--stop-signal", "SIGINT", *nan_job(tmp_path)
    )
    assert result.code == 130, result.err  # no restarts: run exits with the job's status
    assert (tmp_path / "stopped_by").read_text() == "SIGINT\n"


def run_verdict_file(run: Run, tmp_path: Path) -> None:
    """A run that gives up (the same NaN after the rollback) writes its bare code there."""
    result = run_job(
        run, tmp_path, "--checkpoints", "ckpt", "--max-restarts", "1", "--verdict-file", "v.txt",
        *nan_job(tmp_path),
    )  # fmt: skip
    assert result.code == 90, result.err
    assert (tmp_path / "stopped_by").read_text() == "SIGTERM\n" * 2, "two attempts, each stopped"
    assert (tmp_path / "v.txt").read_text().strip() == "90"


def run_http(run: Run, tmp_path: Path) -> None:
    """While the job runs, /livez answers 200 at the address given; then the job ends."""
    port, probed = free_port(), tmp_path / "probed"
    answers: list[int] = []

    def probe() -> None:
        deadline = time.monotonic() + 15
        while not answers and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as reply:
                    answers.append(reply.status)
            except (urllib.error.URLError, ConnectionError):  # not serving yet, or not live
                time.sleep(0.02)
        probed.touch()

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        result = run_job(
            run, tmp_path, "--max-restarts", "0", "--http", f"127.0.0.1:{port}",
            "--", sys.executable, "-c", WAIT_JOB, probed,
        )  # fmt: skip
    finally:
        prober.join()
    assert result.code == 0, result.err
    assert answers == [200]


def run_metrics_textfile(run: Run, tmp_path: Path) -> None:
    """While the job runs, the metrics are written there (the job waits for the file)."""
    prom = tmp_path / "s.prom"
    result = run_job(
        run, tmp_path, "--max-restarts", "0", "--metrics-textfile", prom,
        "--", sys.executable, "-c", WAIT_JOB, prom,
    )  # fmt: skip
    assert result.code == 0, result.err
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    assert [s.name for s in families["sentinel_log_lines"].samples] == ["sentinel_log_lines_total"]


def run_no_pty(run: Run, tmp_path: Path) -> None:
    """The job gets pipes for stdout and stderr, not the terminals it gets otherwise."""
    says = "import sys; print(sys.stdout.isatty(), sys.stderr.isatty(), file=open(sys.argv[1],'a'))"
    seen = tmp_path / "isatty"
    for args in ((), ("--no-pty",)):
        result = run_job(run, tmp_path, *args, "--", sys.executable, "-c", says, seen)
        assert result.code == 0, result.err
    assert seen.read_text() == "True True\nFalse False\n"


#: Writes a Lightning-style metrics.csv with a NaN row under the folder it is given, then
#: trains on for the seconds it is given (a NaN found stops it sooner).
CSV_JOB = (
    "import os, sys, time; d = os.path.join(sys.argv[1], 'lightning_logs', 'version_0');"
    " os.makedirs(d); open(os.path.join(d, 'metrics.csv'), 'w').write('step,train_loss\\n"
    "9,1.0\\n19,nan\\n'); time.sleep(float(sys.argv[2]))"
)


def run_discover(run: Run, tmp_path: Path) -> None:
    """The metric files under DIR are followed, and those elsewhere no longer are."""
    job = ["--max-restarts", "0", "--", sys.executable, "-c", CSV_JOB]
    outside = run_job(run, tmp_path, "--discover", "runs", *job, ".", "1")
    inside = run_job(run, tmp_path, "--discover", "runs", *job, "runs", "30")
    assert (outside.code, inside.code) == (0, 143), inside.err  # 143: stopped by SIGTERM


def watch_systemd_user(run: Run, tmp_path: Path) -> None:
    """The unit is asked of the user's service manager; without a unit, a usage error."""
    unit = ("watch", "--systemd-unit", "t.service")
    for args, systemctl in (((), ("systemctl",)), (("--systemd-user",), ("systemctl", "--user"))):
        target = target_of(settings_of(parse(*unit, *args)))
        assert isinstance(target, SystemdUnitTarget)
        assert target.systemctl == systemctl
    result = run("watch", "--pid", "1", "--systemd-user")
    assert result.code == 2
    assert "--systemd-user only goes with --systemd-unit" in result.err


def watch_wait(run: Run, tmp_path: Path) -> None:
    """A job that has not appeared within --wait: exit 1 about that long after it began
    waiting, saying so. (A subprocess, killed if it outlives 30 s: a wait that never ends
    then fails the test rather than hanging it.)"""
    (tmp_path / "fast.toml").write_text(FAST)
    env = clean_env()
    with subprocess.Popen(
        [sys.executable, "-m", "sentinel", "watch", "--config", "fast.toml", "--state-dir", "st",
         "--wait", "0.5", "--pidfile", "job.pid"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    ) as watch:  # fmt: skip
        guard = threading.Timer(30, watch.kill)
        guard.start()
        assert watch.stderr is not None
        err, waiting_at = "", None
        for line in watch.stderr:  # until sentinel exits
            err += line
            if waiting_at is None and "waiting for pidfile job.pid" in line:
                waiting_at = time.monotonic()
        waited = time.monotonic() - (waiting_at or 0)
        guard.cancel()
    assert watch.returncode == 1, err
    assert "pidfile job.pid did not appear within 0.5 s" in err
    # Unset, it waits for ever (the guard kills it at 30 s); the bound leaves room for a
    # loaded machine's exit (2.02 s once).
    assert 0.4 < waited < 10.0, err


def verbose(verb: str) -> Callable[[Run, Path], None]:
    def check(run: Run, tmp_path: Path) -> None:
        """``main`` sets debug logging from ``args.verbose`` for every verb."""
        cli._setup_logging(parse(verb, "-v", *NEEDS.get(verb, [])).verbose)
        assert logging.getLogger("sentinel").level == logging.DEBUG

    return check


def settings_option(check: Callable[[str, Run, Path], None], option: str) -> Any:
    return lambda run, tmp_path: check(option, run, tmp_path)


#: (verb, option) -> a check that the verb honours the option.
HONOURED: dict[tuple[str, str], Callable[[Run, Path], None]] = {
    **{("run", o): settings_option(run_takes, o) for o in SETTINGS if o not in cli_options.TARGET},
    **{("watch", o): settings_option(watch_takes, o) for o in SETTINGS if o != "--resume-command"},
    **{("check-config", o): settings_option(check_config_takes, o) for o in SETTINGS},
    # These replace the settings checks above: the option's effect on a real run.
    ("run", "--stop-signal"): run_stop_signal,
    ("run", "--verdict-file"): run_verdict_file,
    ("run", "--http"): run_http,
    ("run", "--metrics-textfile"): run_metrics_textfile,
    ("run", "--no-pty"): run_no_pty,
    ("run", "--discover"): run_discover,
    ("watch", "--wait"): watch_wait,
    ("watch", "--systemd-user"): watch_systemd_user,
    ("check-config", "--json"): check_config_json,
    ("replay", "--config"): replay_config,
    ("replay", "--log"): replay_log,
    ("replay", "--reference"): replay_reference,
    ("replay", "--json"): replay_json,
    ("replay", "--fail-on"): replay_fail_on,
    ("notify-test", "--config"): notify_test_config,
    ("notify-test", "--notify"): notify_test_notify,
    ("notify-test", "--json"): notify_test_json,
    ("status", "--config"): status_config,
    ("status", "--state-dir"): status_state_dir,
    ("status", "--json"): status_json,
    ("checkpoints", "--json"): checkpoints_json,
    ("checkpoints", "--restore"): checkpoints_restore,
    ("checkpoints", "--state-dir"): checkpoints_state_dir,
    ("status", "--checkpoints"): status_checkpoints,
    ("demo", "--keep"): demo_keep,
    ("verdict", "--state-dir"): verdict_state_dir,
    ("verdict", "--config"): verdict_config,
    ("verdict", "--wait"): verdict_wait,
    ("verdict", "--timeout"): verdict_timeout,
    ("verdict", "--job-status"): verdict_job_status,
    **{(verb, "--verbose"): verbose(verb) for verb in verbs() if verb != "checkpoints"},
}
SLOW = {
    (verb, option): pytest.mark.slow
    for verb, option in [
        ("demo", "--keep"),
        ("run", "--stop-signal"),
        ("run", "--verdict-file"),
        ("run", "--http"),
        ("run", "--metrics-textfile"),
        ("run", "--no-pty"),
        ("run", "--discover"),
        ("watch", "--wait"),
    ]
}


def taken() -> list[Any]:
    return [
        pytest.param(verb, name, id=f"{verb} {name}", marks=SLOW.get((verb, name), ()))
        for verb in verbs()
        for name, action in options(verb).items()
        if not isinstance(action, cli_options.Refused)
    ]


def refused() -> list[Any]:
    # The fast loop walks replay's refusals (DESIGN.md names them); the full run every verb's.
    return [
        pytest.param(
            verb, name, id=f"{verb} {name}", marks=() if verb == "replay" else pytest.mark.slow
        )
        for verb in verbs()
        for name, action in options(verb).items()
        if isinstance(action, cli_options.Refused)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(("verb", "option"), taken())
def test_a_taken_option_is_honoured(verb: str, option: str, sentinel: Run, tmp_path: Path) -> None:
    check = HONOURED.get((verb, option))
    assert check is not None, f"sentinel {verb} takes {option}, and no check shows it honoured"
    check(sentinel, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("verb", "option"), refused())
def test_a_refused_option_exits_2_with_a_one_line_reason(
    verb: str, option: str, sentinel: Run
) -> None:
    for given in ([option], [option, "value"], [f"{option}=value"]):
        result = sentinel(verb, *given, *NEEDS.get(verb, []))
        assert result.code == 2
        assert result.out == ""
        (line,) = result.err.splitlines()
        assert line.startswith(f"sentinel {verb}: {option} is not taken by {verb}: ")
        assert len(line) > len(f"sentinel {verb}: {option} is not taken by {verb}: ") + 10


@pytest.mark.parametrize("verb", verbs())
def test_every_verb_takes_or_refuses_each_shared_option(verb: str) -> None:
    assert set(cli_options.ALL) <= set(options(verb))


def test_each_check_is_of_an_option_a_verb_takes() -> None:
    assert set(HONOURED) == {(verb, name) for verb, name, *_ in (p.values for p in taken())}


def test_replay_refuses_what_it_cannot_do_with_the_designs_reason(sentinel: Run) -> None:
    for option in ("--notify", "--max-restarts", "--dry-run", "--resume-command", "--checkpoints"):
        result = sentinel("replay", option, "x", "m.jsonl")
        assert result.err == (
            f"sentinel replay: {option} is not taken by replay:"
            " replay sends, signals, moves and restarts nothing\n"
        )


def test_run_without_dashes_before_the_command_is_refused(sentinel: Run, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    job = ["-c", f"open({str(marker)!r}, 'w')"]
    result = sentinel("run", "--state-dir", "st", sys.executable, *job, "--config", "x.toml")
    assert result.code == 2
    assert result.err == (
        f"sentinel run: put -- before the job's command: sentinel run [OPTIONS] -- {sys.executable}"
        " ...\n"
    )
    assert not marker.exists()
    assert sentinel("run").err == "sentinel run: give the job's command after --\n"
    assert sentinel("run", "--state-dir", "st", "--").code == 2


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "give exactly one of --pid, --pidfile, --match, --systemd-unit (given: none)"),
        (
            ["--pid", "1", "--systemd-unit", "train.service"],
            "give exactly one of --pid, --pidfile, --match, --systemd-unit"
            " (given: --pid, --systemd-unit)",
        ),
        (["--pid", "1", "--user", "alice"], "--user only goes with --match"),
    ],
    ids=["no target", "two targets", "user without match"],
)
def test_watch_refuses_anything_but_one_target_before_it_starts(
    given: list[str], says: str, sentinel: Run, tmp_path: Path
) -> None:
    result = sentinel("watch", "--state-dir", "st", *given)
    assert (result.code, result.out, result.err) == (2, "", f"sentinel watch: {says}\n")
    assert not (tmp_path / "st").exists()


def test_options_after_the_dashes_go_to_the_job() -> None:
    args = parse("run", "--state-dir", "st", "--", "python", "t.py", "--config", "x", "--", "-v")
    assert args.command == ["--", "python", "t.py", "--config", "x", "--", "-v"]
    assert args.state_dir == "st" and args.config is None and not args.verbose


@pytest.mark.slow
def test_run_with_dashes_runs_the_job_with_its_own_options(tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    job = f"import json, sys; json.dump(sys.argv[1:], open({str(out)!r}, 'w'))"
    env = clean_env()
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "st"),
         "--max-restarts", "0", "--", sys.executable, "-c", job, "--config", "x.toml", "-v"],
        capture_output=True, text=True, env=env, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == ["--config", "x.toml", "-v"]


def test_replay_reads_paths_then_each_log_with_globs_expanded(
    sentinel: Run, tmp_path: Path
) -> None:
    healthy = [{"step": s, "loss": 2.0} for s in range(1, 6)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in healthy))
    nan_log(tmp_path / "b1.jsonl")
    nan_log(tmp_path / "b2.jsonl")
    result = sentinel("replay", "a.jsonl", "--log", "b*.jsonl", "--log", "a.jsonl")
    assert result.code == 0, result.err
    assert result.out.startswith("35 lines")  # a once, b1, b2: a file named twice is read once
    missing = sentinel("replay", "a.jsonl", "--log", "nothing*.jsonl")
    assert missing.code == 2
    assert missing.err == "sentinel replay: no such file: nothing*.jsonl\n"
    assert sentinel("replay").err == "sentinel replay: give a PATH or --log to read\n"
    # A link to nothing is there: not "no such file" alone (oos47b).
    os.symlink("loop.log", tmp_path / "loop.log")
    looped = sentinel("replay", "loop.log")
    assert looped.code == 2
    assert looped.err == "sentinel replay: no such file: loop.log (a symbolic link to no file)\n"


def test_check_config_for_people_is_toml_that_reads_back_masked(
    sentinel: Run, tmp_path: Path
) -> None:
    url = f"json://user:pa55w0rdXy@127.0.0.1:9/hooks/{TOKEN}"
    config = tmp_path / "c.toml"
    config.write_text(
        f'[[notify.targets]]\nurl = "{url}"\nname = "oncall"\n[rules.stall]\nsoft_timeout_s = 600\n'
    )
    text = sentinel("check-config", "--config", config).out
    data = json.loads(sentinel("check-config", "--json", "--config", config).out)
    assert TOKEN not in text and "pa55w0rdXy" not in text
    assert "[[notify.targets]]" in text.splitlines()
    assert tomllib.loads(text) == without_nulls(data)
    assert "# checkpoints is not set" in text.splitlines()


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def test_positionals_have_help() -> None:
    for verb, parser in verbs().items():
        for action in parser._actions:
            if not action.option_strings:
                assert action.help, f"sentinel {verb}: {action.metavar or action.dest} has no help"


def test_help_shows_each_settings_default_and_no_flags() -> None:
    """``-h`` names the default of each option that has one: the setting's, as the settings
    models have it (the option's own default is None, so that a config file's value stands)."""
    defaults = Settings()
    text = " ".join(verbs()["run"].format_help().split())
    assert f"restarts before giving up (default: {defaults.job.max_restarts})" in text
    assert f"(default: {defaults.state_dir})" in text
    assert f"(default: {defaults.job.stop_signal})" in text
    assert f"this long (default: {defaults.drain_timeout_s})" in text
    # A flag, and an option without a default, say nothing of one.
    assert "never signal, move or restart --stop-signal" in text
    assert "apprise URL to alert (repeatable) job control" in text
