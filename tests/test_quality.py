"""The code passes the project's linters: ruff and strict mypy, as part of the full test run.

Marked slow: ``pytest -m "not slow"`` (the fast loop) leaves them to the full run and CI.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is not installed: pip install '.[test]'")
    return found


def test_ruff_check() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "sentinel", "tests", "bench"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = subprocess.run([_tool("mypy"), "sentinel"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
