"""nan_inf: the first non-finite value of any watched metric opens one critical episode."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest

from sentinel.model.records import Alert, Sample, Severity
from sentinel.rules.nan_inf import NanInfConfig, NanInfDetector

NAN = math.nan
INF = math.inf
NOW = 1_700_000_000.0


def feed(detector: NanInfDetector, samples: Sequence[Sample]) -> list[Alert]:
    alerts: list[Alert] = []
    for sample in samples:
        alerts += detector.observe(sample, "train.log", NOW)
    return alerts


def steps(name: str, values: Sequence[float], first_step: int = 1) -> list[Sample]:
    return [Sample(name, value, first_step + i) for i, value in enumerate(values)]


@pytest.mark.parametrize(
    ("value", "json_value"),
    [(NAN, "nan"), (INF, "inf"), (-INF, "-inf")],
    ids=["nan", "+inf", "-inf"],
)
def test_fires_once_on_non_finite_value(value: float, json_value: str) -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts = feed(detector, steps("loss", [2.0, 1.9, value, 1.8]))
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.rule == "nan_inf"
    assert alert.severity is Severity.CRITICAL
    assert alert.step == 3
    assert alert.onset_step == 3
    assert alert.metric == "loss"
    assert not alert.resolves
    assert alert.to_json()["value"] == json_value


@pytest.mark.parametrize(
    ("value", "json_value"),
    [(NAN, "nan"), (INF, "inf"), (-INF, "-inf")],
    ids=["nan", "+inf", "-inf"],
)
def test_alert_json_is_strict_json(value: float, json_value: str) -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = feed(detector, [Sample("loss", value, 5)])
    text = json.dumps(alert.to_json(), allow_nan=False)
    decoded = json.loads(text)
    assert decoded["value"] == json_value
    assert decoded["rule"] == "nan_inf"
    assert decoded["severity"] == "critical"
    assert decoded["step"] == 5
    assert set(decoded) == {
        "rule",
        "severity",
        "step",
        "metric",
        "value",
        "message",
        "time",
        "source",
    }


def test_grad_norm_nan_with_a_finite_loss_stops_a_run_without_loss_scaling() -> None:
    detector = NanInfDetector(NanInfConfig(loss_scaling="none"))
    samples = [
        Sample("loss", 2.0, 10),
        Sample("grad_norm", 1.5, 10),
        Sample("loss", 2.0, 20),
        Sample("grad_norm", NAN, 20),
    ]
    alerts = feed(detector, samples)
    assert [(a.metric, a.step) for a in alerts] == [("grad_norm", 20)]


def test_one_alert_per_episode_across_metrics_and_repeats() -> None:
    detector = NanInfDetector(NanInfConfig())
    samples = [
        Sample("loss", NAN, 7),
        Sample("grad_norm", NAN, 7),
        Sample("loss", NAN, 8),
        Sample("grad_norm", INF, 8),
    ]
    alerts = feed(detector, samples)
    assert len(alerts) == 1
    assert alerts[0].onset_step == 7


def test_onset_step_is_the_first_non_finite_step() -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = feed(detector, steps("loss", [2.0] * 41 + [NAN], first_step=0))
    assert alert.step == 41
    assert alert.onset_step == 41
    assert "41" in alert.message


def test_alert_time_is_the_sample_time_when_it_has_one() -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = detector.observe(Sample("loss", NAN, 3, time=123.5), "m.jsonl", NOW)
    assert alert.time == 123.5
    assert alert.source == "m.jsonl"


def test_alert_time_is_now_when_sample_has_no_time() -> None:
    detector = NanInfDetector(NanInfConfig())
    (alert,) = detector.observe(Sample("loss", NAN, 3), "stdout", NOW)
    assert alert.time == NOW


@pytest.mark.parametrize(
    ("config", "metric", "fires"),
    [
        (NanInfConfig(metrics=["loss"]), "loss", True),
        (NanInfConfig(metrics=["loss"]), "grad_norm", False),
        (NanInfConfig(ignore=["loss_scale"]), "loss_scale", False),
        (NanInfConfig(ignore=["loss_scale"]), "loss", True),
        (NanInfConfig(metrics=["loss"], ignore=["loss"]), "loss", False),
    ],
    ids=[
        "watched-metric",
        "unwatched-metric",
        "ignored-metric",
        "not-ignored-metric",
        "ignore-beats-metrics",
    ],
)
def test_metrics_and_ignore_select_what_is_watched(
    config: NanInfConfig, metric: str, fires: bool
) -> None:
    detector = NanInfDetector(config)
    alerts = feed(detector, [Sample(metric, INF, 4)])
    assert bool(alerts) is fires


def test_resolves_after_resolve_after_finite_values() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=3))
    alerts = feed(detector, steps("loss", [NAN, 1.0, 1.0], first_step=1))
    assert len(alerts) == 1
    (resolved,) = feed(detector, [Sample("loss", 1.0, 4)])
    assert resolved.resolves
    assert resolved.rule == "nan_inf"
    assert resolved.severity is Severity.INFO
    assert resolved.step == 4


def test_resolve_waits_for_every_offending_metric() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=2))
    feed(detector, [Sample("loss", NAN, 1), Sample("grad_norm", NAN, 1)])
    alerts = feed(detector, steps("loss", [1.0, 1.0, 1.0], first_step=2))
    assert alerts == []
    (resolved,) = feed(detector, steps("grad_norm", [1.0, 1.0], first_step=2))
    assert resolved.resolves


def test_non_finite_during_recovery_restarts_the_count() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=3))
    alerts = feed(detector, steps("loss", [NAN, 1.0, 1.0, NAN, 1.0, 1.0], first_step=1))
    assert len(alerts) == 1  # still one episode, not resolved yet
    assert not alerts[0].resolves
    (resolved,) = feed(detector, [Sample("loss", 1.0, 7)])
    assert resolved.resolves


def test_new_episode_after_resolve_fires_again() -> None:
    detector = NanInfDetector(NanInfConfig(resolve_after=1))
    alerts = feed(detector, steps("loss", [NAN, 1.0, INF], first_step=1))
    assert [(a.resolves, a.step) for a in alerts] == [(False, 1), (True, 2), (False, 3)]


def test_finite_values_alone_raise_nothing() -> None:
    detector = NanInfDetector(NanInfConfig())
    assert feed(detector, steps("loss", [2.0, 1e30, -1e30, 0.0])) == []


def test_job_started_resets_the_episode() -> None:
    detector = NanInfDetector(NanInfConfig())
    assert len(feed(detector, [Sample("loss", NAN, 50)])) == 1
    detector.job_started(NOW)
    alerts = feed(detector, [Sample("loss", NAN, 40)])
    assert len(alerts) == 1
    assert alerts[0].onset_step == 40


# -- which non-finite values stop the job (issue 22.5, 22.6) ----------------------------


def hf_steps(
    grad_norms: Sequence[float],
    losses: Sequence[float] | None = None,
    first_step: int = 10,
    every: int = 10,
) -> list[list[Sample]]:
    """HF log lines: loss then grad_norm, one line per logged step."""
    losses = losses if losses is not None else [1.5] * len(grad_norms)
    return [
        [
            Sample("loss", loss, first_step + i * every),
            Sample("grad_norm", grad, first_step + i * every),
        ]
        for i, (loss, grad) in enumerate(zip(losses, grad_norms, strict=True))
    ]


def feed_lines(detector: NanInfDetector, lines: Sequence[list[Sample]]) -> list[Alert]:
    alerts: list[Alert] = []
    for line in lines:
        alerts += [alert for _, alert in detector.observe_samples(line, "train.log", NOW)]
    return alerts


HEALTHY = [0.9, 1.1, 1.0, 0.8, 1.2, 0.95, 1.05, 1.0]


@pytest.mark.parametrize(
    "grad_norms",
    [
        [*HEALTHY, INF, *HEALTHY],
        [*HEALTHY, NAN, *HEALTHY],
        [INF, INF, INF, INF, *HEALTHY],  # the scaler calibrating at the start
        [*HEALTHY, INF, INF, *HEALTHY],  # two in a row: below persist
    ],
    ids=["lone-inf", "lone-nan", "calibration", "two-in-a-row"],
)
def test_a_skipped_fp16_step_is_counted_not_alarmed(grad_norms: list[float]) -> None:
    detector = NanInfDetector(NanInfConfig())
    assert feed_lines(detector, hf_steps(grad_norms)) == []
    assert detector.skipped_steps == sum(not math.isfinite(g) for g in grad_norms)


def test_skipped_steps_that_cluster_warn_once() -> None:
    detector = NanInfDetector(NanInfConfig(skip_cluster=3))
    grads = [*HEALTHY, INF, 1.0, INF, 1.0, INF, 1.0, INF, 1.0]
    (alert,) = feed_lines(detector, hf_steps(grads))
    assert alert.severity is Severity.WARNING
    assert alert.step == 10 + 12 * 10  # the third skip
    assert alert.details["kind"] == "skip_cluster"
    assert "skipped 3 of the last" in alert.message


def test_a_persistent_non_finite_grad_norm_is_critical_at_its_first_step() -> None:
    detector = NanInfDetector(NanInfConfig(persist=3))
    (alert,) = feed_lines(detector, hf_steps([*HEALTHY, NAN, NAN, NAN, NAN]))
    assert alert.severity is Severity.CRITICAL
    assert alert.metric == "grad_norm"
    assert alert.step == 10 + 10 * 10  # the third
    assert alert.onset_step == 10 + 8 * 10  # the first non-finite step
    assert "persisted for 3" in alert.message


@pytest.mark.parametrize(
    ("config", "before", "extra"),
    [
        (NanInfConfig(loss_scaling="none"), [], []),
        (NanInfConfig(), [], [Sample("loss_scale", 1e-4, 89)]),
        (NanInfConfig(), [(1.0, 40.0), (1.5, 60.0)], []),  # grad-norm climbing
        (NanInfConfig(), [(3.5, 1.0), (20.0, 1.0)], []),  # loss climbing
    ],
    ids=["no-loss-scaling", "scale-at-minimum", "grad-norm-climbed", "loss-climbed"],
)
def test_a_corroborated_non_finite_grad_norm_is_critical_at_once(
    config: NanInfConfig, before: list[tuple[float, float]], extra: list[Sample]
) -> None:
    detector = NanInfDetector(config)
    lines = hf_steps(HEALTHY)
    lines += [
        [Sample("loss", loss, 100 + i), Sample("grad_norm", grad, 100 + i)]
        for i, (loss, grad) in enumerate(before)
    ]
    lines += [extra, [Sample("loss", 1.5, 200), Sample("grad_norm", NAN, 200)]]
    (alert,) = feed_lines(detector, lines)
    assert alert.severity is Severity.CRITICAL
    assert (alert.metric, alert.step, alert.onset_step) == ("grad_norm", 200, 200)
    assert alert.details["evidence"]


def test_a_loss_of_zero_with_a_nan_grad_norm_on_every_step_is_a_failed_run() -> None:
    """HF's nan filter logs 0.0 for an interval of NaN steps: not a converged run."""
    detector = NanInfDetector(NanInfConfig())
    (alert,) = feed_lines(detector, hf_steps([NAN, NAN, NAN], losses=[0.0, 0.0, 0.0]))
    assert alert.severity is Severity.CRITICAL
    assert (alert.step, alert.onset_step) == (20, 10)
    assert "exactly 0.0" in alert.message


