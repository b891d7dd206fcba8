"""The smaller verbs: notify-test, checkpoints, demo."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import STARTS_THINGS, sentinel_here
from tests.helpers.env import clean_env
from tests.helpers.webhook import WebhookReceiver


def sentinel(
    *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    if args[0] not in STARTS_THINGS:  # starts nothing: main in this process (tests.helpers.cli)
        return sentinel_here(*args, env=env, cwd=cwd)
    if cwd is not None:  # sentinel run from elsewhere must still import this checkout's package
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "sentinel", *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd,
    )  # fmt: skip


@pytest.mark.slow
def test_notify_test_reports_each_target_and_fails_if_one_did() -> None:
    with WebhookReceiver() as live:
        dead = WebhookReceiver(listening=False)
        result = sentinel("notify-test", "--notify", live.url, "--notify", dead.url)
        (request,) = live.wait_for(1)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"ok      {live.url}"
    assert lines[1].startswith(f"FAILED  {dead.url}: ") and "Connection error" in lines[1]
    assert "notify_test" in request.json["message"]


@pytest.mark.slow
def test_notify_test_reaches_named_targets_and_exits_0_when_all_did(tmp_path: Path) -> None:
    with WebhookReceiver() as slack, WebhookReceiver() as pager:
        config = tmp_path / "sentinel.toml"
        config.write_text(
            f'[notify]\nurls = ["{slack.url}"]\n'
            f'[[notify.targets]]\nurl = "{pager.url}"\nname = "pagerduty"\n'
            'min_severity = "critical"\n'
        )
        result = sentinel("notify-test", "--config", str(config))
        slack.wait_for(1)
        pager.wait_for(1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"ok      {slack.url}", "ok      pagerduty"]


@pytest.mark.slow
def test_notify_test_without_targets_is_a_usage_error() -> None:
    assert sentinel("notify-test").returncode == 2


def _safetensors(path: Path, *, truncated: bool = False) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = len(header).to_bytes(8, "little") + header + b"\0" * (4 if truncated else 8)
    path.write_bytes(data)


@pytest.mark.slow
def test_checkpoints_lists_statuses_and_the_last_clean_one(tmp_path: Path) -> None:
    for step, truncated in ((100, False), (200, False), (300, True)):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        _safetensors(ckpt / "model.safetensors", truncated=truncated)
        (ckpt / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-400").mkdir()  # being written: nothing in it yet

    table = sentinel("checkpoints", str(tmp_path))
    assert table.returncode == 0
    rows = {line.split()[2]: line for line in table.stdout.splitlines()[1:]}
    assert "<- last clean" in rows["checkpoint-200"]
    assert " corrupt " in rows["checkpoint-300"] and " incomplete " in rows["checkpoint-400"]

    listing = json.loads(sentinel("checkpoints", "--json", str(tmp_path)).stdout)
    assert listing["last_clean"] == str((tmp_path / "checkpoint-200").resolve())
    assert [c["status"] for c in listing["checkpoints"]] == [
        "clean", "clean", "corrupt", "incomplete"
    ]  # fmt: skip


@pytest.mark.slow
def test_demo_diverges_rolls_back_restarts_and_finishes(tmp_path: Path) -> None:
    # Started from a folder with more subfolders than discovery searches (a home directory):
    # the demo looks for metric files only where its toy job writes.
    busy = tmp_path / "home"
    for index in range(600):
        (busy / f"d{index}").mkdir(parents=True)
    result = sentinel("demo", "--keep", str(tmp_path / "demo"), timeout=60, cwd=busy)
    assert result.returncode == 0, result.stderr
    assert "not searched" not in result.stderr
    tmp_path = tmp_path / "demo"
    assert "after 1 restart(s)" in result.stdout
    # Kept: the paths it names are there.
    assert f"Alert journal: {tmp_path / 'state' / 'alerts.jsonl'}" in result.stdout
    assert "diagnosis:" in result.stdout
    journal = (tmp_path / "state" / "alerts.jsonl").read_text().splitlines()
    alerts = [json.loads(line) for line in journal]
    # The schedule jumps at step 30: the early-warning rules see the blow-up start at
    # step 32 and the incident turns critical before the toy job's loss reaches inf.
    assert alerts[0]["rule"] in ("grad_norm_run", "loss_spike")
    assert alerts[0]["severity"] == "warning"
    critical = next(alert for alert in alerts if alert["severity"] == "critical")
    assert critical["step"] < 40
    # The diagnosis reads the jump of the logged rate (0.3 -> 1.6 at step 30) as the cause,
    # whichever batch the alert came in; the batch to inspect is the evidence's first.
    diagnosis = critical["diagnosis"]
    assert "the logged learning rate jumped 5.33x at step 30" in diagnosis["cause"]
    assert diagnosis["inspect_step"] == 32
    # The onset moves to step 29, the last logged at the old rate: checkpoint-30 (saved
    # after the update at the new rate) is set aside too; checkpoint-25 is the last clean.
    quarantined = sorted(
        int(q.name.split("-")[1])
        for q in (tmp_path / "run" / "checkpoints" / "quarantine").glob("*/checkpoint-*")
    )
    assert quarantined[:2] == [30, 35]
    assert "resumed from" in result.stderr and "checkpoint-25 at step 25" in result.stderr


@pytest.mark.slow
def test_run_never_prints_a_target_token_even_with_debug_logging(tmp_path: Path) -> None:
    """A dead webhook's failures are logged by sentinel, apprise and urllib3: all masked."""
    token, query_token = "tok3n-Zq81xWv", "qu3ry-Pk22"
    with WebhookReceiver(listening=False) as hook:  # nothing listens: every try fails
        url = f"json://127.0.0.1:{hook.port}/hooks/{token}?secret={query_token}"
        job = "import json; print(json.dumps({'step': 1, 'loss': float('nan')}))"
        result = sentinel(
            "run",
            "-v",
            "--state-dir",
            str(tmp_path / "state"),
            "--notify",
            url,
            "--max-restarts",
            "0",
            "--",
            sys.executable,
            "-c",
            job,
        )
    check = sentinel("check-config", "--notify", url)
    assert "nan_inf" in result.stderr  # the alert was raised and its delivery tried
    assert "json://127.0.0.1" in result.stderr
    for output in (result.stdout, result.stderr, check.stdout, check.stderr):
        assert token not in output and query_token not in output
    assert "****" in check.stdout


