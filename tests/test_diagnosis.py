"""Diagnosis: the runbooks' reading of an incident, from its rules and the metrics before it."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from sentinel.config import Settings
from sentinel.engine.replay import replay
from sentinel.evidence.chart import sparkline
from sentinel.evidence.diagnosis import Diagnosis, diagnose, explain
from sentinel.model.incidents import Incident, IncidentTracker
from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules import STORIES

NAN = math.nan
T0 = 1_700_000_000.0


def alert(
    rule: str, severity: Severity, step: int, metric: str = "loss", **details: object
) -> Alert:
    return Alert(
        rule=rule,
        severity=severity,
        message="m",
        time=T0 + step,
        step=step,
        metric=metric,
        onset_step=step,
        details=dict(details),
    )


def incident_of(*alerts: Alert) -> Incident:
    tracker = IncidentTracker("t", STORIES)
    for each in alerts:
        tracker.observe(each)
    (incident,) = {id(i): i for i in tracker.open.values()}.values()
    return incident


def series(name: str, values: Sequence[float], first_step: int = 1) -> list[Sample]:
    return [Sample(name, value, first_step + i) for i, value in enumerate(values)]


def test_grad_norm_run_before_the_nan_reads_as_an_optimisation_blow_up() -> None:
    incident = incident_of(
        alert("grad_norm_run", Severity.WARNING, 14, "grad_norm"),
        alert("nan_inf", Severity.CRITICAL, 19, "grad_norm"),
    )
    recent = {"grad_norm": series("grad_norm", [1.0] * 10 + [50.0, 400.0, NAN], first_step=7)}
    diagnosis = diagnose(incident, recent)
    assert diagnosis.cause.startswith("optimisation blow-up")
    assert "lower the learning rate" in diagnosis.advice
    assert "bf16" in diagnosis.advice
    assert diagnosis.inspect_step == 14  # the onset of the earliest evidence
    assert diagnosis.sparkline.startswith("grad_norm ") and diagnosis.sparkline.endswith("nan")


def test_a_grad_norm_that_shot_up_reads_as_a_blow_up_even_without_the_rule() -> None:
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 30, "loss"))
    recent = {
        "loss": series("loss", [2.0] * 20 + [NAN], first_step=10),
        "grad_norm": series("grad_norm", [1.0] * 18 + [30.0, 90.0], first_step=10),
    }
    assert diagnose(incident, recent).cause.startswith("optimisation blow-up")


def test_nan_after_a_flat_grad_norm_reads_as_a_bad_batch_or_numerics() -> None:
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 40, "loss"))
    recent = {
        "loss": series("loss", [2.0] * 20 + [NAN], first_step=20),
        "grad_norm": series("grad_norm", [1.0, 1.1, 0.9] * 7, first_step=20),
    }
    diagnosis = diagnose(incident, recent)
    assert diagnosis.cause.startswith("NaN with a flat grad-norm")
    assert "inspect the batch" in diagnosis.advice


def test_nan_in_the_first_steps_reads_as_the_data() -> None:
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 3, "loss"))
    recent = {"loss": series("loss", [2.3, 2.2, NAN])}
    diagnosis = diagnose(incident, recent)
    assert "first steps" in diagnosis.cause
    assert "labels out of range" in diagnosis.advice


@pytest.mark.parametrize(
    ("details", "cause"),
    [
        ({"from_start": True}, "loss flat from the start"),
        ({}, "loss plateaued high (underfitting)"),
    ],
    ids=["from-start", "later"],
)
def test_plateau_readings(details: dict[str, object], cause: str) -> None:
    incident = incident_of(alert("loss_plateau", Severity.INFO, 200, **details))
    diagnosis = diagnose(incident, {})
    assert diagnosis.cause == cause
    if details:
        assert "frozen parameters" in diagnosis.advice


def test_overfitting_names_the_checkpoint_to_keep() -> None:
    incident = incident_of(
        alert("eval_loss_rise", Severity.WARNING, 120, "eval_loss", best_step=90)
    )
    diagnosis = diagnose(incident, {})
    assert diagnosis.cause.startswith("overfitting")
    assert "checkpoint at step 90" in diagnosis.advice


@pytest.mark.parametrize(
    ("step", "samples_per_step", "expected"),
    [(1, 32, (0, 31)), (19, 4, (72, 75)), (19, None, None), (0, 4, None)],
    ids=["first-step", "step-19-batch-4", "batch-unknown", "step-0"],
)
def test_sample_range_of_the_step_to_inspect(
    step: int, samples_per_step: int | None, expected: tuple[int, int] | None
) -> None:
    incident = incident_of(alert("loss_spike", Severity.WARNING, step))
    diagnosis = diagnose(incident, {}, samples_per_step=samples_per_step)
    assert diagnosis.sample_range == expected
    if expected:
        assert f"samples {expected[0]}-{expected[1]}" in diagnosis.text()


def test_to_json_is_plain_data() -> None:
    diagnosis = Diagnosis("c", "a", 5, (16, 19), "loss ▁█")
    assert diagnosis.to_json() == {
        "cause": "c",
        "advice": "a",
        "inspect_step": 5,
        "sample_range": [16, 19],
        "sparkline": "loss ▁█",
    }


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0, 2.0, 3.0, 4.0], "▁▃▆█"), ([1.0, 1.0], "▁▁"), ([1.0, 8.0, NAN], "▁█ nan")],
    ids=["rising", "flat", "ends-in-nan"],
)
def test_sparkline(values: list[float], expected: str) -> None:
    assert sparkline(values) == expected


@pytest.mark.parametrize(
    ("evidence", "cause_has"),
    [
        ({"verdict": "hang", "d_state": 0}, "a hang"),
        ({"verdict": "hang", "d_state": 2}, "uninterruptible sleep"),
        ({"verdict": "busy", "d_state": None}, "although the job is busy"),
        ({}, "no progress"),
    ],
    ids=["hang", "d-state", "busy", "no-evidence"],
)
def test_stall_reads_its_evidence(evidence: dict[str, object], cause_has: str) -> None:
    stall = alert("stall", Severity.CRITICAL, 40, metric="silence_s", evidence=evidence)
    reading = diagnose(incident_of(stall), {})
    assert cause_has in reading.cause
    assert reading.inspect_step == 40


# -- a diagnosis that fits the evidence (issue 21.3) ---------------------------------------


def test_a_learning_rate_jump_is_named_with_its_step_beside_the_grad_norm() -> None:
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 60, "loss"))
    recent = {
        "lr": series("lr", [2e-5] * 4 + [2.4e-3] * 4, first_step=53),
        "grad_norm": series("grad_norm", [1.0] * 5 + [9.0, 40.0], first_step=53),
        "loss": series("loss", [2.0] * 7 + [NAN], first_step=53),
    }
    diagnosis = diagnose(incident, recent)
    assert "jumped 120x at step 57" in diagnosis.cause
    assert "grad-norm rose to 40" in diagnosis.cause
    assert "schedule at step 57" in diagnosis.advice


def test_a_divergence_during_warmup_is_not_read_as_the_data() -> None:
    """The loss climbs 3.2 -> 15 -> 5e11 while the learning rate still rises."""
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 10, "loss"))
    recent = {
        "lr": series("lr", [1e-4 * step for step in range(2, 10)], first_step=2),
        "loss": series("loss", [3.2, 3.5, 4.8, 15.0, 90.0, 3e3, 2e7, 5e11, NAN], first_step=2),
    }
    diagnosis = diagnose(incident, recent)
    assert diagnosis.cause.startswith("divergence during warmup")
    assert "lengthen the warmup" in diagnosis.advice
    assert "look at the data" not in diagnosis.advice


def test_a_nan_out_of_the_blue_after_a_long_stretch_names_the_step_and_samples() -> None:
    nan = alert("nan_inf", Severity.CRITICAL, 8400, "grad_norm", finite_before=840)
    recent = {
        "lr": series("lr", [3e-5] * 8, first_step=8393),
        "grad_norm": series("grad_norm", [0.4, 0.5, 0.45] * 2 + [NAN], first_step=8394),
        "loss": series("loss", [1.1, 1.0, 1.05] * 2, first_step=8394),
    }
    diagnosis = diagnose(incident_of(nan), recent, samples_per_step=8)
    assert "out of the blue at step 8400 after a healthy stretch (840" in diagnosis.cause
    assert "fp16 overflow" in diagnosis.cause
    assert "detect_anomaly" in diagnosis.advice
    assert "samples 67192-67199" in diagnosis.text()


def test_a_nan_in_the_first_steps_is_the_data_even_while_warming_up() -> None:
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 3, "loss"))
    recent = {"lr": series("lr", [1e-6, 2e-6, 3e-6]), "loss": series("loss", [2.3, 2.2, NAN])}
    assert "first steps" in diagnose(incident, recent).cause


def test_a_collapsed_loss_scale_reads_as_an_fp16_overflow() -> None:
    nan = alert(
        "nan_inf",
        Severity.CRITICAL,
        900,
        "grad_norm",
        finite_before=90,
        evidence=["the loss scale is at its minimum (1)"],
    )
    recent = {"grad_norm": series("grad_norm", [0.5] * 6 + [NAN], first_step=894)}
    assert diagnose(incident_of(nan), recent).cause.startswith("fp16 overflow")


def test_a_rule_that_saw_the_jump_long_before_says_where() -> None:
    spike = alert("divergence", Severity.CRITICAL, 700, lr_jump=[500, 2e-5, 2.4e-3])
    diagnosis = diagnose(incident_of(spike), {})
    assert "jumped 120x at step 500" in diagnosis.cause


def test_a_diagnosis_that_names_a_jump_moves_the_onset_to_the_last_step_at_the_old_rate() -> None:
    """A NaN at step 60 after the rate jumped x120 (logged at 57, the old rate last at 56):
    the rollback must go to a checkpoint saved before step 56, as the Trainer's checkpoint
    of step 56 already holds the rate of step 57 (issue 29)."""
    nan = alert("nan_inf", Severity.CRITICAL, 60, "loss")
    incident = incident_of(nan)
    recent = {
        "lr": series("lr", [2e-5] * 4 + [2.4e-3] * 4, first_step=53),
        "grad_norm": series("grad_norm", [1.0] * 5 + [9.0, 40.0], first_step=53),
        "loss": series("loss", [2.0] * 7 + [NAN], first_step=53),
    }
    explain(incident, nan, recent)
    assert incident.onset_step == 56
    assert "saved before step 56, the last logged at the old rate" in incident.diagnosis.advice


def test_a_rule_that_names_the_jump_it_saw_moves_the_onset_to_the_step_it_names() -> None:
    shift = alert("divergence", Severity.CRITICAL, 700, lr_jump=[500, 2e-5, 2.4e-3])
    shift.details["changed_after"] = 490
    incident = incident_of(shift)
    explain(incident, shift, {})
    assert incident.onset_step == 490


def test_a_nan_with_no_jump_before_it_keeps_its_onset() -> None:
    nan = alert("nan_inf", Severity.CRITICAL, 8400, "grad_norm", finite_before=840)
    incident = incident_of(nan)
    recent = {
        "lr": series("lr", [3e-5] * 8, first_step=8393),
        "grad_norm": series("grad_norm", [0.4, 0.5, 0.45] * 2 + [NAN], first_step=8394),
    }
    explain(incident, nan, recent)
    assert incident.onset_step == 8400


def test_a_loss_fallen_to_exactly_0_is_read_as_the_nan_filters_zero() -> None:
    zero = alert("nan_inf", Severity.WARNING, 4450, kind="zero_loss")
    diagnosis = diagnose(incident_of(zero), {"loss": series("loss", [2.7044, 0.0], 4440)})
    assert diagnosis.cause.startswith("the loss fell to exactly 0 at step 4450")
    assert "bf16" in diagnosis.advice


def test_a_nan_late_in_a_log_that_begins_late_is_not_the_first_steps() -> None:
    """An excerpt shows two values before a NaN at iteration 500 (logged every 50)."""
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 500, "loss"))
    recent = {
        "loss": [Sample("loss", 1.2, 400), Sample("loss", 1.1, 450), Sample("loss", NAN, 500)]
    }
    cause = diagnose(incident, recent).cause
    assert "first steps" not in cause
    assert "out of the blue at step 500" in cause


@pytest.mark.parametrize(
    ("severity", "cause_has"),
    [(Severity.CRITICAL, "loss scale collapsed"), (Severity.WARNING, "overflows cluster")],
    ids=["collapse", "cluster"],
)
def test_loss_scale_readings(severity: Severity, cause_has: str) -> None:
    reading = diagnose(incident_of(alert("loss_scale", severity, 700, "loss_scale")), {})
    assert cause_has in reading.cause
    assert reading.inspect_step == 700


def test_a_constant_loss_scale_of_one_is_no_fp16_overflow() -> None:
    """Megatron under bf16 logs ``loss scale: 1.0`` on every line: no dynamic scaling."""
    nan = alert(
        "nan_inf",
        Severity.CRITICAL,
        5426,
        "grad_norm",
        finite_before=0,
        evidence=["the loss scale is at its minimum (1)"],
    )
    recent = {
        "loss_scale": series("loss_scale", [1.0] * 3, first_step=5424),
        "grad_norm": series("grad_norm", [NAN] * 3, first_step=5424),
        "consumed_samples": series("consumed_samples", [43392, 43400, 43408], first_step=5424),
        "global_batch_size": series("global_batch_size", [8.0] * 3, first_step=5424),
    }
    diagnosis = diagnose(incident_of(nan), recent)
    assert "inspect the batch at step 5426, consumed samples 43400-43407 (" in diagnosis.advice
    assert not diagnosis.cause.startswith("fp16 overflow")
    assert "first steps" not in diagnosis.cause
    assert "at step 5426, the first grad_norm the log shows (nothing before it" in diagnosis.cause
    assert "no dynamic loss scaling (bf16 or fp32): not an fp16 overflow" in diagnosis.cause
    assert "fp16" not in diagnosis.advice


def test_a_falling_loss_scale_at_its_minimum_is_still_an_fp16_overflow() -> None:
    nan = alert(
        "nan_inf",
        Severity.CRITICAL,
        900,
        "grad_norm",
        evidence=["the loss scale is at its minimum (0.0001)"],
    )
    recent = {"loss_scale": series("loss_scale", [0.5, 0.01, 1e-4], first_step=898)}
    assert diagnose(incident_of(nan), recent).cause.startswith("fp16 overflow")


def test_a_stepless_nan_at_epoch_053_names_the_epoch_not_the_first_steps() -> None:
    """HF's dicts without a bar: ``{'loss': 0.0, 'grad_norm': nan, 'epoch': 0.53}``."""
    nan = Alert(
        rule="nan_inf",
        severity=Severity.CRITICAL,
        message="m",
        time=T0,
        step=None,
        metric="grad_norm",
        details={"finite_before": 2},
    )
    recent = {
        "epoch": [Sample("epoch", 0.52, None), Sample("epoch", 0.53, None)],
        "grad_norm": [Sample("grad_norm", 0.4, None), Sample("grad_norm", NAN, None)],
    }
    cause = diagnose(incident_of(nan), recent).cause
    assert "first steps" not in cause
    assert "out of the blue at epoch 0.53" in cause
    assert "long past the start, though the log shows only 2 finite values" in cause


