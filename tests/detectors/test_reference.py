"""--reference: a run is compared with a healthy run of the same recipe, aligned by step,
from its first logged values and at any cadence of either; it warns, and acts only when
told to."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.config import load_settings
from sentinel.config.reference import ReferenceError, load_reference
from sentinel.engine.replay import replay
from sentinel.model.records import Alert, Severity

EVERY_STEP = Path(__file__).resolve().parents[2] / "bench" / "runs" / "hf-every-step"


def _curve(step: int) -> float:
    return 1.2 + 4.0 * math.exp(-step / 300)


def _write_reference(folder: Path, every: int = 1, steps: int = 3000) -> Path:
    rng = random.Random(1)
    history = [
        {"step": step, "loss": _curve(step) * (1 + 0.05 * rng.gauss(0, 1)), "epoch": step / 1000}
        for step in range(every, steps + 1, every)
    ]
    path = folder / "trainer_state.json"
    path.write_text(json.dumps({"global_step": steps, "log_history": history}))
    return path


def _write_run(folder: Path, every: int, factor_from: tuple[int, float] | None = None) -> Path:
    rng = random.Random(7)
    lines = []
    for step in range(every, 3001, every):
        loss = _curve(step) * (1 + 0.05 * rng.gauss(0, 1) / math.sqrt(every))
        if factor_from is not None and step >= factor_from[0]:
            loss *= factor_from[1]
        lines.append(json.dumps({"step": step, "loss": loss}))
    path = folder / "live.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _alerts(run: Path, reference: Path, act: bool = False) -> list[Alert]:
    environ = {"SENTINEL_REFERENCE__PATH": str(reference)}
    if act:
        environ["SENTINEL_REFERENCE__ACT"] = "true"
    result = replay([run], load_settings(None, environ=environ))
    return [a for a in result.alerts if a.rule == "reference" and not a.resolves]


@pytest.mark.parametrize("every", [1, 10, 100, 500])
def test_the_same_recipe_stays_in_the_band_at_any_cadence(tmp_path: Path, every: int) -> None:
    reference = _write_reference(tmp_path)
    assert _alerts(_write_run(tmp_path, every), reference) == []


@pytest.mark.parametrize("every", [10, 100, 500])
def test_a_run_that_leaves_the_band_warns_within_its_first_five_values(
    tmp_path: Path, every: int
) -> None:
    """From its second logged value the run is 1.6x the reference: a jumped learning rate."""
    reference = _write_reference(tmp_path, every=1)
    run = _write_run(tmp_path, every, factor_from=(2 * every, 1.6))
    (alert,) = _alerts(run, reference)
    assert alert.severity == Severity.WARNING
    assert alert.onset_step == 2 * every
    assert alert.step is not None and alert.step <= 5 * every
    assert alert.details["ratio"] > 1.3
    assert "outside it since step" in alert.message


def test_it_acts_only_when_told_to(tmp_path: Path) -> None:
    reference = _write_reference(tmp_path, every=10)
    run = _write_run(tmp_path, 50, factor_from=(500, 2.0))
    (alert,) = _alerts(run, reference, act=True)
    assert alert.severity == Severity.CRITICAL
    assert alert.onset_step == 500


def test_the_real_every_step_run_is_its_own_reference_at_a_sparser_cadence(
    tmp_path: Path,
) -> None:
    """The real 10,000-step run against itself logged every 100 steps (its windows averaged,
    as the Trainer logs): inside; the same with the loss 1.5x from step 3,000: caught."""
    state = json.loads((EVERY_STEP / "trainer_state.json").read_text())
    losses = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    for name, factor in (("same", 1.0), ("shifted", 1.5)):
        lines = []
        for end in range(100, 10_001, 100):
            mean = sum(losses[s] for s in range(end - 99, end + 1)) / 100
            lines.append(json.dumps({"step": end, "loss": mean * (factor if end > 3000 else 1)}))
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    reference = EVERY_STEP / "trainer_state.json"
    assert _alerts(tmp_path / "same.jsonl", reference) == []
    alert = _alerts(tmp_path / "shifted.jsonl", reference)[0]
    assert alert.onset_step == 3100 and alert.step is not None and alert.step <= 3500


def test_a_reference_with_no_step_or_no_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "words.log").write_text("starting\nloss went down\n")
    with pytest.raises(ReferenceError, match="no metric logged at a step"):
        load_reference(tmp_path / "words.log")
    with pytest.raises(ReferenceError):
        load_reference(tmp_path / "missing.json")


def test_replay_takes_reference_and_a_bad_one_exits_2_naming_the_key(tmp_path: Path) -> None:
    reference = _write_reference(tmp_path, every=10)
    run = _write_run(tmp_path, 100, factor_from=(200, 1.8))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENTINEL_")}
    command = [sys.executable, "-m", "sentinel", "replay", "--json"]
    result = subprocess.run(
        [*command, "--reference", str(reference), str(run)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    rules = [json.loads(line)["rule"] for line in result.stdout.splitlines()]
    assert "reference" in rules, result.stderr
    bad = subprocess.run(
        [*command, "--reference", str(tmp_path / "nope.json"), str(run)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "reference.path" in bad.stderr and "nope.json" in bad.stderr
