"""The --http endpoints, scraped over real HTTP on 127.0.0.1:0 and parsed with
prometheus_client's own text parser; the probes against an injected clock."""

from __future__ import annotations

import math
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from sentinel import __version__
from sentinel.service.http import HealthServer, parse_http_address, state_dir_usable
from sentinel.service.metrics import Metrics

TICK_S = 1.0
LIVE_WITHIN_S = 3 * TICK_S + 5.0
#: So that stopping a server in a test takes milliseconds, not half a second.
POLL_S = 0.01


class Clock:
    """Monotonic time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get(url: str, accept: str | None = None) -> tuple[int, Message, str]:
    """Status, headers and body of a GET, for any status."""
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read().decode()


def scrape(server: HealthServer) -> dict[str, Metric]:
    status, headers, body = get(server.url + "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {family.name: family for family in text_string_to_metric_families(body)}


def value(families: dict[str, Metric], sample_name: str, **labels: str) -> float:
    """The value of the one sample named ``sample_name`` with exactly ``labels``."""
    for family in families.values():
        for sample in family.samples:
            if sample.name == sample_name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"no sample {sample_name}{labels}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics(clock: Clock) -> Metrics:
    return Metrics(job_name="llama-sft", host="gpu-07", mode="watch", clock=clock)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def server(metrics: Metrics, state_dir: Path) -> Iterator[HealthServer]:
    server = HealthServer(
        metrics,
        "127.0.0.1:0",
        live_within_s=LIVE_WITHIN_S,
        poll_interval_s=POLL_S,
        ready_checks={"state_dir": state_dir_usable(state_dir)},
    )
    server.start()
    yield server
    server.stop()


def test_port_zero_binds_loopback_and_reports_the_port(server: HealthServer) -> None:
    host, port = server.address
    assert host == "127.0.0.1"
    assert port > 0
    assert server.url == f"http://127.0.0.1:{port}"


def test_a_scrape_reports_what_the_loop_told_it(metrics: Metrics, server: HealthServer) -> None:
    metrics.attempt_started(2)
    metrics.restarted()
    metrics.lines_read(120, garbled=3)
    metrics.lines_read(5)
    metrics.sample("loss", 2.5, step=10, now=1_700_000_000.0)
    metrics.sample("grad_norm", 1.25, step=10)
    metrics.sample("tokens_per_sec", 5120.0, step=10)
    metrics.sample("loss", math.nan, step=11, now=1_700_000_030.0)
    metrics.sample("grad_norm", math.inf, step=11)
    metrics.sample("eval_loss", 2.0, step=9, now=1_700_000_090.0)  # older step: no progress
    metrics.loop_turned(1_700_000_031.0)
    metrics.incident_opened("nan_inf", "critical")
    metrics.incident_opened("loss_spike", "warning")
    metrics.incidents_active({"nan_inf": 1})
    metrics.action("stop")
    metrics.action("rollback", ok=False)
    metrics.notified("slack", ok=True)
    metrics.notified("mailtos://user:hunter2@example.com", ok=False)
    metrics.outbox_depth(4)
    metrics.spend(412.5)

    families = scrape(server)

    assert value(families, "sentinel_build_info", version=__version__) == 1
    assert value(families, "sentinel_job_info", name="llama-sft", host="gpu-07", mode="watch") == 1
    assert value(families, "sentinel_target_up") == 1
    assert value(families, "sentinel_job_attempt") == 2
    assert value(families, "sentinel_job_restarts_total") == 1
    assert value(families, "sentinel_log_lines_total") == 125
    assert value(families, "sentinel_log_lines_garbled_total") == 3
    assert value(families, "sentinel_training_step") == 11
    assert value(families, "sentinel_last_progress_timestamp_seconds") == 1_700_000_030.0
    assert value(families, "sentinel_loop_last_success_timestamp_seconds") == 1_700_000_031.0
    assert value(families, "sentinel_nonfinite_values_total", metric="loss") == 1
    assert value(families, "sentinel_nonfinite_values_total", metric="grad_norm") == 1
    assert math.isnan(value(families, "sentinel_loss"))
    assert value(families, "sentinel_grad_norm") == math.inf
    assert value(families, "sentinel_tokens_per_second") == 5120.0
    assert value(families, "sentinel_incidents_total", rule="nan_inf", severity="critical") == 1
    assert value(families, "sentinel_incidents_total", rule="loss_spike", severity="warning") == 1
    assert value(families, "sentinel_incidents_active", rule="nan_inf") == 1
    assert value(families, "sentinel_actions_total", kind="stop") == 1
    assert value(families, "sentinel_actions_total", kind="rollback") == 1
    assert value(families, "sentinel_action_failures_total", kind="rollback") == 1
    assert value(families, "sentinel_notifications_total", scheme="slack") == 1
    assert value(families, "sentinel_notifications_total", scheme="mailtos") == 1
    assert value(families, "sentinel_notification_failures_total", scheme="mailtos") == 1
    assert "hunter2" not in get(server.url + "/metrics")[2]
    assert value(families, "sentinel_outbox_pending") == 4
    assert value(families, "sentinel_spend_currency_units") == 412.5


def test_series_follow_prometheus_naming(metrics: Metrics, server: HealthServer) -> None:
    metrics.attempt_started(1)
    for name in ("loss", "grad_norm", "tokens_per_sec"):
        metrics.sample(name, 1.0, step=3)
    metrics.loop_turned()
    metrics.outbox_depth(0)
    metrics.spend(1.0)
    metrics.fp16_skipped_steps(0)
    families = scrape(server)
    assert len(families) >= 20
    for name, family in families.items():
        assert name.startswith("sentinel_"), name
        assert ":" not in name
        assert name == name.lower()
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), name
        else:
            assert not name.endswith("_total"), name
        if "timestamp" in name:
            assert name.endswith("_timestamp_seconds"), name


def test_a_gauge_nobody_set_is_absent_not_zero(metrics: Metrics, server: HealthServer) -> None:
    """A job that logs no grad-norm has no ``sentinel_grad_norm``, not a made-up 0.0."""
    unset = {"sentinel_job_attempt", "sentinel_training_step",
             "sentinel_last_progress_timestamp_seconds",
             "sentinel_loop_last_success_timestamp_seconds", "sentinel_outbox_pending",
             "sentinel_spend_currency_units", "sentinel_fp16_skipped_steps", "sentinel_loss",
             "sentinel_grad_norm", "sentinel_tokens_per_second"}  # fmt: skip
    body = get(server.url + "/metrics")[2]
    assert not unset & set(scrape(server)), body
    assert value(scrape(server), "sentinel_target_up") == 0  # true: nothing observed yet
    metrics.sample("loss", 0.0, step=1, now=5.0)
    families = scrape(server)
    assert value(families, "sentinel_loss") == 0.0  # a real zero is exported as such
    assert value(families, "sentinel_training_step") == 1
    assert "sentinel_grad_norm" not in families


def test_each_metrics_has_a_registry_of_its_own(clock: Clock) -> None:
    """Two in one process do not collide, and the global registry is left alone."""
    from prometheus_client import REGISTRY

    first, second = Metrics(clock=clock), Metrics(clock=clock)
    first.lines_read(7)
    assert b"sentinel_log_lines_total 7.0" in first.exposition()
    assert b"sentinel_log_lines_total 0.0" in second.exposition()
    assert REGISTRY.get_sample_value("sentinel_log_lines_total") is None


def test_a_new_attempt_counts_its_steps_from_the_start(metrics: Metrics) -> None:
    metrics.sample("loss", 1.0, step=500, now=100.0)
    metrics.attempt_started(2)
    metrics.sample("loss", 1.0, step=400, now=200.0)  # resumed from an earlier checkpoint
    assert metrics.registry.get_sample_value("sentinel_training_step") == 400
    assert metrics.registry.get_sample_value("sentinel_last_progress_timestamp_seconds") == 200


def test_nonfinite_metric_names_are_capped(metrics: Metrics) -> None:
    from sentinel.service.metrics import MAX_METRIC_LABELS

    for index in range(MAX_METRIC_LABELS + 5):
        metrics.sample(f"m{index}", math.nan)
    metrics.sample("m0", math.nan)
    labels = {
        sample.labels["metric"]
        for family in metrics.registry.collect()
        if family.name == "sentinel_nonfinite_values"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert len(labels) == MAX_METRIC_LABELS + 1
    get_value = metrics.registry.get_sample_value
    assert get_value("sentinel_nonfinite_values_total", {"metric": "other"}) == 5
    assert get_value("sentinel_nonfinite_values_total", {"metric": "m0"}) == 2


def test_incidents_closed_drop_to_zero(metrics: Metrics) -> None:
    metrics.incidents_active({"nan_inf": 1, "stall": 2})
    metrics.incidents_active({"stall": 1})
    get_value = metrics.registry.get_sample_value
    assert get_value("sentinel_incidents_active", {"rule": "nan_inf"}) == 0
    assert get_value("sentinel_incidents_active", {"rule": "stall"}) == 1


def test_openmetrics_when_asked(server: HealthServer) -> None:
    status, headers, body = get(server.url + "/metrics", accept="application/openmetrics-text")
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


@pytest.mark.parametrize("path", ["/livez", "/healthz"])
def test_liveness_fails_when_the_loop_stops_turning(
    path: str, clock: Clock, metrics: Metrics, server: HealthServer
) -> None:
    metrics.loop_turned()
    assert get(server.url + path)[0] == 200
    clock.now += LIVE_WITHIN_S - 0.5
    assert get(server.url + path)[0] == 200
    clock.now += 1.0
    status, _, body = get(server.url + path + "?verbose")
    assert status == 503
    assert "[-]loop failed" in body
    metrics.loop_turned()
    assert get(server.url + path)[0] == 200


def test_liveness_has_a_first_bound_before_the_first_turn(
    clock: Clock, server: HealthServer
) -> None:
    assert get(server.url + "/livez")[0] == 200
    clock.now += LIVE_WITHIN_S + 1
    assert get(server.url + "/livez")[0] == 503


def test_readiness_is_config_and_state_dir(server: HealthServer, state_dir: Path) -> None:
    status, _, body = get(server.url + "/readyz?verbose")
    assert status == 503
    assert "[-]config failed" in body
    server.set_ready()
    status, _, body = get(server.url + "/readyz?verbose")
    assert status == 200
    assert "[+]state_dir ok" in body
    assert "[+]http ok" in body
    shutil.rmtree(state_dir)
    state_dir.write_text("a file, not a directory")
    status, _, body = get(server.url + "/readyz?verbose")
    assert status == 503
    assert "[-]state_dir failed" in body


def test_a_failing_job_never_fails_a_probe(
    clock: Clock, metrics: Metrics, server: HealthServer
) -> None:
    """A NaN, a critical incident, a job gone: the kubelet must not restart the watchdog."""
    server.set_ready()
    metrics.loop_turned()
    metrics.sample("loss", math.nan, step=100)
    metrics.incident_opened("nan_inf", "critical")
    metrics.incidents_active({"nan_inf": 1})
    metrics.action("stop", ok=False)
    metrics.target_up(False)
    metrics.loop_turned()
    for path in ("/livez", "/healthz", "/readyz"):
        assert get(server.url + path)[0] == 200, path
    families = scrape(server)
    assert value(families, "sentinel_target_up") == 0


def test_a_raising_check_fails_its_probe_without_killing_the_server(
    metrics: Metrics,
) -> None:
    def broken() -> bool:
        raise RuntimeError("boom")

    server = HealthServer(
        metrics,
        live_within_s=LIVE_WITHIN_S,
        live_checks={"sources": broken},
        poll_interval_s=POLL_S,
    )
    server.start()
    try:
        status, _, body = get(server.url + "/livez?verbose")
        assert status == 503
        assert "[-]sources failed" in body
        assert get(server.url + "/metrics")[0] == 200
    finally:
        server.stop()


def test_landing_page_and_unknown_paths(server: HealthServer) -> None:
    status, headers, body = get(server.url + "/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert 'href="/metrics"' in body
    assert get(server.url + "/nope")[0] == 404


def test_ipv6_loopback(metrics: Metrics) -> None:
    try:
        server = HealthServer(
            metrics, "[::1]:0", live_within_s=LIVE_WITHIN_S, poll_interval_s=POLL_S
        )
    except OSError as error:  # a host without IPv6
        pytest.skip(f"no IPv6 loopback: {error}")
    server.start()
    try:
        assert server.address[0] == "::1"
        assert get(server.url + "/livez")[0] == 200
    finally:
        server.stop()


def test_stop_frees_the_port(metrics: Metrics) -> None:
    server = HealthServer(metrics, live_within_s=LIVE_WITHIN_S, poll_interval_s=POLL_S)
    server.start()
    port = server.address[1]
    server.stop()
    # Binding the same port again works only if stop closed the socket (OSError otherwise).
    again = HealthServer(
        metrics, f"127.0.0.1:{port}", live_within_s=LIVE_WITHIN_S, poll_interval_s=POLL_S
    )
    again.start()
    try:
        assert again.address == ("127.0.0.1", port)
        assert get(again.url + "/livez")[0] == 200
    finally:
        again.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:9464", ("0.0.0.0", 9464)),
        (":9464", ("127.0.0.1", 9464)),
        ("9464", ("127.0.0.1", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("[::]:0", ("::", 0)),
        ("localhost:8080", ("localhost", 8080)),
    ],
    ids=["ipv4", "any", "port-only", "bare-port", "ipv6", "ipv6-any", "name"],
)
def test_parse_http_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_http_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1:http", "expected ADDR:PORT"),
        ("127.0.0.1:70000", "0 to 65535"),
        ("::1:9464", "in brackets"),
        ("", "expected ADDR:PORT"),
    ],
    ids=["named-port", "port-too-big", "bare-ipv6", "empty"],
)
def test_parse_http_address_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_http_address(text)
