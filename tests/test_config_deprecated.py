"""Config: renamed keys. An old key still works until 0.3, warns once naming where it came
from, and is an error beside its new key; check-config shows the new names only."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sentinel.config import ConfigError, Settings, effective_config, load_settings
from sentinel.config.renames import RENAMED
from sentinel.rules.eval_loss_rise import EvalLossRiseConfig
from sentinel.rules.loss_spike import LossSpikeConfig
from tests.helpers.env import clean_env, without_settings

# apprise (which validates and masks notify URLs) imports the stdlib ``imghdr`` on 3.11.
pytestmark = pytest.mark.filterwarnings(
    "ignore:'imghdr' is deprecated and slated for removal:DeprecationWarning"
)

#: Each old key: a value it accepts (as TOML) and the same value read back from Settings.
OLD_VALUES: dict[tuple[str, ...], tuple[str, Any]] = {
    ("job", "output_batch_s"): ("0.1", 0.1),
    ("rules", "grad_norm_run", "run_length"): ("2", 2),
    ("rules", "grad_norm_run", "relative_factor"): ("4.5", 4.5),
    ("rules", "loss_spike", "persist_steps"): ("3", 3),
    ("rules", "loss_spike", "persist_severity"): ('"warning"', "warning"),
    ("rules", "eval_loss_rise", "metric"): ('"val_loss"', ["val_loss"]),
    ("rules", "gpu_health", "temp_readings"): ("4", 4),
    ("rules", "gpu_idle", "window_s"): ("60.0", 60.0),
    ("rules", "cost_overrun", "kill_at"): ("1.5", 1.5),
}
OLD_KEYS = [pytest.param(old, id=".".join(old)) for old in OLD_VALUES]


@pytest.fixture
def warnings_logged() -> Iterator[list[str]]:
    """The warnings sentinel.config logs (on its own logger: the CLI may stop propagation)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                messages.append(record.getMessage())

    logger = logging.getLogger("sentinel.config")
    handler = Collect()
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def toml(path: tuple[str, ...], value: str) -> str:
    return f"[{'.'.join(path[:-1])}]\n{path[-1]} = {value}\n"