def test_the_line_loss_counts_even_when_the_grad_norm_comes_first() -> None:
    """trainer_state.json sorts its keys: grad_norm before loss. The NaN is the loss's."""
    detector = NanInfDetector(NanInfConfig())
    (alert,) = feed_lines(detector, [[Sample("grad_norm", NAN, 5), Sample("loss", NAN, 5)]])
    assert (alert.metric, alert.severity) == ("loss", Severity.CRITICAL)


@pytest.mark.parametrize(
    ("name", "severity"),
    [
        ("loss", Severity.CRITICAL),
        ("eval_loss", Severity.CRITICAL),
        ("lm_loss", Severity.CRITICAL),
        ("eval_bleu", Severity.WARNING),
        # A perplexity is its loss's exponent (OpenNMT-lua's `PPL nan`: all it logs).
        ("ppl", Severity.CRITICAL),
        ("eval_perplexity", Severity.CRITICAL),
        ("best_eval_loss", Severity.WARNING),
        ("best_ppl", Severity.WARNING),
        ("objective", Severity.WARNING),  # an Optuna trial's score
        ("loss_scale", None),
    ],
)
def test_which_metric_stops_the_job(name: str, severity: Severity | None) -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts = feed(detector, [Sample(name, 2.0, 1), Sample(name, NAN, 2)])
    assert [alert.severity for alert in alerts] == ([severity] if severity else [])
    if alerts:
        assert alerts[0].metric == name
        assert name in alerts[0].message


