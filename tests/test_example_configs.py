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


def test_readme_config_reference_is_valid(tmp_path: Path) -> None:
    """The TOML block in the README's Configuration section loads as it stands."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Configuration") :]
    block = section[
        section.index("```toml") + len("```toml") : section.index(
            "```", section.index("```toml") + 7
        )
    ]
    path = tmp_path / "readme.toml"
    path.write_text(block, encoding="utf-8")
    settings = load_settings(path, environ={})
    assert settings.training.samples_per_step == 8 * 4 * 8
    assert settings.rule("grad_norm_run").max_grad_norm == 1.0  # type: ignore[attr-defined]
