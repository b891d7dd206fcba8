"""What sentinel knows of a run outlives sentinel: a ``sentinel watch`` killed with SIGKILL
and started again beside the same job takes back its open incidents, who was told of them
and its clocks, so nobody is paged twice for one incident; the spend of earlier attempts
counts on in the next."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from sentinel.engine.core import Engine
from sentinel.model.facts import RunFacts
from sentinel.model.incidents import IncidentTracker
from sentinel.model.records import Alert, Severity
from sentinel.notify.dispatch import Dispatcher, Policy
from sentinel.notify.notices import JobInfo
from sentinel.notify.outbox import Outbox
from sentinel.parsing.line_parser import LineParser
from sentinel.rules import STORIES
from sentinel.rules.cost_overrun import CostOverrunConfig, CostOverrunDetector
from sentinel.service.memory import MEMORY_KEY, RunMemory
from sentinel.store.state import StateStore
from tests.helpers.env import clean_env
from tests.helpers.webhook import WebhookReceiver

# A job that keeps training with a NaN loss from step 5 on (sentinel only notifies).
JOB = textwrap.dedent(
    """
    import json, os, sys, time
    log, pidfile = sys.argv[1], sys.argv[2]
    with open(log, "a") as out:
        open(pidfile + ".tmp", "w").write(str(os.getpid()))
        os.replace(pidfile + ".tmp", pidfile)
        for step in range(1, 100000):
            loss = float("nan") if step >= 5 else 2.0
            out.write(json.dumps({"step": step, "loss": loss}) + "\\n")
            out.flush()
            time.sleep(0.05)
    """
)


def _wait(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_restarted_watch_takes_back_the_open_incident_and_pages_nobody_twice(
    tmp_path: Path,
) -> None:
    log, pidfile, state = tmp_path / "train.log", tmp_path / "job.pid", tmp_path / "state"
    (tmp_path / "job.py").write_text(JOB)
    job = subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(log), str(pidfile)])
    env = {
        **clean_env(),
        "SENTINEL_RULES__NAN_INF__ON_CRITICAL": "notify",
        "SENTINEL_NOTIFY__GROUP_WAIT_S": "0",
        "SENTINEL_TICK_INTERVAL_S": "0.1",
    }
    with WebhookReceiver() as hook:

        def watch() -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "sentinel", "watch", "--pidfile", str(pidfile),
                 "--log", str(log), "--notify", hook.url, "--state-dir", str(state)],
                env=env, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip

        try:
            _wait(pidfile.exists)
            first = watch()
            hook.wait_for(1, timeout=30)
            time.sleep(0.5)  # the memory is saved on the next tick
            first.send_signal(signal.SIGKILL)
            first.communicate(timeout=10)
            paged = len(hook.accepted)
            second = watch()
            try:
                # The new sentinel's own nan_inf rule raises the NaN again (critical)...
                _wait(lambda: (state / "alerts.jsonl").read_text().count('"nan_inf"') >= 2)
                time.sleep(1.0)  # ...and its page, were it sent, would be here by now
            finally:
                second.send_signal(signal.SIGTERM)
                _out, err = second.communicate(timeout=30)
        finally:
            job.kill()
            job.wait()
        assert len(hook.accepted) == paged == 1, [r.json for r in hook.accepted]
    assert "took back what sentinel knew before it restarted (the same job)" in err, err
    assert "1 open incident(s)" in err
    # The very process the first sentinel watched: its attempt still, not the next one.
    assert "job found (attempt 1, pid" in err and "attempt 2" not in err, err
    assert "CRITICAL nan_inf" in err, "the restarted sentinel saw the NaN itself"


def _cost_rule() -> CostOverrunDetector:
    rule = CostOverrunDetector(CostOverrunConfig(budget=1000.0))
    rule.facts = RunFacts(price_per_gpu_hour=3600.0, gpus=2)  # $1 per GPU-second
    return rule


def test_the_spend_of_earlier_attempts_counts_on_after_a_restart_of_sentinel() -> None:
    before = _cost_rule()
    before.job_started(100.0)
    memory = before.memory(160.0)  # 60 s on 2 GPUs
    assert memory is not None and memory["gpu_s"] == 120.0

    after = _cost_rule()  # a new sentinel, a new attempt that started at 200
    after.job_started(200.0)
    after.remember(memory, same_job=False)
    assert after.memory(210.0)["gpu_s"] == 120.0 + 20.0  # type: ignore[index]


def test_the_same_job_is_charged_once_for_the_time_before_the_restart() -> None:
    before = _cost_rule()
    before.job_started(100.0)
    memory = before.memory(160.0)
    assert memory is not None

    after = _cost_rule()  # the same job (started at 100) found again at 190
    after.job_started(100.0)
    after.remember(memory, same_job=True)
    # 60 s before the save, then from the save on: the 30 s sentinel was down count once.
    assert after.memory(190.0)["gpu_s"] == 120.0 + 60.0  # type: ignore[index]


def test_a_tick_saves_at_once_while_incidents_change_and_seldom_while_none_is_open(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "state")
    try:
        engine = Engine([], LineParser())
        tracker = IncidentTracker("run", STORIES)
        dispatcher = Dispatcher(Outbox(store), [], Policy(), JobInfo("j", "h", "run-1"))
        memory = RunMemory(store, remember=False, run_wide=False)

        def tick(now: float) -> bool:
            due = memory.due(now, tracker)
            if due:
                memory.save(now, engine, tracker, dispatcher, lambda _what, write, *a: write(*a))
            return due

        def saved() -> list[str]:
            text = store.get(MEMORY_KEY)
            assert text is not None
            return [incident["id"] for incident in json.loads(text)["incidents"]]

        assert tick(100.0) and saved() == []
        assert not tick(101.0) and not tick(104.9), "nothing open: not every tick"
        assert tick(105.0)
        alert = Alert(rule="nan_inf", severity=Severity.CRITICAL, message="m", time=105.5, step=9)
        tracker.observe(alert)
        assert tick(106.0), "an incident opened: at the next tick"
        assert len(saved()) == 1
        assert tick(107.0), "each tick while it is open"
        tracker.close_all(107.5)
        assert tick(108.0) and saved() == [], "its close too"
        assert not tick(109.0)
        tracker.observe(replace(alert, time=109.2))
        tracker.close_all(109.4)  # opened and closed between two ticks
        assert tick(110.0)
        memory.job_started((4242, 100.0), engine, tracker, dispatcher)
        assert tick(110.5), "a new attempt: whose memory it is, at once"
        assert json.loads(store.get(MEMORY_KEY) or "{}")["job"] == [4242, 100.0]
    finally:
        store.close()
