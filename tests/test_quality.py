"""The code passes the project's linters: ruff, strict mypy and the import layers of
pyproject's ``[tool.importlinter]`` (``lint-imports``), as part of the full test run.

Marked slow: ``pytest -m "not slow"`` (the fast loop) leaves them to the full run and CI.
"""

from __future__ import annotations

import os
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
        [_tool("ruff"), "check", "sentinel", "tests", "bench", "examples"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    """One format, so that a diff shows what changed, not who formatted it."""
    result = subprocess.run(
        [_tool("ruff"), "format", "--check", "sentinel", "tests", "bench", "examples"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = subprocess.run([_tool("mypy"), "sentinel"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_imports_keep_to_their_layers() -> None:
    """Every contract of ``[tool.importlinter]`` holds: the layers, and no import cycle."""
    result = subprocess.run(
        [_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_import_up_the_layers_breaks_the_contracts(tmp_path: Path) -> None:
    """The contracts see a real upward import: records (the bottom layer) importing the CLI."""
    shutil.copytree(ROOT / "sentinel", tmp_path / "sentinel")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    records = tmp_path / "sentinel" / "model" / "records.py"
    records.write_text(records.read_text() + "\nimport sentinel.cli.main  # noqa: E402, F401\n")
    result = subprocess.run(
        [_tool("lint-imports"), "--no-cache"],
        cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode != 0, result.stdout
    assert "sentinel.model.records -> sentinel.cli.main" in result.stdout