def test_an_early_batch_of_a_late_epoch_is_not_the_first_steps() -> None:
    """A loop that counts batches within an epoch: batch 3 of epoch 3 is no start."""
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 3, "loss"))
    loss = series("loss", [1.2, 1.1, NAN])
    assert "first steps" in diagnose(incident, {"loss": loss}).cause
    recent = {"epoch": series("epoch", [3.0] * 3), "loss": loss}
    assert "first steps" not in diagnose(incident, recent).cause


def test_a_nan_with_no_grad_norm_logged_claims_no_flat_grad_norm() -> None:
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 1655, "loss", finite_before=0))
    recent = {"loss": series("loss", [NAN] * 3, first_step=1655)}
    cause = diagnose(incident, recent).cause
    assert cause.startswith("NaN at step 1655, the first loss the log shows (nothing before it")
    assert "grad-norm" not in cause
    assert "healthy stretch" not in cause, "the log's first value follows no stretch at all"


def test_a_nan_with_too_little_before_it_to_place_claims_no_healthy_stretch() -> None:
    """An excerpt whose first dict is already NaN, at HF's epoch 0.0: nothing says the run
    was healthy before it, or that it is the first steps."""
    incident = incident_of(
        Alert(rule="nan_inf", severity=Severity.CRITICAL, message="m", time=T0, step=None,
              metric="grad_norm", details={"finite_before": 0})
    )  # fmt: skip
    recent = {
        "epoch": [Sample("epoch", 0.0, None)] * 2,
        "grad_norm": [Sample("grad_norm", NAN, None)] * 2,
    }
    cause = diagnose(incident, recent).cause
    assert "healthy stretch" not in cause and "first steps" not in cause
    assert "with only 0 finite values before it in the log (too few to judge the run)" in cause