def test_a_metric_non_finite_since_its_first_value_is_not_news() -> None:
    detector = NanInfDetector(NanInfConfig())
    assert feed(detector, steps("best_eval_loss", [INF, INF, INF])) == []
    (alert,) = feed(detector, steps("best_eval_loss", [0.9, INF], first_step=4))
    assert alert.severity is Severity.WARNING


def test_stop_metrics_names_more_metrics_that_stop_the_job() -> None:
    detector = NanInfDetector(NanInfConfig(stop_metrics=["eval_bleu"]))
    (alert,) = feed(detector, [Sample("eval_bleu", 9.0, 1), Sample("eval_bleu", INF, 2)])
    assert alert.severity is Severity.CRITICAL


def test_a_warning_gives_way_to_a_critical_with_its_own_onset() -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts = feed(
        detector,
        [Sample("eval_bleu", 20.0, 100), Sample("eval_bleu", NAN, 200), Sample("loss", NAN, 900)],
    )
    assert [(a.severity, a.resolves) for a in alerts] == [
        (Severity.WARNING, False),
        (Severity.INFO, True),
        (Severity.CRITICAL, False),
    ]
    assert alerts[-1].onset_step == 900


def test_a_non_finite_grad_norm_the_job_did_not_skip_is_critical_at_once() -> None:
    """Megatron counts the iterations its scaler skipped: 0 beside a NaN grad-norm is a NaN."""
    detector = NanInfDetector(NanInfConfig())
    line = [Sample("grad_norm", NAN, 5426), Sample("skipped_iterations", 0.0, 5426)]
    (alert,) = feed_lines(detector, [line])
    assert (alert.severity, alert.step) == (Severity.CRITICAL, 5426)
    assert "no skipped iteration" in alert.message


