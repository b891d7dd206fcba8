"""``sentinel status``: the last run, the job, pending messages, each target's last delivery."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from sentinel.model.records import Severity
from sentinel.notify.notices import JobInfo, Notice, NoticeKind
from sentinel.notify.notifier import Notifier
from sentinel.notify.outbox import Batching, Outbox, Target
from sentinel.notify.target_results import record_result
from sentinel.service.status import NoState, gather
from sentinel.store.state import StateStore
from tests.helpers.cli import STARTS_THINGS, sentinel_here
from tests.helpers.env import clean_env
from tests.helpers.webhook import WebhookReceiver

T0 = 1_700_000_000.0


def sentinel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS``: ``run`` as a process of its own, ``status`` by ``main`` in this
    process (``tests.helpers.cli``)."""
    clean = clean_env()
    if args[0] not in STARTS_THINGS:
        return sentinel_here(*args, env={**clean, **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "sentinel", *args],
        capture_output=True, text=True, env={**clean, **(env or {})}, timeout=60,
    )  # fmt: skip


def seed(state: Path) -> None:
    """A state dir as a run leaves it: a run id, the job's state, the heartbeat, and one
    message really delivered to "slack" and refused by "pager"."""
    store = StateStore(state)
    try:
        store.put("last_run_id", "20231114T221320-abc123")
        store.put("job.state", "BACKOFF")
        store.put("job.pid", "4242")
        store.put("job.restarts", "1")
        store.put("job.updated_at", str(T0 + 9))
        store.put("job.lines_skipped", "1200")
        store.put("job.fp16_skipped_steps", "13")
        store.put("heartbeat.last_ok_at", str(T0 + 8))
        store.put("heartbeat.last_error", "HTTP 503 from hc-ping.com")
        with WebhookReceiver() as slack, WebhookReceiver() as pager:
            pager.respond(401, times=10)
            outbox = Outbox(store, [Target(slack.url, "slack"), Target(pager.url, "pager")])
            notifier = Notifier(outbox, tries=1, retry_initial_s=60.0, timeout_s=5.0)
            notifier.start()
            alert = {"rule": "nan_inf", "severity": "critical", "message": "loss is NaN"}
            notice = Notice(NoticeKind.OPENED, "r-1", "nan_inf", Severity.CRITICAL, alert, T0)
            job = JobInfo("llama-ft", "node", "r")
            outbox.add(notice, job, outbox.targets, time.time(), Batching())
            slack.wait_for(1)
            pager.wait_for(1, accepted_only=False)
            notifier.stop(drain_s=1.0)
    finally:
        store.close()


def test_gather_reads_run_job_messages_targets_and_heartbeat(tmp_path: Path) -> None:
    seed(tmp_path)
    status = gather(tmp_path).to_json()
    assert status["last_run_id"] == "20231114T221320-abc123"
    job = {
        "state": "BACKOFF",
        "pid": "4242",
        "restarts": "1",
        "updated_at": T0 + 9,
        "lines_skipped": 1200,
        "fp16_skipped_steps": 13,
    }
    assert status["job"] == job
    assert (status["pending_messages"], status["pending_by_target"]) == (1, {"pager": 1})
    pager, slack = status["targets"]
    assert (pager["name"], slack["name"]) == ("pager", "slack")
    assert pager["last_success_at"] is None
    assert pager["last_failure_at"] == pager["last_attempt_at"] is not None
    assert "401" in pager["last_error"]
    assert slack["last_success_at"] == slack["last_attempt_at"] is not None
    assert (slack["last_failure_at"], slack["last_error"]) == (None, None)
    assert status["heartbeat"] == {"last_ok_at": T0 + 8, "last_error": "HTTP 503 from hc-ping.com"}


def test_job_state_not_recorded_reads_unknown(tmp_path: Path) -> None:
    StateStore(tmp_path).close()
    status = gather(tmp_path)
    assert (status.job.state, status.job.pid, status.job.restarts) == ("unknown",) * 3
    assert (status.last_run_id, status.pending_total, status.targets) == (None, 0, [])


