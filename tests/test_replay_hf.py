"""``sentinel replay`` on real HF Trainer artifacts (tests/fixtures/make_hf_logs.py made them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sentinel.config import Settings, load_settings
from sentinel.engine.replay import replay
from sentinel.parsing.hf_trainer import read_trainer_state_entries
from tests.helpers.env import clean_env

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"
ARTIFACTS = ["train.log", "train.unbuffered.log", "trainer_state.json"]


def settings() -> Settings:
    return load_settings(None, environ={"SENTINEL_PARSERS__LOGGING_STEPS": "1"})


@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_first_nan_inf_is_at_the_exact_step(artifact: str) -> None:
    expected = json.loads((FIXTURES / "nan" / "expected.json").read_text())
    result = replay([FIXTURES / "nan" / artifact], settings())
    first = next(alert for alert in result.alerts if alert.rule == "nan_inf")
    assert (first.step, first.metric) == (expected["first_nonfinite_step"], expected["metric"])
    assert result.garbled == 0


@pytest.mark.parametrize("artifact", ARTIFACTS)
def test_healthy_run_raises_nothing(artifact: str) -> None:
    result = replay([FIXTURES / "healthy" / artifact], settings())
    assert result.worst() is None, [alert.message for alert in result.alerts]
    assert result.samples > 0


def test_every_printed_dict_is_read_even_when_glued_to_the_progress_bar() -> None:
    # With stdout buffered, the first dict after each flush follows tqdm's bar text directly.
    expected = json.loads((FIXTURES / "nan" / "expected.json").read_text())
    result = replay([FIXTURES / "nan" / "train.log"], settings())
    dicts = expected["train.log"]["n_metric_dicts"]
    assert result.samples >= dicts * 3  # loss, grad_norm and learning rate in each


@pytest.mark.slow
def test_replay_cli_json_on_hf_log() -> None:
    env = clean_env()
    env["SENTINEL_PARSERS__LOGGING_STEPS"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "sentinel", "replay", "--json", "--fail-on", "critical",
         str(FIXTURES / "nan" / "train.log")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    alerts = [json.loads(line) for line in result.stdout.splitlines()]
    first = next(alert for alert in alerts if alert["rule"] == "nan_inf")
    assert (first["rule"], first["step"], first["value"]) == ("nan_inf", 19, "nan")
    # The loss 1e9x its least in warmup warns, and with the grad-norm thousands of times its
    # own on the same record it is a blow-up, critical before the NaN; the NaN's diagnosis
    # reads the blow-up.
    assert [(a["rule"], a["severity"]) for a in alerts[:2]] == [
        ("loss_spike", "warning"),
        ("loss_spike", "critical"),
    ]
    assert alerts[1]["message"].endswith("a blow-up")
    assert alerts[1]["diagnosis"]["cause"].startswith("optimisation blow-up")
    assert alerts[1]["step"] < 19
    assert first["diagnosis"]["cause"].startswith("optimisation blow-up")


def test_a_trainer_state_beside_the_log_gives_each_printed_dict_its_exact_step(
    tmp_path: Path,
) -> None:
    """Real transformers 5.x stdout (tests/fixtures/hf_steps, buffered, with the tqdm bar)
    whose fifth logged loss is made NaN: with the trainer_state.json of the checkpoint
    before it beside the log, the NaN is at the step HF logged it at (20), not at the
    progress bar's (24)."""
    fixtures = Path(__file__).parent / "fixtures" / "hf_steps"
    lines = (fixtures / "tqdm.log").read_bytes().decode("utf-8").split("\n")
    index = [i for i, line in enumerate(lines) if "{'loss': '" in line][4]
    value = lines[index].split("'loss': '")[1].split("'")[0]
    lines[index] = lines[index].replace(f"'loss': '{value}'", "'loss': 'nan'", 1)
    (tmp_path / "train.log").write_bytes("\n".join(lines).encode("utf-8"))
    state = json.loads((fixtures / "trainer_state.json").read_text())
    truth = [e["step"] for e in state["log_history"] if "loss" in e and "eval_loss" not in e]
    # As the last checkpoint before the NaN holds it: the log history up to there.
    history = [e for e in state["log_history"] if e["step"] < truth[4]]
    saved = {**state, "log_history": history, "global_step": history[-1]["step"]}
    (tmp_path / "trainer_state.json").write_text(json.dumps(saved))

    result = replay([tmp_path / "trainer_state.json", tmp_path / "train.log"], Settings())

    first = next(a for a in result.alerts if a.rule == "nan_inf")
    assert (truth[4], first.step) == (20, 20)  # the bar read alone says 24


CORPUS = Path(__file__).resolve().parent / "corpus" / "healthy"


def test_a_trainer_state_that_ends_with_the_runs_summary_is_judged_entry_by_entry(
    tmp_path: Path,
) -> None:
    """A finished run's trainer_state.json ends with the Trainer's summary (train_runtime,
    total_flos, the run's mean train_loss). Read as one record, the summary's names made the
    whole history a summary, shown to no rule: a real Whisper run's file with a NaN loss
    put in at step 2500 raised nothing. Each entry is its own record; the summary is none."""
    state = json.loads((CORPUS / "whisper-small-hi" / "trainer_state.json").read_text())
    history = state["log_history"]
    assert "train_runtime" in history[-1]
    nan_at = next(entry for entry in history if entry.get("step") == 2500 and "loss" in entry)
    nan_at["loss"] = float("nan")
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(state), encoding="utf-8")
    result = replay([path], settings())
    raised = [(alert.rule, alert.step) for alert in result.alerts if alert.rule == "nan_inf"]
    assert raised[:1] == [("nan_inf", 2500)]
    # The summary is no step: its mean train_loss is not a loss at the last step.
    entries = read_trainer_state_entries(path.read_text(encoding="utf-8"))
    assert len(entries) == len(history) - 1
    assert {sample.step for sample in entries[-1]} == {history[-2]["step"]}