def _line(detector: NanInfDetector, step: int, values: dict[str, float]) -> list[Alert]:
    samples = [Sample(name, value, step) for name, value in values.items()]
    return [alert for _, alert in detector.observe_samples(samples, "train.log", NOW)]


@pytest.mark.parametrize("history", [1, 3, 50], ids=lambda n: f"{n}-finite-lines-before")
def test_metrics_that_turn_non_finite_together_stop_as_a_loss_whatever_their_names(
    history: int,
) -> None:
    """A compression model's objective has no metric named loss: ``avg_rd: nan | cur_rd: nan
    | avg_bpp: nan`` after finite values is the run going, at any history length (its
    ``avg_mse`` beside them is a loss function's name, a loss of its own)."""
    detector = NanInfDetector(NanInfConfig())
    for step in range(1, history + 1):
        assert _line(detector, step, {"avg_rd": 1.0 / step, "cur_rd": 2.0, "avg_bpp": 0.5}) == []
    bad = history + 1
    (alert,) = _line(detector, bad, {"avg_rd": NAN, "cur_rd": NAN, "avg_bpp": NAN})
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.CRITICAL, bad, bad)
    assert "3 metrics that were finite turned non-finite together" in alert.message
    assert alert.details["kind"] == "together"
    assert _line(detector, bad + 1, {"avg_rd": NAN, "cur_rd": NAN, "avg_bpp": NAN}) == []


def test_one_metric_alone_or_trackers_that_start_at_inf_only_warn() -> None:
    detector = NanInfDetector(NanInfConfig())
    assert _line(detector, 1, {"best_bleu": INF, "best_ppl": INF, "bleu": 30.0}) == []
    (alert,) = _line(detector, 2, {"best_bleu": INF, "best_ppl": INF, "bleu": NAN})
    assert alert.severity is Severity.WARNING


def test_metrics_nan_from_their_first_value_warn_once() -> None:
    """A real DPO run (LLaMA-Factory) logged its rewards, log-probs and logits as NaN from
    its first line on: no tracker starts at NaN (a best-so-far starts at inf), so it warns,
    once for the line; its loss was 0.0, not NaN, so nothing stops the job."""
    detector = NanInfDetector(NanInfConfig())
    first = {"rewards/chosen": NAN, "rewards/rejected": NAN, "logps/chosen": NAN, "best": INF}
    (alert,) = _line(detector, 1, first)
    assert (alert.severity, alert.metric) == (Severity.WARNING, "rewards/chosen")
    assert _line(detector, 2, first) == []


# -- a loss of exactly 0 --------------------------------------------------------------------


