"""Every setting is bounded, and every bad input is one line and exit 2 (issue 32.5).

``grace_period_s = inf`` (then no SIGKILL ever comes), ``max_restarts = 1e26`` or
``= true``, a 10 MB job name, an unbounded ``max_line_bytes``, a file that is not UTF-8,
a YAML syntax error, ``--http 'evil host:80'``: each is refused by a real ``sentinel
check-config`` or ``sentinel run`` with one line naming the key and where it came from,
before anything runs. Then, over the whole settings tree: every number refuses infinity,
NaN and a huge value; every whole number refuses a fraction and a truth value.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from sentinel.config import Settings
from sentinel.config.addresses import parse_http_address
from tests.helpers.cli import STARTS_THINGS, sentinel_here
from tests.helpers.env import clean_env


def sentinel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``sentinel ARGS``: ``run`` as a process of its own, the verbs that start nothing by
    ``main`` in this process (``tests.helpers.cli``)."""
    if args[0] not in STARTS_THINGS:
        return sentinel_here(*args, env=clean_env(**(env or {})))
    return subprocess.run(
        [sys.executable, "-m", "sentinel", *args],
        capture_output=True, text=True, env=clean_env(**(env or {})), timeout=60,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The run's stderr, asserting it is exit 2 and one line (no traceback)."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("toml", "said"),
    [
        ("[job]\ngrace_period_s = inf", "job.grace_period_s (from {file}): Input should be a"
         " finite number"),
        ("[job]\ngrace_period_s = 90000", "job.grace_period_s (from {file}): Input should be less"
         " than or equal to 86400"),
        ("[job]\nmax_restarts = 1e26", "job.max_restarts (from {file}): must be a whole number,"
         " not 1e+26"),
        ("[job]\nmax_restarts = true", "job.max_restarts (from {file}): must be a whole number,"
         " not true"),
        ("[job]\nmax_restarts = 1001", "job.max_restarts (from {file}): Input should be less"
         " than or equal to 1000"),
        ("[job]\nname = '" + "x" * 10_000_000 + "'", "job.name (from {file}): String should"
         " have at most 256 characters"),
        ("[tail]\nmax_line_bytes = 1073741824", "tail.max_line_bytes (from {file}): Input"
         " should be less than or equal to 67108864"),
        ("[cost]\nprice_per_gpu_hour = nan", "cost.price_per_gpu_hour (from {file}): Input"
         " should be a finite number"),
        ("[rules.stall]\nsoft_timeout_s = 1e300", "rules.stall.soft_timeout_s (from {file}):"
         " must be at most 2592000 seconds (30 days)"),
        ("[rules.loss_spike]\nwindow = 10.5", "rules.loss_spike.window (from {file}): must be"
         " a whole number, not 10.5"),
        ("[notify]\nrate_limit = 100000000000", "notify.rate_limit (from {file}): must be at"
         " most 1000000000"),
        ("[gpu]\ninterval_s = -inf", "gpu.interval_s (from {file}): Input should be a finite"),
        ("http = 'evil host:80'", "http (from {file}): 'evil host:80': 'evil host' is not an IP"
         " address or a host name"),
    ],
    ids=["grace-inf", "grace-over-a-day", "restarts-1e26", "restarts-true", "restarts-1001",
         "name-10mb", "max-line-bytes", "price-nan", "rule-duration", "rule-window-fraction",
         "notify-count", "gpu-minus-inf", "http-host"],
)  # fmt: skip
def test_check_config_refuses_in_one_line(tmp_path: Path, toml: str, said: str) -> None:
    config = tmp_path / "sentinel.toml"
    config.write_text(toml + "\n")
    line = one_line(sentinel("check-config", "--config", str(config)))
    assert line.startswith("sentinel: config error: " + said.format(file=config)), line


