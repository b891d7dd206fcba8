"""Config: file, then ``SENTINEL_*`` environment, then CLI; every error names key and source."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sentinel.config import CLI_FIELDS, ConfigError, effective_config, load_settings
from tests.helpers.cli import STARTS_THINGS, sentinel_here
from tests.helpers.env import without_settings

# apprise (which validates and masks notify URLs) imports the stdlib ``imghdr`` on 3.11.
pytestmark = pytest.mark.filterwarnings(
    "ignore:'imghdr' is deprecated and slated for removal:DeprecationWarning"
)

JSON_URL = "json://user:s3cr3tpass@127.0.0.1:8080/hook"
SLACK_URL = "slack://TA/TB/secrettoken123"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(
    config_file: Path | None = None,
    *,
    cli: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> str:
    """The joined problems of a load that must fail."""
    with pytest.raises(ConfigError) as caught:
        load_settings(config_file, cli=cli, environ=environ or {})
    assert caught.value.problems, "a ConfigError must carry at least one problem"
    return "\n".join(caught.value.problems)


# --- reading files ---------------------------------------------------------------------------


def test_defaults_without_file_env_or_cli() -> None:
    settings = load_settings(None, environ={})
    assert settings.job.max_restarts == 3
    assert settings.logs == []
    assert settings.dry_run is False


def test_toml_file_values_are_read(tmp_path: Path) -> None:
    config = write(
        tmp_path / "sentinel.toml",
        'logs = ["train.log"]\n[job]\nmax_restarts = 7\n[rules.stall]\nsoft_timeout_s = 60\n',
    )
    settings = load_settings(config, environ={})
    assert settings.logs == ["train.log"]
    assert settings.job.max_restarts == 7
    assert settings.rule("stall").soft_timeout_s == 60  # type: ignore[attr-defined]


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_file_values_are_read(tmp_path: Path, suffix: str) -> None:
    config = write(
        tmp_path / f"sentinel{suffix}",
        "logs: [a.log, b.log]\njob:\n  max_restarts: 9\nrules:\n  nan_inf:\n    ignore: [scale]\n",
    )
    settings = load_settings(config, environ={})
    assert settings.logs == ["a.log", "b.log"]
    assert settings.job.max_restarts == 9
    assert settings.rule("nan_inf").ignore == ["scale"]  # type: ignore[attr-defined]


def test_config_file_from_sentinel_config_variable(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[job]\nmax_restarts = 1\n")
    settings = load_settings(None, environ={"SENTINEL_CONFIG": str(config)})
    assert settings.job.max_restarts == 1


# --- environment -----------------------------------------------------------------------------


def test_env_nested_with_double_underscore() -> None:
    settings = load_settings(
        None,
        environ={
            "SENTINEL_JOB__MAX_RESTARTS": "5",
            "SENTINEL_RULES__STALL__SOFT_TIMEOUT_S": "120",
            "SENTINEL_DRY_RUN": "true",
        },
    )
    assert settings.job.max_restarts == 5
    assert settings.rule("stall").soft_timeout_s == 120  # type: ignore[attr-defined]
    assert settings.dry_run is True


@pytest.mark.parametrize(
    "value",
    ["a.log,b.log,c.log", "a.log b.log c.log", "a.log, b.log  c.log"],
    ids=["commas", "spaces", "mixed"],
)
def test_env_logs_split_on_commas_and_spaces(value: str) -> None:
    settings = load_settings(None, environ={"SENTINEL_LOGS": value})
    assert settings.logs == ["a.log", "b.log", "c.log"]


def test_env_notify_urls_split_on_whitespace() -> None:
    settings = load_settings(None, environ={"SENTINEL_NOTIFY__URLS": f"{JSON_URL} {SLACK_URL}"})
    assert [url.get_secret_value() for url in settings.notify.urls] == [JSON_URL, SLACK_URL]


def test_restart_protocol_vars_are_not_config() -> None:
    settings = load_settings(
        None,
        environ={
            "SENTINEL_RESUME_FROM": "/ckpt/checkpoint-100",
            "SENTINEL_RESUME_STEP": "100",
            "SENTINEL_RESTART": "2",
        },
    )
    assert settings == load_settings(None, environ={})


def test_unrelated_environment_is_ignored() -> None:
    settings = load_settings(None, environ={"PATH": "/usr/bin", "OTHER_JOB__X": "1"})
    assert settings.job.max_restarts == 3


# --- precedence ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("use_env", "use_cli", "expected"),
    [
        (False, False, 1),
        (True, False, 5),
        (True, True, 7),
        (False, True, 7),
    ],
    ids=["file-only", "env-over-file", "cli-over-env", "cli-over-file"],
)
def test_precedence_cli_over_env_over_file(
    tmp_path: Path, use_env: bool, use_cli: bool, expected: int
) -> None:
    config = write(tmp_path / "c.toml", "[job]\nmax_restarts = 1\n")
    environ = {"SENTINEL_JOB__MAX_RESTARTS": "5"} if use_env else {}
    cli = {"max_restarts": 7} if use_cli else {}
    assert load_settings(config, cli=cli, environ=environ).job.max_restarts == expected


def test_cli_zero_is_a_value_not_absence() -> None:
    settings = load_settings(
        None, cli={"max_restarts": 0}, environ={"SENTINEL_JOB__MAX_RESTARTS": "5"}
    )
    assert settings.job.max_restarts == 0


def test_unset_cli_flags_leave_env_values() -> None:
    cli: dict[str, Any] = {dest: None for dest in CLI_FIELDS} | {"dry_run": False, "log": []}
    settings = load_settings(
        None, cli=cli, environ={"SENTINEL_DRY_RUN": "true", "SENTINEL_LOGS": "a.log"}
    )
    assert settings.dry_run is True
    assert settings.logs == ["a.log"]


def test_every_cli_field_maps_onto_a_setting(tmp_path: Path) -> None:
    reference = tmp_path / "reference.jsonl"
    reference.write_text('{"step": 10, "loss": 2.0}\n')
    values: dict[str, Any] = {
        "reference": str(reference),
        "log": ["x.log"],
        "discover": "/runs",
        "checkpoints": "/ckpt",
        "notify": [JSON_URL],
        "state_dir": "/state",
        "max_restarts": 4,
        "resume_command": "python train.py --resume {checkpoint}",
        "dry_run": True,
        "http": "127.0.0.1:9464",
        "metrics_textfile": "/m/sentinel.prom",
        "verdict_file": "/v/code",
        "stop_signal": "kill",
        "drain_timeout": 3.5,
        "pid": 1234,
        "pidfile": "/run/job.pid",
        "match": "train\\.py",
        "user": "alice",
        "systemd_unit": "train@a.service",
        "systemd_user": True,
        "wait": 60,
        "run_id": "job-7",
        "no_pty": "false",  # run --no-pty's value
    }
    assert set(values) == set(CLI_FIELDS)
    settings = load_settings(None, cli=values, environ={})
    assert settings.logs == ["x.log"]
    assert settings.reference.path == reference
    assert str(settings.tail.discover_dir) == "/runs"
    assert str(settings.checkpoints) == "/ckpt"
    assert settings.notify.urls[0].get_secret_value() == JSON_URL
    assert str(settings.state_dir) == "/state"
    assert settings.job.max_restarts == 4
    assert settings.job.resume_command == "python train.py --resume {checkpoint}"
    assert settings.dry_run is True
    assert settings.http == "127.0.0.1:9464"
    assert settings.run_id == "job-7"
    assert str(settings.metrics_textfile) == "/m/sentinel.prom"
    assert str(settings.verdict_file) == "/v/code"
    assert settings.job.stop_signal == "SIGKILL"
    assert settings.drain_timeout_s == 3.5
    watch = settings.watch
    assert (watch.pid, str(watch.pidfile), watch.match) == (1234, "/run/job.pid", "train\\.py")
    assert (watch.user, watch.systemd_unit, watch.wait_s) == ("alice", "train@a.service", 60)
    assert watch.systemd_user is True
    assert settings.job.pty is False


# --- errors name the key and the source ------------------------------------------------------


def test_unknown_key_in_file_names_key_file_and_suggestion(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[job]\nmax_restart = 3\n")
    message = problems_of(config)
    assert "job.max_restart" in message
    assert str(config) in message
    assert "did you mean 'max_restarts'" in message


def test_unknown_key_in_yaml_file_names_key_and_file(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", "rules:\n  stall:\n    soft_timeout: 5\n")
    message = problems_of(config)
    assert "rules.stall.soft_timeout" in message
    assert str(config) in message
    assert "did you mean 'soft_timeout_s'" in message


def test_wrong_type_from_env_names_env_var() -> None:
    message = problems_of(environ={"SENTINEL_JOB__MAX_RESTARTS": "many"})
    assert "job.max_restarts" in message
    assert "SENTINEL_JOB__MAX_RESTARTS" in message


def test_bad_value_from_cli_names_flag() -> None:
    message = problems_of(cli={"max_restarts": -1})
    assert "job.max_restarts" in message
    assert "--max-restarts" in message


def test_env_error_wins_over_file_when_env_supplied_the_value(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[job]\nmax_restarts = 2\n")
    message = problems_of(config, environ={"SENTINEL_JOB__MAX_RESTARTS": "-5"})
    assert "SENTINEL_JOB__MAX_RESTARTS" in message
    assert str(config) not in message


def test_missing_config_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    message = problems_of(missing)
    assert "--config" in message
    assert str(missing) in message


@pytest.mark.parametrize(
    ("name", "text", "kind"),
    [
        ("c.toml", "[job\nmax_restarts = 1\n", "TOML"),
        ("c.yaml", "job:\n  max_restarts: [\n", "YAML"),
    ],
    ids=["toml", "yaml"],
)
def test_invalid_syntax_names_file_and_format(
    tmp_path: Path, name: str, text: str, kind: str
) -> None:
    config = write(tmp_path / name, text)
    message = problems_of(config)
    assert str(config) in message
    assert f"not valid {kind}" in message


def test_file_top_level_must_be_a_table(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", "- a\n- b\n")
    message = problems_of(config)
    assert str(config) in message


@pytest.mark.parametrize(
    "text",
    [
        "[rules.stall]\nsoft_timeout_s = 100\nhard_timeout_s = 50\n",
        "[rules.stall]\nsoft_timeout_s = 100\nhard_timeout_s = 100\n",
    ],
    ids=["hard-below-soft", "hard-equals-soft"],
)
def test_stall_hard_not_after_soft_in_file(tmp_path: Path, text: str) -> None:
    config = write(tmp_path / "c.toml", text)
    message = problems_of(config)
    assert "rules.stall" in message
    assert "hard_timeout_s must be greater than soft_timeout_s" in message
    assert str(config) in message


def test_stall_hard_not_after_soft_from_env_names_the_variable_set() -> None:
    message = problems_of(environ={"SENTINEL_RULES__STALL__HARD_TIMEOUT_S": "10"})
    assert "hard_timeout_s must be greater than soft_timeout_s" in message
    # The user set this variable; an error must name it, not a prefix that does not exist.
    assert "SENTINEL_RULES__STALL__HARD_TIMEOUT_S" in message


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?P<loss>[0-9", "not a valid regular expression"),
        ("loss ([0-9.]+)", "has no named group"),
    ],
    ids=["does-not-compile", "no-named-group"],
)
def test_invalid_user_regex_names_key_and_file(tmp_path: Path, pattern: str, why: str) -> None:
    config = write(tmp_path / "c.toml", f"[parsers]\nregexes = ['{pattern}']\n")
    message = problems_of(config)
    assert "parsers.regexes" in message
    assert str(config) in message
    assert why in message


@pytest.mark.parametrize(
    ("source", "where"),
    [("file", "c.toml"), ("env", "SENTINEL_NOTIFY__URLS"), ("cli", "--notify")],
    ids=["file", "env", "cli"],
)
def test_bad_apprise_url_names_key_and_source(tmp_path: Path, source: str, where: str) -> None:
    bad = "notaservice://x"
    config = None
    environ: dict[str, str] = {}
    cli: dict[str, Any] = {}
    if source == "file":
        config = write(tmp_path / "c.toml", f"[notify]\nurls = ['{bad}']\n")
    elif source == "env":
        environ = {"SENTINEL_NOTIFY__URLS": bad}
    else:
        cli = {"notify": [bad]}
    message = problems_of(config, cli=cli, environ=environ)
    assert "notify.urls" in message
    assert where in message
    assert "notaservice" in message


def test_bad_apprise_url_error_masks_its_secret(tmp_path: Path) -> None:
    config = write(
        tmp_path / "c.toml", "[notify]\nurls = ['notaservice://user:hunter2pw@host/x']\n"
    )
    message = problems_of(config)
    assert "notify.urls" in message
    assert "hunter2pw" not in message


def test_bad_json_in_env_names_the_variable_not_its_value() -> None:
    message = problems_of(environ={"SENTINEL_NOTIFY__TARGETS": '[{"url": "json://h/Vx7q'})
    assert "notify.targets (from SENTINEL_NOTIFY__TARGETS): not valid JSON" in message
    assert "Vx7q" not in message


def test_error_inside_a_json_env_value_names_the_variable_that_holds_it() -> None:
    targets = json.dumps([{"url": JSON_URL, "min_severity": "loud"}])
    message = problems_of(environ={"SENTINEL_NOTIFY__TARGETS": targets})
    assert "notify.targets[0].min_severity (from SENTINEL_NOTIFY__TARGETS)" in message


@pytest.mark.parametrize(
    "url", ["ftp://example.com/ping", "json://127.0.0.1/hook"], ids=["ftp", "apprise-scheme"]
)
def test_heartbeat_url_must_be_http(tmp_path: Path, url: str) -> None:
    config = write(tmp_path / "c.toml", f"[notify]\nheartbeat_url = '{url}'\n")
    message = problems_of(config)
    assert f"notify.heartbeat_url (from {config})" in message
    assert "http" in message


@pytest.mark.parametrize(
    ("var", "key"),
    [
        ("SENTINEL_DRYRUN", "dryrun"),
        ("SENTINEL_JOB__MAX_RESTART", "job.max_restart"),
    ],
    ids=["top-level", "nested"],
)
def test_unknown_env_var_is_an_error_naming_it(var: str, key: str) -> None:
    message = problems_of(environ={var: "1"})
    assert var in message
    assert key in message
    assert "unknown setting" in message


def test_unknown_top_level_env_var_suggests_the_real_one() -> None:
    message = problems_of(environ={"SENTINEL_DRYRUN": "1"})
    assert "did you mean 'dry_run'" in message


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "dry_rn = true\n[job]\nmax_restarts = -2\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    assert len(caught.value.problems) == 2
    assert any("dry_rn" in problem for problem in caught.value.problems)
    assert any("job.max_restarts" in problem for problem in caught.value.problems)


# --- effective_config masks secrets ----------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "secret", "readable"),
    [
        (JSON_URL, "s3cr3tpass", "127.0.0.1"),
        (SLACK_URL, "secrettoken123", "slack://"),
    ],
    ids=["json-password", "slack-token"],
)
def test_effective_config_masks_notify_secrets(url: str, secret: str, readable: str) -> None:
    settings = load_settings(None, cli={"notify": [url]}, environ={})
    data = effective_config(settings)
    text = json.dumps(data)
    assert secret not in text
    assert readable in data["notify"]["urls"][0]


def test_effective_config_is_plain_json_with_every_section() -> None:
    data = effective_config(load_settings(None, environ={}))
    assert set(data) >= {"logs", "job", "tail", "parsers", "notify", "rules", "dry_run"}
    assert set(data["rules"]) >= {"nan_inf", "stall", "job_crash"}
    json.dumps(data, allow_nan=False)


# --- the CLI ---------------------------------------------------------------------------------


def sentinel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS`` in ``cwd``, with no ``SENTINEL_*`` leaking in from outside: ``run`` as a
    process of its own, the verbs that start nothing by ``main`` here (``tests.helpers.cli``)."""
    environ = without_settings()
    if args[0] not in STARTS_THINGS:
        return sentinel_here(*args, env=environ, cwd=cwd)
    return subprocess.run(
        [sys.executable, "-m", "sentinel", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_run_with_bad_config_exits_2_before_starting_the_job(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", "[job]\nmax_restart = 2\n")
    marker = tmp_path / "job-started"
    result = sentinel(
        "run",
        "--config",
        str(bad),
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "job.max_restart" in result.stderr
    assert str(bad) in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_check_config_prints_json_with_url_masked(tmp_path: Path) -> None:
    result = sentinel("check-config", "--json", "--notify", JSON_URL, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "s3cr3tpass" not in result.stdout
    assert "127.0.0.1" in data["notify"]["urls"][0]


@pytest.mark.slow
def test_check_config_masks_urls_from_a_secrets_dir_targets_and_heartbeat(tmp_path: Path) -> None:
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    write(secrets_dir / "SENTINEL_NOTIFY__URLS", JSON_URL)
    targets = [{"url": SLACK_URL, "name": "oncall"}]
    write(secrets_dir / "SENTINEL_NOTIFY__TARGETS", json.dumps(targets))
    config = write(
        tmp_path / "c.toml",
        f"secrets_dir = {str(secrets_dir)!r}\n"
        "[notify]\nheartbeat_url = 'https://hc-ping.com/1e5d0c3b-9f1a-4e2b-8c7d-6a5b4c3d2e1f'\n",
    )
    result = sentinel("check-config", "--json", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for secret in ("s3cr3tpass", "secrettoken123", "1e5d0c3b-9f1a-4e2b-8c7d-6a5b4c3d2e1f"):
        assert secret not in result.stdout
    assert data["notify"]["urls"][0].startswith("json://")
    assert data["notify"]["targets"][0]["url"].startswith("slack://")
    assert data["notify"]["heartbeat_url"] == "https://hc-ping.com/****"


@pytest.mark.slow
def test_check_config_with_bad_file_exits_2(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.toml", "[rules.stall]\nsoft_timeout_s = 9\nhard_timeout_s = 1\n")
    result = sentinel("check-config", "--config", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "rules.stall" in result.stderr
    assert str(bad) in result.stderr


def test_a_target_naming_an_unknown_rule_is_an_error_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[[notify.targets]]\nurl = "json://127.0.0.1:9/hook"\nrules = ["nan_inf", "nan_infs"]\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as raised:
        load_settings(config, environ={})
    (problem,) = raised.value.problems
    where = f"notify (from {config})"
    assert problem.startswith(f"{where}: targets[0].rules: unknown rule(s) nan_infs;")
    assert "known: nan_inf," in problem


@pytest.mark.parametrize("run_id", ["", "../up", "a b", "-x"])
def test_a_run_id_that_is_not_one_path_segment_is_refused(run_id: str) -> None:
    with pytest.raises(ConfigError, match="run_id"):
        load_settings(None, cli={"run_id": run_id}, environ={})


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        # YAML 1.1 reads `on` as true: a key that is no name (a TypeError traceback, exit 1).
        ("on.yaml", "on: true\n", "the key True is not a name (YAML reads on, off, yes, no"),
        ("one.yaml", "1: x\n", "the key 1 is not a name"),
        # The last one silently won (max_restarts 500); TOML refuses it, and so does YAML now.
        (
            "dup.yaml",
            "max_restarts: 1\nmax_restarts: 500\n",
            "the key 'max_restarts' is given twice",
        ),
        ("deep.toml", "a = " + "[" * 600 + "]" * 600 + "\n", "not valid TOML: nested too deep"),
        ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n", "not valid YAML: nested too deep"),
        # A path with a NUL raised at its first open(), past the start (the job launched).
        ("nul.toml", 'checkpoints = "a\\u0000b"\n', "checkpoints (from "),
        ("nuls.toml", 'logs = ["a\\u0000b"]\n', "logs[0] (from "),
    ],
)
def test_a_config_file_that_cannot_be_settings_is_one_line_naming_it(
    tmp_path: Path, name: str, text: str, said: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    [problem] = caught.value.problems
    assert said in problem and str(path) in problem, problem
    assert "\n" not in problem
