"""Every documented way of handing sentinel a secret, followed as written: the shell lines
of the docs that write a secrets file, loaded the way the shipped scripts load it, give a
config that ``sentinel check-config`` accepts; and a list that a shell stripped of its
quotes is refused in one line that says so."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.env import clean_env

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "deploy" / "slurm" / "train.sbatch"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _documented(pattern: str) -> list[str]:
    found = []
    for doc in DOCS:
        if doc.exists():
            found += re.findall(pattern, doc.read_text(), flags=re.MULTILINE)
    return found


#: `echo 'VAR=value' >> FILE` lines: the Slurm recipe's secrets file.
ECHO_LINES = _documented(r"^\s*(echo '[^'\n]*' >> \S+)$")
#: `--from-literal=VAR='value'`: a Kubernetes Secret's keys.
LITERALS = _documented(r"--from-literal=(SENTINEL_\w+='[^'\n]*')")


def _check_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "check-config", "--json"],
        capture_output=True, text=True, timeout=60, env={**clean_env(), **env}, cwd=ROOT,
    )  # fmt: skip


def _loaded_by_sbatch(env_file: Path) -> dict[str, str]:
    """What train.sbatch exports from ``env_file`` (its own load_env_file, run as written)."""
    text = SBATCH.read_text()
    function = text[
        text.index("load_env_file() {") : text.index("\n}\n", text.index("load_env_file() {")) + 3
    ]
    script = f'{function}\nload_env_file "$1"\nenv -0'
    out = subprocess.run(
        ["bash", "-c", script, "bash", str(env_file)],
        capture_output=True, check=True, env={"PATH": os.environ["PATH"]}, timeout=30,
    ).stdout  # fmt: skip
    pairs = (entry.partition("=") for entry in out.decode().split("\0") if entry)
    return {key: value for key, _, value in pairs if key.startswith("SENTINEL_")}


def test_the_docs_hold_the_secrets_lines_this_test_follows() -> None:
    assert ECHO_LINES, "the Slurm recipe's secrets line"
    assert LITERALS, "the Kubernetes Secret's literal"


@pytest.mark.slow
@pytest.mark.parametrize("line", ECHO_LINES)
def test_a_documented_echo_line_read_as_the_sbatch_script_reads_it_is_a_valid_config(
    line: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / ".config" / "sentinel").mkdir(parents=True)
    subprocess.run(["bash", "-c", line], check=True, env={"HOME": str(home)}, timeout=30)
    (env_file,) = (home / ".config" / "sentinel").iterdir()
    env = _loaded_by_sbatch(env_file)
    assert "SENTINEL_NOTIFY__URLS" in env
    done = _check_config(env)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("literal", LITERALS)
def test_a_documented_secret_literal_is_a_valid_config(literal: str) -> None:
    key, _, value = shlex.split(literal)[0].partition("=")
    done = _check_config({key: value})
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "value",
    ['["slack://T000/B000/XXXX"]', "slack://T000/B000/XXXX mailto://user:pw@example.com"],
    ids=["json-list", "space-separated"],
)
def test_both_forms_of_a_url_list_are_accepted(value: str) -> None:
    done = _check_config({"SENTINEL_NOTIFY__URLS": value})
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_list_whose_quotes_a_shell_removed_gets_one_line_with_the_hint(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text('SENTINEL_NOTIFY__URLS=["slack://T000/B000/XXXX"]\n')
    # What `set -a; . FILE` (the old script's way) leaves of it: the quotes are gone.
    shell = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; printf %s "$SENTINEL_NOTIFY__URLS"', "bash", env_file],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    assert shell == "[slack://T000/B000/XXXX]"
    done = _check_config({"SENTINEL_NOTIFY__URLS": shell})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "notify.urls (from SENTINEL_NOTIFY__URLS)" in done.stderr
    assert "did the shell remove its quotes?" in done.stderr
    assert _loaded_by_sbatch(env_file) == {"SENTINEL_NOTIFY__URLS": '["slack://T000/B000/XXXX"]'}
