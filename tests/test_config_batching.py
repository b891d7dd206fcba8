"""Config: the gathering windows of the job's output (``[job] output_batch_s``) and of
tailed logs (``[tail] batch_s``): defaults, bounds, and where an error comes from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.config import ConfigError, Settings, load_settings
from sentinel.sources.lines import BATCH_S, MAX_BATCH_S

# apprise (which validates and masks notify URLs) imports the stdlib ``imghdr`` on 3.11.
pytestmark = pytest.mark.filterwarnings(
    "ignore:'imghdr' is deprecated and slated for removal:DeprecationWarning"
)

#: (TOML table, key, environment variable, the setting read back)
KEYS = [
    pytest.param(
        "job",
        "output_batch_s",
        "SENTINEL_JOB__OUTPUT_BATCH_S",
        lambda s: s.job.output_batch_s,
        id="job-output",
    ),
    pytest.param("tail", "batch_s", "SENTINEL_TAIL__BATCH_S", lambda s: s.tail.batch_s, id="tail"),
]


def test_both_windows_default_to_the_shared_default() -> None:
    settings = load_settings(None, environ={})
    assert (settings.job.output_batch_s, settings.tail.batch_s) == (BATCH_S, BATCH_S)


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
    assert f"{table}.{key}" in message
    assert variable in message
    assert bound in message
