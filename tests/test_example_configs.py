"""The example configs shipped in configs/ load, and each setting they show takes effect."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.config import Settings, load_settings
from sentinel.model.records import Severity

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.toml"))


def _hf_trainer(settings: Settings) -> None:
    assert (settings.checkpoints, settings.state_dir) == (Path("out"), Path("out/.sentinel"))
    assert (settings.job.name, settings.job.max_restarts) == ("hf-finetune", 2)
    assert settings.job.grace_period_s == 120.0
    assert (settings.notify.urls, settings.notify.min_severity) == ([], Severity.WARNING)
    stall = settings.rule("stall")
    assert (stall.soft_timeout_s, stall.hard_timeout_s) == (900.0, 2700.0)  # type: ignore[attr-defined]


def _pytorch_jsonl(settings: Settings) -> None:
    assert settings.logs == ["out/metrics.jsonl"]
    assert settings.checkpoints == Path("out/ckpt")
    assert settings.job.resume_command == "python train.py --resume {checkpoint}"
    assert settings.job.max_restarts == 3
    assert settings.rule("nan_inf").ignore == ["loss_scale"]  # type: ignore[attr-defined]


#: What each example sets, checked on the loaded settings (not only that it loads).
EXPECTED: dict[str, Callable[[Settings], None]] = {
    "hf-trainer.toml": _hf_trainer,
    "pytorch-jsonl.toml": _pytorch_jsonl,
}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_config_sets_what_it_shows(path: Path) -> None:
    settings = load_settings(path, environ={})
    assert settings.checkpoints is not None, f"{path.name} names the job's checkpoint dir"
    EXPECTED[path.name](settings)  # asserts each value the example shows


def test_every_example_is_checked() -> None:
    """An example added to configs/ (or one gone from it) needs its checks here."""
    assert sorted(path.name for path in EXAMPLES) == sorted(EXPECTED)


def test_readme_config_reference_is_valid(tmp_path: Path) -> None:
    """The TOML block in the README's Configuration section loads as it stands."""
    from tests.helpers.manual import section as manual_section

    section = manual_section("Configuration")
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