def read(settings: Settings, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    return value.value if hasattr(value, "value") else value


def variable(path: tuple[str, ...]) -> str:
    return "SENTINEL_" + "__".join(path).upper()


def problems_of(config_file: Path | None, environ: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(config_file, environ=environ)
    return "\n".join(caught.value.problems)


def test_every_renamed_key_is_tested_here() -> None:
    assert set(OLD_VALUES) == set(RENAMED)


@pytest.mark.parametrize("old", OLD_KEYS)
def test_an_old_key_in_a_file_sets_the_new_one_and_warns_once_naming_the_file(
    tmp_path: Path, old: tuple[str, ...], warnings_logged: list[str]
) -> None:
    text, expected = OLD_VALUES[old]
    config = tmp_path / "c.toml"
    config.write_text(toml(old, text), encoding="utf-8")
    settings = load_settings(config, environ={})
    new = RENAMED[old]
    assert read(settings, new) == expected
    assert warnings_logged == [
        f"{'.'.join(old)} (from {config}) is deprecated: use {'.'.join(new)};"
        " the old name goes in 0.3"
    ]


@pytest.mark.parametrize("old", OLD_KEYS)
def test_an_old_variable_sets_the_new_key_and_warns_naming_both_variables(
    old: tuple[str, ...], warnings_logged: list[str]
) -> None:
    text, expected = OLD_VALUES[old]
    settings = load_settings(None, environ={variable(old): text.strip('"')})
    new = RENAMED[old]
    assert read(settings, new) == expected
    assert warnings_logged == [
        f"{'.'.join(old)} (from {variable(old)}) is deprecated: use {'.'.join(new)}"
        f" ({variable(new)}); the old name goes in 0.3"
    ]


@pytest.mark.parametrize("old", OLD_KEYS)
def test_an_old_variable_in_the_real_environment_starts_sentinel(
    old: tuple[str, ...], tmp_path: Path
) -> None:
    """As a systemd env file or a Kubernetes Secret sets it: the process's own environment.
    pydantic-settings read it a second time under its old name, beside the new one, and
    sentinel refused to start ("persist_steps is the old name of sustain"), exit 2, the job
    unwatched. The tests above pass ``environ``, and never saw it."""
    text, _ = OLD_VALUES[old]
    env = {**clean_env(), variable(old): text.strip('"')}
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "check-config"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"(from {variable(old)}) is deprecated" in result.stderr


def test_an_old_name_in_a_secret_file_warns_naming_that_file(
    tmp_path: Path, warnings_logged: list[str]
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "SENTINEL_RULES__LOSS_SPIKE__PERSIST_STEPS").write_text("2\n", encoding="utf-8")
    settings = load_settings(None, environ={"SENTINEL_SECRETS_DIR": str(secrets)})
    assert settings.rules.loss_spike.sustain == 2
    (message,) = warnings_logged
    assert f"(from {secrets / 'SENTINEL_RULES__LOSS_SPIKE__PERSIST_STEPS'})" in message
    assert "use rules.loss_spike.sustain (SENTINEL_RULES__LOSS_SPIKE__SUSTAIN)" in message


def test_each_load_warns_again_and_only_once(tmp_path: Path, warnings_logged: list[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.loss_spike]\npersist_steps = 2\nfactor = 3.0\n", encoding="utf-8")
    load_settings(config, environ={})
    load_settings(config, environ={})
    assert len(warnings_logged) == 2
    assert warnings_logged[0] == warnings_logged[1]


def test_new_names_load_without_a_warning(tmp_path: Path, warnings_logged: list[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[tail]\nbatch_s = 0.1\n[rules.grad_norm_run]\nsustain = 2\nfactor = 4.0\n"
        "[rules.loss_spike]\nsustain = 3\nsustain_severity = 'warning'\n"
        "[rules.gpu_idle]\nsustain_s = 60\n[rules.gpu_health]\ntemp_sustain = 4\n"
        "[rules.cost_overrun]\nkill_fraction = 1.5\n",
        encoding="utf-8",
    )
    environ = {"SENTINEL_RULES__EVAL_LOSS_RISE__METRICS": "val_loss"}
    settings = load_settings(config, environ=environ)
    rules = settings.rules
    assert settings.tail.batch_s == 0.1
    assert (rules.grad_norm_run.sustain, rules.grad_norm_run.factor) == (2, 4.0)
    assert (rules.loss_spike.sustain, rules.loss_spike.sustain_severity) == (3, "warning")
    assert (rules.gpu_idle.sustain_s, rules.gpu_health.temp_sustain) == (60, 4)
    assert rules.cost_overrun.kill_fraction == 1.5
    assert rules.eval_loss_rise.metrics == ["val_loss"]
    assert warnings_logged == []


def test_old_and_new_in_one_file_is_an_error_naming_both(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.grad_norm_run]\nrun_length = 2\nsustain = 4\n", encoding="utf-8")
    assert problems_of(config, {}) == (
        f"rules.grad_norm_run.run_length (from {config}) and rules.grad_norm_run.sustain"
        f" (from {config}) are one setting: give only rules.grad_norm_run.sustain"
        " (run_length is its old name)"
    )


def test_old_in_the_file_and_new_in_the_environment_is_an_error_naming_both(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[job]\noutput_batch_s = 0.1\n", encoding="utf-8")
    message = problems_of(config, {"SENTINEL_TAIL__BATCH_S": "0.2"})
    assert message.startswith(f"job.output_batch_s (from {config}) and tail.batch_s")
    assert "(from SENTINEL_TAIL__BATCH_S)" in message


def test_old_in_the_environment_and_new_in_the_file_is_an_error_naming_both(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.gpu_idle]\nsustain_s = 60\n", encoding="utf-8")
    message = problems_of(config, {"SENTINEL_RULES__GPU_IDLE__WINDOW_S": "30"})
    assert message.startswith(
        "rules.gpu_idle.window_s (from SENTINEL_RULES__GPU_IDLE__WINDOW_S) and"
        f" rules.gpu_idle.sustain_s (from {config})"
    )


def test_old_name_in_file_and_environment_is_no_clash_and_the_environment_wins(
    tmp_path: Path, warnings_logged: list[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.gpu_idle]\nwindow_s = 60\n", encoding="utf-8")
    settings = load_settings(config, environ={"SENTINEL_RULES__GPU_IDLE__WINDOW_S": "30"})
    assert settings.rules.gpu_idle.sustain_s == 30
    assert len(warnings_logged) == 2


def test_a_bad_value_under_an_old_key_names_the_key_as_written_in_the_file(
    tmp_path: Path,
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.gpu_idle]\nwindow_s = -1\n", encoding="utf-8")
    assert problems_of(config, {}) == (
        f"rules.gpu_idle.sustain_s (from rules.gpu_idle.window_s in {config}):"
        " Input should be greater than 0"
    )


def test_a_bad_value_under_an_old_variable_names_that_variable() -> None:
    message = problems_of(None, {"SENTINEL_JOB__OUTPUT_BATCH_S": "5"})
    assert message == (
        "tail.batch_s (from SENTINEL_JOB__OUTPUT_BATCH_S): Input should be less than or equal to 1"
    )


def test_the_effective_config_holds_only_the_new_names(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    dotted = [f"{'.'.join(old)} = {text}\n" for old, (text, _) in OLD_VALUES.items()]
    config.write_text("".join(dotted), encoding="utf-8")
    shown = effective_config(load_settings(config, environ={}))
    for old, new in RENAMED.items():
        table = shown
        for part in old[:-1]:
            table = table[part]
        assert old[-1] not in table
        table = shown
        for part in new[:-1]:
            table = table[part]
        assert new[-1] in table


@pytest.mark.slow
def test_check_config_prints_new_names_and_warns_on_stderr(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.loss_spike]\npersist_steps = 3\n", encoding="utf-8")
    environ = without_settings()
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "check-config", "--config", str(config)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "persist_steps" not in result.stdout
    assert "sustain_severity" in result.stdout
    assert result.stderr.count("is deprecated") == 1
    assert "rules.loss_spike.persist_steps" in result.stderr


@pytest.mark.slow
def test_check_config_with_old_and_new_exits_2_naming_both(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[rules.loss_spike]\npersist_steps = 3\nsustain = 2\n", encoding="utf-8")
    environ = without_settings()
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "check-config", "--config", str(config)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "rules.loss_spike.persist_steps" in result.stderr
    assert "rules.loss_spike.sustain" in result.stderr


# --- one name or a list, for every metric selector -------------------------------------------


@pytest.mark.parametrize(
    ("text", "names"),
    [('"val_loss"', ["val_loss"]), ('["val_loss"]', ["val_loss"])],
    ids=["string", "list"],
)
def test_a_metric_selector_takes_one_name_or_a_list_in_a_file(
    tmp_path: Path, text: str, names: list[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        f"[rules.eval_loss_rise]\nmetrics = {text}\n[rules.loss_spike]\nmetrics = {text}\n",
        encoding="utf-8",
    )
    rules = load_settings(config, environ={}).rules
    assert rules.eval_loss_rise.metrics == rules.loss_spike.metrics == names


@pytest.mark.parametrize(
    ("value", "names"),
    [("loss", ["loss"]), ('["loss", "grad_norm"]', ["loss", "grad_norm"])],
    ids=["plain-name", "json-list"],
)
def test_a_metric_selector_takes_one_name_or_a_json_list_from_a_variable(
    value: str, names: list[str]
) -> None:
    settings = load_settings(None, environ={"SENTINEL_RULES__NAN_INF__METRICS": value})
    assert settings.rules.nan_inf.metrics == names


def test_a_broken_json_list_in_a_variable_names_the_variable() -> None:
    message = problems_of(None, {"SENTINEL_RULES__NAN_INF__METRICS": '["loss"'})
    assert message.startswith("rules.nan_inf.metrics (from SENTINEL_RULES__NAN_INF__METRICS)")
    assert "not a valid JSON list" in message


def test_eval_loss_rise_judges_one_metric_and_says_so() -> None:
    message = problems_of(
        None, {"SENTINEL_RULES__EVAL_LOSS_RISE__METRICS": '["eval_loss", "val_loss"]'}
    )
    assert message == (
        "rules.eval_loss_rise (from SENTINEL_RULES__EVAL_LOSS_RISE__METRICS):"
        " metrics must name one eval metric, not 2"
    )


# --- code that builds a rule's config with an old keyword -------------------------------------


def test_an_old_keyword_in_code_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="persist_steps is deprecated, use sustain"):
        config = LossSpikeConfig.model_validate({"persist_steps": 2})
    assert config.sustain == 2
    with pytest.warns(DeprecationWarning, match="metric is deprecated, use metrics"):
        assert EvalLossRiseConfig.model_validate({"metric": "val_loss"}).metrics == ["val_loss"]


def test_an_old_and_new_keyword_in_code_is_rejected() -> None:
    with pytest.raises(ValueError, match="persist_steps is the old name of sustain"):
        LossSpikeConfig.model_validate({"persist_steps": 2, "sustain": 3})


# --- [cost] gpus and [training] world_size --------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("", None),
        ("[training]\nworld_size = 8\n", 8),
        ("[training]\nworld_size = 1\n", 1),
        ("[training]\nworld_size = 8\n[cost]\ngpus = 16\n", 16),
        ("[cost]\ngpus = 4\n", 4),
    ],
    ids=["neither-attributed", "ranks-billed", "one-rank-said", "cost-gpus-wins", "cost-only"],
)
def test_gpus_billed_default_to_a_given_world_size(
    tmp_path: Path, text: str, gpus: int | None
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text, encoding="utf-8")
    settings = load_settings(config, environ={})
    assert settings.cost.gpus == gpus
    facts = settings.run_facts()
    facts.observe_gpu("gpu:0", attached=True)
    assert facts.gpu_count == (1 if gpus is None else gpus)  # else: the one attributed


def test_world_size_from_the_environment_sets_the_gpus_billed() -> None:
    settings = load_settings(None, environ={"SENTINEL_TRAINING__WORLD_SIZE": "4"})
    assert (settings.training.world_size, settings.cost.gpus) == (4, 4)
    assert settings.training.samples_per_step is None  # no batch size: world_size alone
