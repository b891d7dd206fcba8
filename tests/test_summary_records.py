"""Summary records are not steps: the end-of-run summary's ``train_loss`` (the mean over
the whole run) and its rates reach no rule, in every reader."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.config import Settings
from sentinel.engine.replay import replay

STEPS = 60
#: A run whose loss fell far: the summary's mean is ~50x its last values.
LOSSES = [2.0 if step <= 10 else 0.02 + 0.001 * (step % 3) for step in range(1, STEPS + 1)]
MEAN = sum(LOSSES) / len(LOSSES)
SUMMARY = {
    "train_runtime": 812.4,
    "train_samples_per_second": 39.4,
    "train_steps_per_second": 0.074,
    "total_flos": 1.2e15,
    "train_loss": MEAN,
    "epoch": 3.0,
}


def records() -> list[dict[str, float]]:
    return [
        {"loss": loss, "grad_norm": 0.9, "learning_rate": 1e-5, "epoch": step / 20, "step": step}
        for step, loss in enumerate(LOSSES, start=1)
    ]


def jsonl(folder: Path) -> Path:
    lines = [json.dumps(record) for record in records()]
    lines.append(json.dumps({**SUMMARY, "step": STEPS}))
    path = folder / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def trainer_state(folder: Path) -> Path:
    history = [dict(sorted(record.items())) for record in records()]
    history.append(dict(sorted({**SUMMARY, "step": STEPS}.items())))
    state = {"global_step": STEPS, "max_steps": STEPS, "log_history": history}
    path = folder / "trainer_state.json"
    path.write_text(json.dumps(state, indent=2), encoding="utf-8")
    return path


def hf_stdout(folder: Path) -> Path:
    lines = []
    for record in records():
        shown = {key: value for key, value in record.items() if key != "step"}
        lines.append(f"{shown}")
    lines.append(f"{SUMMARY}")
    path = folder / "train.log"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def csv(folder: Path) -> Path:
    rows = ["step,train_loss,grad_norm,train_runtime,total_flos"]
    rows += [f"{step},{loss},0.9,," for step, loss in enumerate(LOSSES, start=1)]
    rows.append(f"{STEPS},{MEAN},,812.4,1.2e15")
    path = folder / "metrics.csv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "write",
    [jsonl, trainer_state, hf_stdout, csv],
    ids=["jsonl", "trainer_state", "hf-stdout", "csv"],
)
def test_the_summary_raises_nothing(write: Callable[[Path], Path], tmp_path: Path) -> None:
    result = replay([write(tmp_path)], Settings())
    assert result.samples > STEPS  # the run itself was read
    assert [alert.message for alert in result.alerts] == []


def test_a_real_spike_at_the_last_step_still_raises(tmp_path: Path) -> None:
    """Only the summary is exempt: the same jump logged as a step is judged."""
    lines = [json.dumps(record) for record in records()]
    lines.append(json.dumps({"loss": MEAN, "grad_norm": 0.9, "step": STEPS + 1}))
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rules = {alert.rule for alert in replay([path], Settings()).alerts}
    assert "loss_spike" in rules