@pytest.mark.slow
def test_the_environment_is_named_too(tmp_path: Path) -> None:
    line = one_line(sentinel("check-config", env={"SENTINEL_JOB__GRACE_PERIOD_S": "inf"}))
    assert line.startswith(
        "sentinel: config error: job.grace_period_s (from SENTINEL_JOB__GRACE_PERIOD_S):"
    )
    line = one_line(sentinel("check-config", env={"SENTINEL_JOB__MAX_RESTARTS": "1e26"}))
    assert "job.max_restarts (from SENTINEL_JOB__MAX_RESTARTS)" in line


@pytest.mark.slow
def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "sentinel.toml"
    config.write_bytes(b"[job]\nname = '\xff\xfe'\n")
    line = one_line(sentinel("check-config", "--config", str(config)))
    assert line == f"sentinel: config error: {config}: not UTF-8 text (byte 0xff on line 2)"


@pytest.mark.slow
def test_a_yaml_syntax_error_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "sentinel.yaml"
    config.write_text("job:\n  name: [a\n  max_restarts: 2\n")
    line = one_line(sentinel("check-config", "--config", str(config)))
    assert line.startswith(f"sentinel: config error: {config}: not valid YAML: ")
    assert "(line 3, column" in line


@pytest.mark.slow
def test_run_refuses_a_bad_http_address_before_the_job_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    state = str(tmp_path / "state")
    line = one_line(sentinel("run", "--http", "evil host:80", "--state-dir", state, "--", *job))
    assert line == (
        "sentinel: config error: http (from --http): 'evil host:80': 'evil host' is not an IP"
        " address or a host name"
    )
    assert not marker.exists(), "nothing ran"


@pytest.mark.slow
def test_run_refuses_a_port_in_use_in_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = sentinel(
            "run", "--http", address, "--state-dir", str(tmp_path / "state"), "--", *job
        )
    line = one_line(result)
    assert line.startswith(f"sentinel: --http: cannot listen at {address}: ")
    assert "in use" in line
    assert not marker.exists(), "nothing ran"


@pytest.mark.parametrize(
    "text",
    ["evil host:80", "a/b:80", "[localhost]:80", "[10.0.0.1]:80", "-bad:80", "host:+80"],
    ids=["space", "slash", "name-in-brackets", "ipv4-in-brackets", "leading-hyphen", "sign"],
)
def test_parse_http_address_refuses_a_host_that_is_none(text: str) -> None:
    with pytest.raises(ValueError):
        parse_http_address(text)


# -- the whole tree ---------------------------------------------------------------------------


Number = tuple[tuple[str, ...], type]


def _numbers(model: type[BaseModel], path: tuple[str, ...] = ()) -> list[Number]:
    """Every int and float setting under ``model``, by path."""
    found: list[Number] = []
    for name, field in model.model_fields.items():
        kinds = {field.annotation, *typing.get_args(field.annotation)} - {type(None)}
        sub = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if sub:
            found += _numbers(sub[0], (*path, name))
        elif len(kinds) == 1 and (kind := kinds.pop()) in (int, float):
            found.append(((*path, name), kind))
    return found


NUMBERS = _numbers(Settings)


def _nested(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for part in reversed(path[:-1]):
        out = {part: out}
    return out


def _refused(path: tuple[str, ...], value: Any) -> bool:
    try:
        Settings.model_validate(_nested(path, value))
    except ValidationError as error:
        return all(tuple(problem["loc"]) == path for problem in error.errors())
    return False


def test_the_tree_has_numbers() -> None:
    assert len(NUMBERS) > 100
    assert (("job", "grace_period_s"), float) in NUMBERS


@pytest.mark.parametrize(("path", "kind"), NUMBERS, ids=[".".join(path) for path, _ in NUMBERS])
def test_every_number_is_finite_and_bounded(path: tuple[str, ...], kind: type) -> None:
    huge: list[Any] = [10**30, -(10**30)] if kind is int else [1e300, -1e300]
    for value in [*huge, float("inf"), float("nan"), True]:
        assert _refused(path, value), (path, value)
    if kind is int:
        assert _refused(path, 2.5)
        assert _refused(path, 1e26)