def test_a_loss_that_falls_to_exactly_0_warns_then_is_critical_from_its_first_zero() -> None:
    """LLaMA-Factory's trainer_log.jsonl of a real fp16 run: 2.7044 at step 4440, 0.0 at
    4450 (the Trainer's nan filter logs 0 for an interval of NaN steps)."""
    detector = NanInfDetector(NanInfConfig())
    warning, *rest = feed(detector, steps("loss", [2.9, 2.8, 2.7044, 0.0], first_step=4410))
    assert rest == []
    assert (warning.severity, warning.step, warning.details["kind"]) == (
        Severity.WARNING,
        4413,
        "zero_loss",
    )
    assert "exactly 0 at step 4413 after 2.704" in warning.message
    superseded, critical = feed(detector, steps("loss", [0.0], first_step=4414))
    assert superseded.resolves
    assert (critical.severity, critical.step, critical.onset_step) == (
        Severity.CRITICAL,
        4414,
        4413,
    )
    assert "exactly 0 since step 4413" in critical.message


def test_zeros_on_lines_that_name_no_step_are_critical_from_the_second() -> None:
    """A real Flash-VStream fine-tune's Trainer dicts (issue #24 of its repository) name no
    step: 1.9156, 1.8055, then 0.0 five times. The second zero in a row is critical as it
    is with steps; it was taken for the first of a new row, and the zeros for the norm."""
    detector = NanInfDetector(NanInfConfig())
    losses = [1.9156, 1.8055, 0.0, 0.0, 0.0]
    alerts = feed(detector, [Sample("loss", value, None) for value in losses])
    warning, superseded, critical = alerts
    assert (warning.severity, warning.details["kind"]) == (Severity.WARNING, "zero_loss")
    assert "loss is exactly 0 after 1.806" in warning.message
    assert superseded.resolves
    assert critical.severity == Severity.CRITICAL
    assert "exactly 0 twice in a row" in critical.message


def test_a_zero_that_comes_back_up_warned_once_and_its_loss_may_be_0_from_then_on() -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts = feed(detector, steps("loss", [0.5, 0.4, 0.0, 0.3] + [0.2] * 10 + [0.0, 0.0, 0.0]))
    assert [(a.severity, a.resolves) for a in alerts] == [
        (Severity.WARNING, False),
        (Severity.INFO, True),
    ]


@pytest.mark.parametrize(
    "losses",
    [
        pytest.param([0.02, 0.004, 0.0009, 0.0001, 0.0, 0.0], id="rounded-to-0-as-it-neared-0"),
        pytest.param([0.0, 0.0, 0.0012, -0.03, 0.0, 0.0], id="an-rl-objective-that-starts-at-0"),
        pytest.param([0.8, 0.3, 0.005, 0.3, 0.0, 0.0], id="a-value-near-0-among-the-last-5"),
    ],
)
def test_a_loss_that_may_be_0_raises_nothing_at_0(losses: list[float]) -> None:
    assert feed(NanInfDetector(NanInfConfig()), steps("loss", losses)) == []


def test_a_block_of_lines_says_what_line_by_line_says_of_a_loss_at_0() -> None:
    """A replayed metrics file in blocks: a block that holds a 0 loss is refused."""
    import json

    from sentinel.rules import DETECTORS
    from tests.detectors.blockcheck import run

    def records(losses: list[float]) -> list[str]:
        return [json.dumps({"step": 10 * (i + 1), "loss": v}) for i, v in enumerate(losses)]

    def only() -> list[NanInfDetector]:
        return [DETECTORS["nan_inf"](NanInfConfig())]  # type: ignore[list-item]

    falls = [2.0 - i / 1000 for i in range(300)] + [0.0, 0.0] + [1.5] * 40
    nears = [1 / (i + 1) ** 2 for i in range(200)] + [0.0] * 40 + [2.0] * 20 + [0.0] * 3
    said = []
    for texts in (records(falls), records(nears)):
        line_by_line = run(only, texts, blocks=False)
        blocks = run(only, texts, blocks=True)
        assert blocks.alerts == line_by_line.alerts
        assert blocks.state == line_by_line.state
        assert blocks.lines_absorbed > len(texts) // 2
        said.append([(alert[1], alert[9]) for alert in blocks.alerts])
    assert said == [
        [("warning", False), ("info", True), ("critical", False), ("info", True)],
        [],  # it neared 0 first: its zeros are its own
    ]


def test_a_loss_exactly_0_from_its_first_value_warns_once_at_its_third() -> None:
    """An MMSegmentation run (its issue #3080): ``loss: 0.0000, acc_seg: 100.0000`` from its
    first line, every label ignored. An RL objective at 0 for two values, then moving, is
    its own (``an-rl-objective-that-starts-at-0`` above)."""
    alerts = feed(NanInfDetector(NanInfConfig()), steps("loss", [0.0] * 12, first_step=50))
    assert [(a.severity, a.step, a.details["kind"]) for a in alerts] == [
        (Severity.WARNING, 52, "zero_from_start")
    ]
    assert "exactly 0 since its first value" in alerts[0].message


