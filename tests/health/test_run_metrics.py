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
    assert samples[("sentinel_spend", ())] > 2.0  # 2 GPUs, over a second at $1 a GPU-second