def test_each_incident_draws_the_values_of_its_own_time(tmp_path: Path) -> None:
    """A run whose rate jumps x100 at step 800 and whose loss follows: replayed, the rate's
    sparkline ends on the jump, the loss's on the rise, not on the file's last values (all
    incidents drew those: replay reads a file in chunks)."""
    log = tmp_path / "train.log"
    rows = [
        {
            "step": step,
            "loss": 0.1 if step < 810 else 2.0,
            "learning_rate": 1e-3 if step < 800 else 0.1,
        }
        for step in range(10, 1510, 10)
    ]
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = replay([log], Settings())
    jump = next(a for a in result.alerts if a.rule == "lr_jump")
    assert jump.details["diagnosis"]["sparkline"].startswith("lr ")
    assert jump.details["diagnosis"]["sparkline"].endswith("▁█")


def test_the_onset_moves_back_to_just_after_the_last_healthy_value_logged() -> None:
    """A run that logs every 10 steps: healthy at 320, NaN at 330. The fault began after
    320; a checkpoint saved at 325 may hold it (a real plain loop resumed one and stayed
    NaN): the rollback bound is 321, not 330."""
    nan = alert("nan_inf", Severity.CRITICAL, 330)
    incident = incident_of(nan)
    recent = {
        "loss": [
            Sample("loss", v, s) for s, v in [(300, 0.5), (310, 0.49), (320, 0.48), (330, NAN)]
        ]
    }
    explain(incident, nan, recent, written_after={320: T0 + 200.0}.get)
    assert incident.onset_step == 321
    # A checkpoint placed by time (Keras's model_33.keras) is after the onset when written
    # after the healthy value's line may have been, not only after the bad one's.
    assert incident.onset_time == T0 + 200.0
    # Logged every step, the bound is the onset itself.
    nan = alert("nan_inf", Severity.CRITICAL, 321)
    incident = incident_of(nan)
    explain(incident, nan, {"loss": series("loss", [0.5, 0.5, NAN], first_step=319)})
    assert incident.onset_step == 321


