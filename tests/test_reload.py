"""SIGHUP reloads the config: a bad one is refused and the running one kept; a good one is taken.

A real ``sentinel run`` with a real job, and real SIGHUPs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.env import clean_env

pytestmark = pytest.mark.slow

JOB = """
import json, time
for step in range(1, 400):
    print(json.dumps({"step": step, "loss": 2.0}), flush=True)
    time.sleep(0.05)
"""


def _wait_for(said: list[str], text: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(text in line for line in said):
        assert time.monotonic() < deadline, f"never said {text!r}: {''.join(said)}"
        time.sleep(0.05)


def test_sighup_keeps_the_running_config_when_the_new_one_is_bad_and_takes_a_good_one(
    tmp_path: Path,
) -> None:
    config = tmp_path / "sentinel.toml"
    config.write_text("[rules.loss_spike]\nfactor = 3.0\n")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    sentinel = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "run", "--config", str(config),
         "--state-dir", str(tmp_path / "state"), "--", sys.executable, str(job)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=clean_env(),
    )  # fmt: skip
    said: list[str] = []
    assert sentinel.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(iter(sentinel.stderr.readline, "")))
    reader.start()
    try:
        _wait_for(said, "job started (attempt 1")
        config.write_text("[rules.loss_spike]\nfactor = 0.5\n")  # must be > 1
        sentinel.send_signal(signal.SIGHUP)
        _wait_for(said, "the new config is invalid, keeping the running one")
        config.write_text('[rules.loss_spike]\nfactor = 4.0\n[notify]\nmin_severity = "critical"\n')
        sentinel.send_signal(signal.SIGHUP)
        _wait_for(said, "SIGHUP: config reloaded")
        assert sentinel.poll() is None, "a SIGHUP never stops sentinel or its job"
    finally:
        sentinel.send_signal(signal.SIGTERM)
        sentinel.wait(timeout=60)
        reader.join()
        sentinel.stderr.close()
    text = "".join(said)
    assert "rules.loss_spike.factor (from" in text and str(config) in text
    assert "rule changes take effect when the next attempt starts" in text