def test_a_state_dir_no_sentinel_holds_says_its_job_state_is_a_last_record(
    tmp_path: Path,
) -> None:
    """A ``watch`` that ended while it waited left WAITING, and status showed it as if it
    still waited. A sentinel holding the state dir (its lock) is running; none is not."""
    from sentinel.store.lock import acquire

    seed(tmp_path)
    idle = gather(tmp_path)
    assert idle.sentinel_running is False and idle.to_json()["sentinel_running"] is False
    assert any("sentinel is not running (its last record)" in line for line in idle.lines())
    with acquire(tmp_path):
        held = gather(tmp_path)
    assert held.sentinel_running is True
    assert not any("not running" in line for line in held.lines())


def test_gather_without_state_db_raises(tmp_path: Path) -> None:
    with pytest.raises(NoState, match=r"no state\.db"):
        gather(tmp_path)


@pytest.mark.slow
def test_cli_prints_status_for_people(tmp_path: Path) -> None:
    seed(tmp_path)
    result = sentinel("status", "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "20231114T221320-abc123" in text
    assert "BACKOFF, pid 4242, 1 restart(s)" in text
    assert "output:     1200 line(s) skipped to keep up with a flood" in text
    assert "fp16:       13 step(s) the loss scaler skipped (counted)" in text
    assert "1 pending" in text
    assert "last error:   " in text and "401" in text
    assert "last ok 2023-11-14 22:13:28Z; last error: HTTP 503 from hc-ping.com" in text


@pytest.mark.slow
def test_cli_without_state_is_a_usage_error(tmp_path: Path) -> None:
    result = sentinel("status", "--state-dir", str(tmp_path / "nowhere"), "--json")
    assert result.returncode == 2
    assert "no sentinel state in" in result.stderr
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.slow
def test_status_after_a_run_shows_each_targets_last_delivery(tmp_path: Path) -> None:
    state = tmp_path / "state"
    nan = "import json; print(json.dumps({'step': 1, 'loss': float('nan')}))"
    env = {"SENTINEL_NOTIFY__GROUP_WAIT_S": "0", "SENTINEL_RULES__NAN_INF__ON_CRITICAL": "notify"}
    with WebhookReceiver() as live, WebhookReceiver(listening=False) as dead:
        run = sentinel(
            "run", "--notify", live.url, "--notify", dead.url, "--state-dir", str(state),
            "--", sys.executable, "-c", nan, env=env,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        live.wait_for(1)
    result = sentinel("status", "--state-dir", str(state), "--json")
    assert result.returncode == 0, result.stderr
    status: dict[str, Any] = json.loads(result.stdout)
    targets = {target["name"]: target for target in status["targets"]}
    assert targets[live.url]["last_success_at"] is not None
    assert targets[live.url]["last_failure_at"] is None
    assert targets[dead.url]["last_success_at"] is None
    assert "Connection error" in targets[dead.url]["last_error"]
    assert status["pending_by_target"] == {dead.url: 1}
    assert status["last_run_id"]
    # The supervisor records the job's state as it changes: this run's job finished.
    assert status["job"]["state"] == "EXITED"
    assert status["job"]["restarts"] == "0"
    assert status["job"]["updated_at"] is not None


@pytest.mark.slow
def test_heartbeat_pings_while_a_run_is_healthy_and_status_shows_it(tmp_path: Path) -> None:
    """A real run with a heartbeat URL pings it at start and every interval; status shows it.

    The job runs until the test has seen the pings (it waits for a file the test writes),
    so no sleep of the job's decides how many pings fit in it."""
    state, go = tmp_path / "state", tmp_path / "go"
    job = (
        "import pathlib, sys, time\n"
        "deadline = time.monotonic() + 60\n"
        "while not pathlib.Path(sys.argv[1]).exists():\n"
        "    assert time.monotonic() < deadline, 'the test never said go'\n"
        "    time.sleep(0.02)\n"
    )
    clean = clean_env()
    env = {
        **clean,
        "SENTINEL_NOTIFY__HEARTBEAT_INTERVAL_S": "0.2",
        "SENTINEL_GPU__ENABLED": "false",
    }
    with WebhookReceiver() as beat:
        env["SENTINEL_NOTIFY__HEARTBEAT_URL"] = beat.http_url("/ping/4f1c9e2a")
        command = ["run", "--state-dir", str(state), "--", sys.executable, "-c", job, str(go)]
        with subprocess.Popen(
            [sys.executable, "-m", "sentinel", *command],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ) as run:  # fmt: skip
            try:
                beat.wait_for(3, timeout=30.0)  # one at start, more while the job runs
            finally:
                go.touch()
                _, stderr = run.communicate(timeout=60)
        assert run.returncode == 0, stderr
        pings = [request for request in beat.requests if request.method == "GET"]
    assert len(pings) >= 3
    assert all(request.path == "/ping/4f1c9e2a" for request in pings)
    result = sentinel("status", "--state-dir", str(state), "--json")
    status: dict[str, Any] = json.loads(result.stdout)
    last_ok_at = status["heartbeat"]["last_ok_at"]
    assert pings[0].received_at <= last_ok_at <= time.time()  # an answered ping of this run
    assert "4f1c9e2a" not in stderr


def set_aside(checkpoints: Path) -> None:
    """A checkpoint dir after a rollback: 3000 bytes quarantined; kept: a 1000-byte copy,
    and a link to the job's own ckpt.pt (no extra disk until the job replaces it)."""
    quarantined = checkpoints / "quarantine" / "20261121T140600-loss_spike" / "checkpoint-60"
    quarantined.mkdir(parents=True)
    (quarantined / "model.safetensors").write_bytes(b"\x00" * 2000)
    (quarantined / "optimizer.pt").write_bytes(b"\x00" * 1000)
    kept = checkpoints / ".sentinel-kept" / "ckpt.pt"
    (kept / "000001").mkdir(parents=True)
    (kept / "000001" / "ckpt.pt").write_bytes(b"\x01" * 1000)
    (checkpoints / "ckpt.pt").write_bytes(b"\x02" * 500)
    (kept / "000002").mkdir()
    os.link(checkpoints / "ckpt.pt", kept / "000002" / "ckpt.pt")


def test_disk_taken_by_quarantine_and_kept_copies(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    set_aside(checkpoints)
    StateStore(tmp_path).close()
    status = gather(tmp_path, checkpoints=checkpoints, warn_disk_bytes=5000)
    disk = status.to_json()["disk"]
    assert (disk["quarantine_bytes"], disk["kept_bytes"], disk["total_bytes"]) == (3000, 1000, 4000)
    assert (disk["checkpoints"], disk["over_limit"]) == (str(checkpoints), False)
    assert "disk:       quarantine 2.9 KiB, kept copies 1000 B" in "\n".join(status.lines())
    assert not [line for line in status.lines() if line.startswith("warning:")]
    # The job replaces ckpt.pt by rename: the old inode is now the keeper's alone.
    (checkpoints / "ckpt.tmp").write_bytes(b"\x03" * 500)
    os.replace(checkpoints / "ckpt.tmp", checkpoints / "ckpt.pt")
    assert gather(tmp_path, checkpoints=checkpoints).to_json()["disk"]["kept_bytes"] == 1500


def test_the_run_recorded_checkpoint_dir_wins_and_a_warning_passes_the_limit(
    tmp_path: Path,
) -> None:
    recorded, configured = tmp_path / "recorded", tmp_path / "configured"
    set_aside(recorded)
    configured.mkdir()
    store = StateStore(tmp_path)
    store.put("checkpoints.dir", str(recorded))
    store.close()
    status = gather(tmp_path, checkpoints=configured, warn_disk_bytes=3999)
    assert status.disk is not None and status.disk.directory == recorded
    assert status.to_json()["disk"]["over_limit"] is True
    warning = [line for line in status.lines() if line.startswith("warning:")]
    assert warning == [
        "warning:    quarantine and kept copies take 3.9 KiB, over the 3.9 KiB of"
        " [keep] warn_disk_bytes; nothing is deleted by itself"
    ]


def test_no_checkpoint_dir_known_shows_no_figures(tmp_path: Path) -> None:
    StateStore(tmp_path).close()
    status = gather(tmp_path)
    assert status.to_json()["disk"] is None
    assert "disk:       no checkpoint dir known" in status.lines()
    store = StateStore(tmp_path)
    store.put("checkpoints.dir", str(tmp_path / "gone"))  # recorded, since removed
    store.close()
    assert gather(tmp_path).disk is None


@pytest.mark.slow
def test_cli_warns_from_the_configured_limit(tmp_path: Path) -> None:
    set_aside(tmp_path / "ckpt")
    StateStore(tmp_path / "state").close()
    env = {"SENTINEL_KEEP__WARN_DISK_BYTES": "1000"}
    result = sentinel(
        "status", "--state-dir", str(tmp_path / "state"), "--checkpoints", str(tmp_path / "ckpt"),
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning:    quarantine and kept copies take 3.9 KiB" in result.stdout


# -- what cannot be read, and the last incident, its report and the verdict -------------------

REPORT = {
    "id": "20261128T215102-498a41-1",
    "rule": "nan_inf",
    "severity": "critical",
    "opened_at": T0,
    "resolved_at": None,
    "onset_step": 4,
}
VERDICT = {"state": "final", "code": 90, "verdict": "give_up", "rule": "nan_inf", "step": 4,
           "resume_from": None, "attempt": 1, "time": T0 + 1}  # fmt: skip


def broken_state_dir(state: Path) -> None:
    """A state dir whose state.db is garbage, whose alerts.jsonl is a folder and with one
    garbled report beside a good one and its markdown, and a good verdict."""
    state.mkdir()
    (state / "state.db").write_bytes(b"this is not SQLite\n" * 10)
    (state / "reports").mkdir()
    (state / "reports" / "bad.json").write_text("{half a rep")
    (state / "reports" / f"{REPORT['id']}.json").write_text(json.dumps(REPORT))
    (state / "reports" / f"{REPORT['id']}.md").write_text("# CRITICAL nan_inf\n")
    (state / "verdict.json").write_text(json.dumps(VERDICT))


def test_gather_reads_what_it_can_and_names_what_it_cannot(tmp_path: Path) -> None:
    state = tmp_path / "state"
    broken_state_dir(state)
    status = gather(state)
    assert status.unreadable == [
        "state.db: file is not a database",
        "reports/bad.json: not an incident report",
    ]
    incident = status.last_incident
    assert incident is not None
    assert (incident.rule, incident.severity, incident.step) == ("nan_inf", "critical", 4)
    assert incident.report == str(state / "reports" / f"{REPORT['id']}.md")
    assert status.verdict is not None and (status.verdict.state, status.verdict.code) == (
        "final", 90
    )  # fmt: skip


@pytest.mark.parametrize(
    ("break_it", "said"),
    [
        (lambda s: (s / "state.db").mkdir(), "state.db: a directory, not a file"),
        (lambda s: (s / "verdict.json").mkdir(), "verdict.json: a directory, not a file"),
        (lambda s: (s / "verdict.json").write_bytes(b"\xff\xfe{"), "verdict.json: not UTF-8 text"),
        (lambda s: (s / "verdict.json").write_text('{"state": "final", "code": 7}'),
         "verdict.json: not a verdict record"),
        (lambda s: (s / "reports").write_text("a file"), "reports/: not a directory"),
    ],
    ids=["db-is-a-dir", "verdict-is-a-dir", "verdict-not-utf8", "verdict-bad-code",
         "reports-is-a-file"],
)  # fmt: skip
def test_each_unreadable_part_is_one_reason(
    tmp_path: Path, break_it: Callable[[Path], object], said: str
) -> None:
    StateStore(tmp_path).close()
    if said.startswith("state.db"):
        for path in tmp_path.glob("state.db*"):
            path.unlink()
    break_it(tmp_path)
    status = gather(tmp_path)
    assert status.unreadable == [said]


@pytest.mark.slow
def test_cli_on_a_broken_state_dir_says_what_it_cannot_read_in_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    broken_state_dir(state)
    result = sentinel("status", "--state-dir", str(state))
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    [unreadable] = [line for line in result.stdout.splitlines() if "not a database" in line]
    assert unreadable == (
        "unreadable: state.db: file is not a database; reports/bad.json: not an incident report"
    )
    assert "incident:   critical nan_inf at step 4" in result.stdout
    assert f"report:     {state / 'reports' / REPORT['id']}.md" in result.stdout
    assert "verdict:    final 90 give_up (nan_inf, at step 4, attempt 1" in result.stdout
    as_json = sentinel("status", "--state-dir", str(state), "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["unreadable"][0] == "state.db: file is not a database"


@pytest.mark.slow
def test_cli_on_a_file_for_a_state_dir_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a folder")
    result = sentinel("status", "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "is not a directory" in result.stderr


@pytest.mark.slow
def test_status_after_a_run_that_gave_up_shows_the_incident_report_and_verdict(
    tmp_path: Path,
) -> None:
    """A real run: a NaN at step 4, no checkpoint to roll back to, so sentinel gives up (90)."""
    state, job = tmp_path / "state", tmp_path / "job.py"
    job.write_text(
        "import json, time\n"
        "for step in range(1, 4):\n"
        "    print(json.dumps({'step': step, 'loss': 2.0}), flush=True)\n"
        "print(json.dumps({'step': 4, 'loss': float('nan')}), flush=True)\n"
        "time.sleep(30)\n"
    )
    run = sentinel("run", "--state-dir", str(state), "--", sys.executable, str(job))
    assert run.returncode == 90, run.stderr
    result = sentinel("status", "--state-dir", str(state))
    assert result.returncode == 0, result.stdout + result.stderr
    [report] = (state / "reports").glob("*.md")
    assert "incident:   critical nan_inf at step 4" in result.stdout
    assert f"report:     {report}" in result.stdout
    assert "verdict:    final 90 give_up (nan_inf, at step 4, attempt 1" in result.stdout
    assert "unreadable" not in result.stdout
    status = json.loads(sentinel("status", "--state-dir", str(state), "--json").stdout)
    incident = status["last_incident"]
    assert (incident["rule"], incident["severity"], incident["step"]) == ("nan_inf", "critical", 4)
    assert incident["report"] == str(report)
    assert (status["verdict"]["state"], status["verdict"]["code"]) == ("final", 90)
    assert status["unreadable"] == []


def test_status_json_masks_a_token_the_verdicts_stop_quotes(tmp_path: Path) -> None:
    """The stop in verdict.json quotes the job's crash line: ``status --json`` printed the
    token the job had printed in it, in full."""
    state = tmp_path / "state"
    state.mkdir()
    stop = {"incident": {"alerts": [{"message": "crash: xoxb-1234-5678-abcdefghij was"}]}}
    (state / "verdict.json").write_text(json.dumps({**VERDICT, "stop": stop}))
    printed = json.dumps(gather(state).to_json())
    assert "xoxb-1234-5678-abcdefghij" not in printed and "xoxb-****" in printed, printed


def test_a_delivery_record_edited_by_hand_reads_as_not_known(tmp_path: Path) -> None:
    """A time that is text or bytes in ``notify_targets`` (a state.db edited by hand) made
    ``status`` end in a traceback, and ``--json`` too."""
    store = StateStore(tmp_path)
    record_result(store, "json://127.0.0.1:1/a", "slack", T0, None)
    record_result(store, "json://127.0.0.1:1/b", "pager", T0, "HTTP 500")
    with store.transaction() as conn:
        conn.execute(
            "UPDATE notify_targets SET last_attempt_at = 'yesterday', last_success_at = ?,"
            " last_failure_at = 1e999, last_error = ? WHERE name = 'slack'",
            (b"\xff\x00", b"\x00"),
        )
    store.close()
    status = gather(tmp_path)
    by_name = {result.name: result for result in status.targets}
    assert (by_name["slack"].last_attempt_at, by_name["slack"].last_success_at) == (None, None)
    assert (by_name["slack"].last_failure_at, by_name["slack"].last_error) == (None, None)
    assert by_name["pager"].last_failure_at == T0 and by_name["pager"].last_error == "HTTP 500"
    assert "slack" in "\n".join(status.lines())
    assert json.loads(json.dumps(status.to_json()))["targets"][0]["name"] in ("slack", "pager")


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        pytest.param("checkpoints.dir", "9" * 5000, "File name too long", id="dir-name-too-long"),
        pytest.param("checkpoints.dir", "/tmp/a\x00b", None, id="dir-with-a-nul"),
        pytest.param("memory", "[" * 100_000 + "]" * 100_000, "recursion", id="memory-too-deep"),
        pytest.param(
            "memory",
            json.dumps({"incidents": [{"id": "a\x00b", "rule": "nan_inf", "opened_at": 9e9}]}),
            None,
            id="incident-id-with-a-nul",
        ),
        pytest.param("job.updated_at", "inf", None, id="time-inf"),
        pytest.param("heartbeat.last_ok_at", "nan", None, id="time-nan"),
    ],
)
def test_a_state_edited_by_hand_is_read_as_far_as_it_goes(
    tmp_path: Path, key: str, value: str, said: str | None
) -> None:
    """Each of these ended ``status`` in a traceback, or ``--json`` in ``NaN``, which is no
    JSON (oos47)."""
    StateStore(tmp_path).close()
    with closing(sqlite3.connect(tmp_path / "state.db")) as conn:
        conn.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))
        conn.commit()
    status = gather(tmp_path)
    assert "\n".join(status.lines())
    json.dumps(status.to_json(), allow_nan=False)
    if said is None:
        assert status.unreadable == []
    else:
        [line] = status.unreadable
        assert said.lower() in line.lower() and len(line) < 400, line


def test_an_unreadable_verdict_is_not_said_to_be_none(tmp_path: Path) -> None:
    """``status`` named verdict.json unreadable, then said "verdict: none", where ``sentinel
    verdict`` exits 94: a verdict may be there (oos47b); ``--json`` gave a null verdict and
    said why only in its list of what was unreadable."""
    StateStore(tmp_path).close()
    (tmp_path / "verdict.json").write_text('{"state": "final", "code": 9')
    status = gather(tmp_path)
    [said] = [line for line in status.lines() if line.startswith("verdict:")]
    assert said == "verdict:    unreadable (verdict.json above): a verdict may be there"
    # And --json says why beside its null verdict, which alone read as "there is none".
    as_json = status.to_json()
    assert (as_json["verdict"], as_json["verdict_unreadable"]) == (None, "not a verdict record")
    (tmp_path / "verdict.json").unlink()
    assert gather(tmp_path).to_json()["verdict_unreadable"] is None


def test_a_report_file_that_is_a_symlink_loop_is_named_not_its_folder(tmp_path: Path) -> None:
    """One report's file a symlink loop made ``status`` say the whole ``reports/`` could not
    be read, and show no last incident (oos47b)."""
    state = tmp_path / "state"
    broken_state_dir(state)
    (state / "reports" / "bad.json").unlink()
    os.symlink("loop.json", state / "reports" / "loop.json")
    os.symlink("loop.md", state / "reports" / "loop.md")
    status = gather(state)
    assert status.unreadable == [
        "state.db: file is not a database",
        "reports/loop.json: too many levels of symbolic links",
    ]
    assert status.last_incident is not None and status.last_incident.rule == "nan_inf"