@pytest.mark.slow
def test_a_demo_not_kept_names_no_file_it_deletes(tmp_path: Path) -> None:
    result = sentinel("demo", timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Alert journal:" not in result.stdout and "Incident reports:" not in result.stdout
    assert "sentinel demo --keep DIR` keeps them" in result.stdout


#: A job that draws half a progress bar on its terminal (no newline, as tqdm and rich do
#: between redraws), then writes a NaN to its metrics file: sentinel's CRITICAL comes while
#: the bar is half drawn.
_BAR_JOB = """\
import json, sys, time
sys.stderr.write("\\rtraining:  50%|#####     | 5/10 [00:05<00:05]")
sys.stderr.flush()
time.sleep(0.5)
with open(sys.argv[1], "a") as log:
    log.write(json.dumps({"step": 5, "loss": float("nan")}) + "\\n")
time.sleep(30)
"""


def _read_terminal(fd: int, deadline_s: float) -> str:
    """Everything written to the terminal whose master end is ``fd``, until it closes."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_a_log_line_on_a_terminal_never_lands_after_the_jobs_half_drawn_bar(
    tmp_path: Path,
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.touch()
    master, slave = pty.openpty()
    try:
        sentinel_run = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "state"),
             "--log", str(metrics), "--max-restarts", "0", "--",
             sys.executable, "-c", _BAR_JOB, str(metrics)],
            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=clean_env(),
            start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
        os.close(slave)
        text = _read_terminal(master, 60)
        assert sentinel_run.wait(timeout=30) != 0
    finally:
        os.close(master)
    lines = [line.replace("\r", "") for line in text.split("\n")]
    # The bar keeps its line to itself, and the CRITICAL starts one of its own.
    assert [line for line in lines if line.startswith("training:")] == [
        "training:  50%|#####     | 5/10 [00:05<00:05]"
    ], text
    [critical] = [line for line in lines if "CRITICAL nan_inf step=5" in line]
    assert critical.startswith("[sentinel "), text


_PRINT_SWITCH = "import os; print(os.environ.get('PYDANTIC_DISABLE_PLUGINS', 'unset'))"


@pytest.mark.slow
@pytest.mark.parametrize(("given", "seen"), [(None, "unset"), ("logfire", "logfire")])
def test_the_job_gets_pydantics_plugin_switch_as_it_was(
    tmp_path: Path, given: str | None, seen: str
) -> None:
    """sentinel turns pydantic's plugins off while it imports its models (a faster start,
    ``sentinel.cli.startup``); the job it launches sees the environment it was given."""
    env = clean_env()
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    if given is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = given
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "st"),
         "--", sys.executable, "-c", _PRINT_SWITCH],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [seen]


@pytest.mark.parametrize("given", [None, "logfire"])
def test_importing_the_cli_leaves_pydantics_plugin_switch_as_it_was(given: str | None) -> None:
    """A program that imports the CLI (its parser, for one) and never calls main()."""
    env = clean_env()
    env.pop("PYDANTIC_DISABLE_PLUGINS", None)
    if given is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = given
    code = f"from sentinel.cli.main import build_parser; build_parser(); {_PRINT_SWITCH}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [given or "unset"]


def test_a_reader_that_goes_away_ends_replay_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sentinel replay --json log | head -1``: the pipe closes under sentinel's output.
    A real pipe whose reader is gone: the verb ends with a shell's SIGPIPE status, and no
    traceback."""
    import signal

    from sentinel.cli.main import main

    log = tmp_path / "train.log"
    log.write_text("".join(f'{{"step": {s}, "loss": NaN}}\n' for s in range(1, 50)))
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        status = main(["replay", "--json", str(log)])
    finally:
        monkeypatch.undo()
        stream.close()
    assert status == 128 + signal.SIGPIPE
    assert "Traceback" not in capsys.readouterr().err
