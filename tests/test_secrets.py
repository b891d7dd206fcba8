"""Secrets: read from a secrets directory, and masked in logs, check-config, reports, tracebacks."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sentinel.config import ConfigError, Settings, effective_config, load_settings
from sentinel.evidence.report import Journal, write_report
from sentinel.model import secrets
from sentinel.model.incidents import Incident
from sentinel.model.records import Alert, Severity
from tests.helpers.env import without_settings
from tests.helpers.webhook import WebhookReceiver

# apprise (which validates and masks notify URLs) imports the stdlib ``imghdr`` on 3.11.
pytestmark = pytest.mark.filterwarnings(
    "ignore:'imghdr' is deprecated and slated for removal:DeprecationWarning"
)

SLACK_TOKEN = "xq7SlackTok3nZZ81"
SLACK_URL = f"slack://T0SEC1/B0SEC2/{SLACK_TOKEN}"
JSON_PASSWORD = "pw9JsonSecretQ"
JSON_URL = f"json://bot:{JSON_PASSWORD}@127.0.0.1:9/hook"
HEARTBEAT_UUID = "0b8e6c2a-41f7-4c3e-9d85-7e1f2a3b4c5d"
HEARTBEAT_URL = f"https://hc-ping.com/{HEARTBEAT_UUID}"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def secrets_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    directory = tmp_path / "secrets"
    directory.mkdir()
    for name, text in files.items():
        write(directory / name, text)
    return directory


def problems_of(config_file: Path | None = None, *, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(config_file, environ=environ or {})
    return "\n".join(caught.value.problems)


def urls(settings: Settings) -> list[str]:
    return [url.get_secret_value() for url in settings.notify.urls]


# --- the secrets directory -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["SENTINEL_NOTIFY__URLS", "sentinel_notify__urls"],
    ids=["as-env-var", "lowercase"],
)
def test_secret_file_sets_notify_urls_split_like_the_env(tmp_path: Path, name: str) -> None:
    directory = secrets_dir(tmp_path, {name: f"{SLACK_URL}\n{JSON_URL}\n"})
    settings = load_settings(None, environ={"SENTINEL_SECRETS_DIR": str(directory)})
    assert urls(settings) == [SLACK_URL, JSON_URL]


def test_secret_file_sets_targets_from_json(tmp_path: Path) -> None:
    targets = [
        {"url": SLACK_URL, "name": "oncall", "min_severity": "critical"},
        {"url": JSON_URL, "rules": ["nan_inf"]},
    ]
    directory = secrets_dir(tmp_path, {"SENTINEL_NOTIFY__TARGETS": json.dumps(targets)})
    settings = load_settings(None, environ={"SENTINEL_SECRETS_DIR": str(directory)})
    first, second = settings.notify.targets
    assert first.url.get_secret_value() == SLACK_URL
    assert (first.name, first.min_severity) == ("oncall", Severity.CRITICAL)
    assert second.rules == ["nan_inf"]


def test_secrets_dir_named_in_the_config_file(tmp_path: Path) -> None:
    directory = secrets_dir(tmp_path, {"SENTINEL_NOTIFY__HEARTBEAT_URL": HEARTBEAT_URL})
    config = write(tmp_path / "c.toml", f"secrets_dir = {str(directory)!r}\n")
    settings = load_settings(config, environ={})
    assert settings.notify.heartbeat_url is not None
    assert settings.notify.heartbeat_url.get_secret_value() == HEARTBEAT_URL
    assert settings.secrets_dir == directory


def test_secrets_dir_in_kubernetes_layout(tmp_path: Path) -> None:
    """A secret volume: files are links through ``..data`` to a timestamped folder."""
    directory = tmp_path / "secrets"
    real = directory / "..2024_01_01_00_00_00.000000001"
    real.mkdir(parents=True)
    write(real / "SENTINEL_NOTIFY__URLS", SLACK_URL)
    (directory / "..data").symlink_to(real.name)
    (directory / "SENTINEL_NOTIFY__URLS").symlink_to("..data/SENTINEL_NOTIFY__URLS")
    settings = load_settings(None, environ={"SENTINEL_SECRETS_DIR": str(directory)})
    assert urls(settings) == [SLACK_URL]


def test_other_files_in_the_secrets_dir_are_ignored(tmp_path: Path) -> None:
    directory = secrets_dir(tmp_path, {"db_password": "x", "SENTINEL_RESTART": "2"})
    (directory / "SENTINEL_SUBDIR").mkdir()
    settings = load_settings(None, environ={"SENTINEL_SECRETS_DIR": str(directory)})
    assert settings.notify.urls == []


@pytest.mark.parametrize(
    ("use_env", "use_secret", "expected"),
    [(False, False, 1), (False, True, 4), (True, True, 6)],
    ids=["file-only", "secret-over-file", "env-over-secret"],
)
def test_precedence_env_over_secrets_dir_over_file(
    tmp_path: Path, use_env: bool, use_secret: bool, expected: int
) -> None:
    config = write(tmp_path / "c.toml", "[job]\nmax_restarts = 1\n")
    directory = secrets_dir(tmp_path, {"SENTINEL_JOB__MAX_RESTARTS": "4"} if use_secret else {})
    environ = {"SENTINEL_SECRETS_DIR": str(directory)}
    if use_env:
        environ["SENTINEL_JOB__MAX_RESTARTS"] = "6"
    assert load_settings(config, environ=environ).job.max_restarts == expected


@pytest.mark.parametrize(
    ("name", "content", "key"),
    [
        ("SENTINEL_JOB__MAX_RESTARTS", "many-Cont3ntXYZ", "job.max_restarts"),
        ("SENTINEL_NOTIFY__URLS", "notaservice://u:Cont3ntXYZ@h/x", "notify.urls"),
        ("SENTINEL_NOTIFY__TARGETS", '[{"url": "Cont3ntXYZ"', "notify.targets"),
        ("SENTINEL_NOTIFY__HEARTBEAT_URL", "ftp://h/Cont3ntXYZ", "notify.heartbeat_url"),
    ],
    ids=["bad-int", "bad-url", "bad-json", "heartbeat-not-http"],
)
def test_bad_secret_names_key_and_file_not_its_content(
    tmp_path: Path, name: str, content: str, key: str
) -> None:
    directory = secrets_dir(tmp_path, {name: content})
    message = problems_of(environ={"SENTINEL_SECRETS_DIR": str(directory)})
    assert key in message
    assert str(directory / name) in message
    assert "Cont3ntXYZ" not in message


def test_unknown_secret_file_is_an_error_naming_it(tmp_path: Path) -> None:
    directory = secrets_dir(tmp_path, {"SENTINEL_NOTIFY__URL": SLACK_URL})
    message = problems_of(environ={"SENTINEL_SECRETS_DIR": str(directory)})
    assert "notify.url" in message
    assert "unknown setting" in message
    assert str(directory / "SENTINEL_NOTIFY__URL") in message


@pytest.mark.parametrize("source", ["env", "file"], ids=["from-env", "from-config-file"])
def test_missing_secrets_dir_names_the_key_and_source(tmp_path: Path, source: str) -> None:
    missing = tmp_path / "no-such-dir"
    config = None
    environ: dict[str, str] = {}
    if source == "env":
        environ = {"SENTINEL_SECRETS_DIR": str(missing)}
        where = "SENTINEL_SECRETS_DIR"
    else:
        config = write(tmp_path / "c.toml", f"secrets_dir = {str(missing)!r}\n")
        where = str(config)
    message = problems_of(config, environ=environ)
    assert "secrets_dir" in message
    assert where in message
    assert "does not exist" in message


# --- masking ---------------------------------------------------------------------------------


@pytest.fixture
def token() -> str:
    """A token no other test has registered: each masking test depends on its own load."""
    return f"tok{uuid.uuid4().hex[:16]}"


def slack_url(token: str) -> str:
    return f"slack://T0SEC1/B0SEC2/{token}"


@pytest.fixture
def cli_log() -> Iterator[io.StringIO]:
    """A stream handler with the masking filter, as the CLI sets it up, on every logger used."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    secrets.install(handler)
    loggers = [logging.getLogger(name) for name in ("sentinel", "apprise", "urllib3")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield stream
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize(
    "logger_name",
    ["sentinel.notify.notifier", "apprise", "urllib3.connectionpool"],
    ids=["sentinel", "apprise", "urllib3"],
)
@pytest.mark.parametrize(
    "url_of",
    [slack_url, lambda token: f"json://bot:{token}@127.0.0.1:9/hook"],
    ids=["slack-token", "json-password"],
)
def test_loaded_url_secrets_are_masked_in_every_logger(
    cli_log: io.StringIO, logger_name: str, url_of: Callable[[str], str], token: str
) -> None:
    url = url_of(token)
    load_settings(None, environ={"SENTINEL_NOTIFY__URLS": url})
    logging.getLogger(logger_name).warning("posting to %s", url)
    text = cli_log.getvalue()
    assert token not in text
    assert "****" in text


def test_secret_in_a_logged_traceback_is_masked(cli_log: io.StringIO, token: str) -> None:
    load_settings(None, environ={"SENTINEL_NOTIFY__URLS": slack_url(token)})
    try:
        raise ConnectionError(f"cannot reach /services/T0SEC1/B0SEC2/{token}")
    except ConnectionError:
        logging.getLogger("sentinel.x").exception("delivery failed")
    text = cli_log.getvalue()
    assert "ConnectionError: cannot reach /services/" in text
    assert text.rstrip().endswith("/****")
    assert token not in text


def test_real_urllib3_request_line_is_masked(cli_log: io.StringIO) -> None:
    """urllib3 logs each request's path at DEBUG; a heartbeat's path is its token."""
    check = str(uuid.uuid4())
    with WebhookReceiver() as hook:
        url = hook.http_url(f"/ping/{check}")
        load_settings(None, environ={"SENTINEL_NOTIFY__HEARTBEAT_URL": url})
        requests.get(url, timeout=5).close()
    text = cli_log.getvalue()
    assert "GET /ping/**** HTTP" in text
    assert check not in text


def test_effective_config_masks_targets_and_heartbeat(token: str) -> None:
    check = str(uuid.uuid4())
    settings = load_settings(
        None,
        environ={
            "SENTINEL_NOTIFY__TARGETS": json.dumps([{"url": slack_url(token), "name": "oncall"}]),
            "SENTINEL_NOTIFY__HEARTBEAT_URL": f"https://hc-ping.com/{check}",
        },
    )
    data = effective_config(settings)
    text = json.dumps(data)
    assert token not in text
    assert check not in text
    assert data["notify"]["targets"][0]["url"].startswith("slack://T")  # apprise's privacy form
    assert data["notify"]["heartbeat_url"] == "https://hc-ping.com/****"


def alert_quoting(token: str) -> Alert:
    return Alert(
        rule="job_crash",
        severity=Severity.CRITICAL,
        message=f"job exited 1: requests.exceptions.HTTPError for url .../{token}",
        time=1_700_000_000.0,
        step=7,
    )


def test_report_masks_a_secret_quoted_in_an_alert(tmp_path: Path, token: str) -> None:
    load_settings(None, environ={"SENTINEL_NOTIFY__URLS": slack_url(token)})
    alert = alert_quoting(token)
    incident = Incident(
        id="run-9",
        rule="job_crash",
        severity=Severity.CRITICAL,
        opened_at=alert.time,
        onset_step=7,
        onset_time=alert.time,
        alerts=[alert],
    )
    markdown = write_report(incident, {}, tmp_path).read_text()
    data: Any = json.loads((tmp_path / "reports" / "run-9.json").read_text())
    assert token not in markdown
    assert "HTTPError for url .../****" in markdown
    assert token not in json.dumps(data)


def test_journal_masks_a_secret_quoted_in_an_alert(tmp_path: Path, token: str) -> None:
    load_settings(None, environ={"SENTINEL_NOTIFY__URLS": slack_url(token)})
    journal = Journal(tmp_path)
    journal.append(alert_quoting(token))
    journal.close()
    (line,) = journal.path.read_text().splitlines()
    assert json.loads(line)["message"].endswith(".../****")


@pytest.mark.slow
@pytest.mark.parametrize(
    "raising",
    [
        "raise RuntimeError(f'POST to {url} failed')",
        "def boom():\n    raise RuntimeError(url)\n"
        "worker = threading.Thread(target=boom)\nworker.start()\nworker.join()",
    ],
    ids=["main-thread", "other-thread"],
)
def test_uncaught_exception_is_printed_masked(raising: str) -> None:
    script = "\n".join(
        [
            "import threading",
            "from sentinel.model import secrets",
            "from sentinel.config import load_settings",
            f"url = {SLACK_URL!r}",
            "load_settings(None, environ={'SENTINEL_NOTIFY__URLS': url})",
            "secrets.install_excepthooks()",
            raising,
        ]
    )
    environ = without_settings()
    result = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=False,
    )
    assert "Traceback" in result.stderr
    assert "RuntimeError: " in result.stderr
    assert SLACK_TOKEN not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("urls", "loaded"), [("", False), (SLACK_URL, True)], ids=["none", "one"])
def test_apprise_is_loaded_only_when_a_target_is_configured(urls: str, loaded: bool) -> None:
    """apprise (~17 MiB) is imported by the first URL to read, not by the settings."""
    script = "\n".join(
        [
            "import sys",
            "from sentinel.config import effective_config, load_settings",
            f"settings = load_settings(None, environ={{'SENTINEL_NOTIFY__URLS': {urls!r}}})",
            "effective_config(settings)",
            "print('apprise' in sys.modules)",
        ]
    )
    environ = without_settings()
    result = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(loaded)


def test_masking_a_text_without_secrets_leaves_it_unchanged(token: str) -> None:
    load_settings(None, environ={"SENTINEL_NOTIFY__URLS": slack_url(token)})
    text = "step 10 loss 2.31 lr 3e-4"
    assert secrets.mask(text) is text
