"""The front door and the manual: a README short enough to read, a MkDocs site that builds
with ``--strict`` (no broken link, no page left out of the nav), and reference pages that are
what the parser and the settings models say today."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "gen_reference", ROOT / "docs" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_references_are_what_the_code_says() -> None:
    generator = _generator()
    assert generator.CLI_PAGE.read_text() == generator.cli_page(), (
        "docs/reference/cli.md is stale: python docs/gen_reference.py"
    )
    assert generator.CONFIG_PAGE.read_text() == generator.config_page(), (
        "docs/reference/config.md is stale: python docs/gen_reference.py"
    )


@pytest.mark.slow
def test_the_manual_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    for page in ("index.html", "quickstarts/index.html", "reference/config/index.html"):
        assert (site / page).is_file(), page
    changelog = (site / "changelog" / "index.html").read_text()
    assert "Unreleased" in changelog  # the CHANGELOG itself, included


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for needed in ("sentinel demo", "pytest", "docs/"):
        assert needed in readme, needed
