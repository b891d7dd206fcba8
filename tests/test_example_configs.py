"""The example configs shipped in configs/ are valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.config import load_settings

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_is_valid(path: Path) -> None:
    settings = load_settings(path, environ={})
    assert settings.checkpoints is not None


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 2
