"""A real ``sentinel run`` feeds the series the README lists: incidents, notifications,
non-finite values, the outbox, garbled lines and spend, read back from its textfile."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.env import clean_env
from tests.helpers.webhook import WebhookReceiver

pytestmark = pytest.mark.slow

# A garbled line, then a NaN the job survives (nan_inf only notifies here), then quiet
# steps long enough for a few clock ticks after the notice went out.
JOB = textwrap.dedent(
    """
    import json, time
    print('{"step": 1, "loss": oops', flush=True)
    for step in range(2, 40):
        loss = float("nan") if step == 5 else 2.0
        print(json.dumps({"step": step, "loss": loss}), flush=True)
        time.sleep(0.1)
    """
)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    yield hook
    hook.stop()


def _samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(path.read_text())
        for sample in family.samples
    }


def test_a_run_exports_incidents_notifications_garbled_lines_and_spend(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    job, textfile = tmp_path / "job.py", tmp_path / "sentinel.prom"
    job.write_text(JOB)
    env = clean_env()
    env.update(
        SENTINEL_RULES__NAN_INF__ON_CRITICAL="notify",
        SENTINEL_NOTIFY__GROUP_WAIT_S="0",
        SENTINEL_COST__GPUS="2",
        SENTINEL_COST__PRICE_PER_GPU_HOUR="3600",  # a dollar a GPU-second: visible at once
    )
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "state"),
         "--notify", receiver.url, "--metrics-textfile", str(textfile),
         "--", sys.executable, str(job)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert receiver.requests, "the notice went out"
    samples = _samples(textfile)
    rule = (("rule", "nan_inf"), ("severity", "critical"))
    assert samples[("sentinel_incidents_total", rule)] >= 1
    assert samples[("sentinel_notifications_total", (("scheme", "json"),))] >= 1
    assert ("sentinel_notification_failures_total", (("scheme", "json"),)) not in samples
    assert samples[("sentinel_log_lines_garbled_total", ())] == 1
    assert samples[("sentinel_outbox_pending", ())] == 0
    assert samples[("sentinel_nonfinite_values_total", (("metric", "loss"),))] >= 1
    # 2 GPUs, over a second at $1 a GPU-second
    assert samples[("sentinel_spend_currency_units", ())] > 2.0


LOSS_ONLY_JOB = textwrap.dedent(
    """
    import json, time
    for step in range(1, 25):
        print(json.dumps({"step": step, "loss": 2.0 - step / 100}), flush=True)
        time.sleep(0.1)
    """
)


def test_a_job_that_logs_only_loss_exports_no_grad_norm_throughput_or_spend(
    tmp_path: Path,
) -> None:
    """Series nobody logged are absent from the textfile, not a made-up 0.0."""
    job, textfile = tmp_path / "job.py", tmp_path / "sentinel.prom"
    job.write_text(LOSS_ONLY_JOB)
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "run", "--state-dir", str(tmp_path / "state"),
         "--metrics-textfile", str(textfile), "--", sys.executable, str(job)],
        env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = textfile.read_text()
    names = {name for name, _ in _samples(textfile)}
    for absent in ("sentinel_grad_norm", "sentinel_tokens_per_second",
                   "sentinel_spend_currency_units", "sentinel_spend"):  # fmt: skip
        assert absent not in names, text
        assert f"# TYPE {absent} " not in text
    samples = _samples(textfile)
    step = samples[("sentinel_training_step", ())]  # as of the last tick
    assert 1 <= step <= 24
    assert samples[("sentinel_loss", ())] == pytest.approx(2.0 - step / 100)
    assert samples[("sentinel_last_progress_timestamp_seconds", ())] > 0
    assert samples[("sentinel_job_attempt", ())] == 1
    # Written once more as the run ended: the job is gone, not up as at the last tick.
    assert samples[("sentinel_target_up", ())] == 0
