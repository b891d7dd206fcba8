"""Config: the gathering window of the job's output and of tailed logs (``[tail] batch_s``,
once ``[job] output_batch_s`` too): default, bounds, and where an error comes from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.config import ConfigError, Settings, load_settings
from sentinel.parsing.lines import BATCH_S, MAX_BATCH_S

# apprise (which validates and masks notify URLs) imports the stdlib ``imghdr`` on 3.11.
pytestmark = pytest.mark.filterwarnings(
    "ignore:'imghdr' is deprecated and slated for removal:DeprecationWarning"
)

#: (TOML table, key, environment variable, the setting read back); the first is the old
#: name of the second, accepted until 0.3.
KEYS = [
    pytest.param(
        "job",
        "output_batch_s",
        "SENTINEL_JOB__OUTPUT_BATCH_S",
        lambda s: s.tail.batch_s,
        id="job-output-deprecated",
    ),
    pytest.param("tail", "batch_s", "SENTINEL_TAIL__BATCH_S", lambda s: s.tail.batch_s, id="tail"),
]


def test_the_window_defaults_to_the_shared_default() -> None:
    settings = load_settings(None, environ={})
    assert settings.tail.batch_s == BATCH_S
    assert "output_batch_s" not in settings.job.model_dump()


@pytest.mark.parametrize(("table", "key", "variable", "read"), KEYS)
@pytest.mark.parametrize("value", [0.0, 0.1, MAX_BATCH_S], ids=["off", "short", "longest"])
def test_a_window_in_bounds_is_taken_from_the_file(
    tmp_path: Path,
    table: str,
    key: str,
    variable: str,
    read: Callable[[Settings], float],
    value: float,
) -> None:
    config = tmp_path / "sentinel.toml"
    config.write_text(f"[{table}]\n{key} = {value}\n", encoding="utf-8")
    settings = load_settings(config, environ={})
    assert read(settings) == value


@pytest.mark.parametrize(("table", "key", "variable", "read"), KEYS)
def test_a_window_is_taken_from_the_environment(
    table: str, key: str, variable: str, read: Callable[[Settings], float]
) -> None:
    settings = load_settings(None, environ={variable: "0.5"})
    assert read(settings) == 0.5


@pytest.mark.parametrize(("table", "key", "variable", "read"), KEYS)
@pytest.mark.parametrize(
    ("value", "bound"),
    [("-0.1", "greater than or equal to 0"), ("1.5", "less than or equal to 1")],
    ids=["negative", "over-a-second"],
)
def test_a_window_out_of_bounds_names_the_key_and_its_source(
    table: str, key: str, variable: str, read: Callable[[Settings], float], value: str, bound: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ={variable: value})
    message = "\n".join(caught.value.problems)
    assert message.startswith("tail.batch_s (from ")
    assert variable in message
    assert bound in message