def test_a_nan_after_the_loss_climbed_says_the_loss_climbed_not_the_grad_norm() -> None:
    """A DDPG log with no grad-norm (keras-rl issue #36): its loss climbed, then NaN. The
    diagnosis said "grad-norm rose before the NaN", of a metric the log never had."""
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 6))
    recent = {"loss": series("loss", [0.8, 0.9, 3.0, 6.5, 9.0, NAN])}
    cause = diagnose(incident, recent).cause
    assert cause.startswith("optimisation blow-up (the loss climbed before the NaN)")


def test_a_nan_as_the_loss_scale_falls_overflow_after_overflow_is_fp16s() -> None:
    """A VERSE run (its issue #31): ``loss_scale: 32768`` at iter 0, 785 beside the first
    NaN at iter 100, 1.0 at 200. Read as "look at the data" before: one finite value."""
    incident = incident_of(alert("nan_inf", Severity.CRITICAL, 100, "loss_net"))
    recent = {
        "loss_net": [Sample("loss_net", 0.9443, 0), Sample("loss_net", NAN, 100)],
        "loss_scale": [Sample("loss_scale", 32768.0, 0), Sample("loss_scale", 785.42, 100)],
    }
    cause = diagnose(incident, recent).cause
    assert cause.startswith("fp16 overflow: the loss scale fell")