def test_a_block_of_zeros_from_the_start_says_what_line_by_line_says() -> None:
    import json

    from sentinel.rules import DETECTORS
    from tests.detectors.blockcheck import run

    def only() -> list[NanInfDetector]:
        return [DETECTORS["nan_inf"](NanInfConfig())]  # type: ignore[list-item]

    for losses in ([0.0] * 60, [0.0, 0.0] + [0.5] * 60 + [0.0] * 5):
        texts = [json.dumps({"step": 10 * (i + 1), "loss": v}) for i, v in enumerate(losses)]
        line_by_line = run(only, texts, blocks=False)
        blocks = run(only, texts, blocks=True)
        assert blocks.alerts == line_by_line.alerts
        assert blocks.state == line_by_line.state


def test_a_perplexity_beside_its_loss_leaves_the_incident_to_the_loss() -> None:
    """OpenNMT-py's ``ppl: nan; xent: nan`` (issue #1072 of its repository): one critical,
    named by the loss; a perplexity alone is critical by its own name."""
    detector = NanInfDetector(NanInfConfig())
    line = [Sample("acc", 5.2, 5650), Sample("ppl", NAN, 5650), Sample("loss", NAN, 5650)]
    found = detector.observe_samples(line, "train.log", NOW)
    assert [(a.metric, a.severity) for _, a in found] == [("loss", Severity.CRITICAL)]
    alone = NanInfDetector(NanInfConfig())
    (only,) = feed(alone, [Sample("ppl", 30.0, 1), Sample("ppl", NAN, 2)])
    assert (only.metric, only.severity) == ("ppl", Severity.CRITICAL)


@pytest.mark.parametrize(
    ("name", "severity"),
    [
        ("smoothl1", Severity.CRITICAL),  # GluonCV SSD's box loss, beside its CrossEntropy
        ("crossentropy", Severity.CRITICAL),
        ("eval_logloss", Severity.CRITICAL),
        ("train_mse", Severity.CRITICAL),
        ("accuracy", Severity.WARNING),
        ("mae_best", Severity.WARNING),  # no loss word, and a best-so-far tracker at that
        ("min_l1", Severity.WARNING),
    ],
)
def test_a_loss_functions_name_is_a_loss(name: str, severity: Severity) -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts = feed(detector, [Sample(name, 1.0, 1), Sample(name, math.nan, 2)])
    assert [(alert.severity, alert.step) for alert in alerts] == [(severity, 2)]


@pytest.mark.parametrize(
    ("place", "where"),
    [({"epoch": 1.95}, "at epoch 1.95"), ({}, "at step 12020")],
    ids=["by-its-epoch", "by-its-step"],
)
def test_nan_grad_norms_long_past_the_start_are_no_calibration(
    place: dict[str, float], where: str
) -> None:
    """An excerpt whose every grad-norm is NaN beside a loss stuck at 7.14, at epoch 1.95
    (a real HF run's): no scaler calibrates there, so 3 in a row are a failure, not 20."""
    detector = NanInfDetector(NanInfConfig())
    alerts: list[Alert] = []
    for index in range(3):
        step = 12_000 + index * 10
        values = {"loss": 7.14, "grad_norm": NAN, **place}
        alerts += _line(detector, step, values)
    (alert,) = alerts
    assert (alert.severity, alert.step, alert.onset_step) == (Severity.CRITICAL, 12_020, 12_000)
    assert where in alert.message and "persisted for 3 logged values" in alert.message


def test_nan_grad_norms_at_the_start_are_the_scaler_calibrating() -> None:
    detector = NanInfDetector(NanInfConfig())
    alerts: list[Alert] = []
    for step in range(10, 110, 10):
        alerts += _line(detector, step, {"loss": 7.14, "grad_norm": NAN, "epoch": step / 1000})
    assert alerts == []


def test_a_value_at_no_step_has_a_message_that_names_none() -> None:
    """HF dicts with no progress bar, apex's overflow lines: no step is known, and the
    message said "at step None"."""
    samples = [Sample("loss", value) for value in (2.3, 2.2, 2.1, math.nan)]
    (alert,) = feed(NanInfDetector(NanInfConfig()), samples)
    assert alert.step is None and "step None" not in alert.message
    assert alert.message.startswith("loss is nan")
