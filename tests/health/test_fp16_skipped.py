"""Skipped fp16 steps are counted, not alarmed (issue 22.5): the rules count them, ``/metrics``
shows them as ``sentinel_fp16_skipped_steps``."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from sentinel.model.records import Sample
from sentinel.rules.loss_scale import LossScaleConfig, LossScaleDetector
from sentinel.rules.nan_inf import NanInfConfig, NanInfDetector
from sentinel.rules.skipped import skipped_steps
from sentinel.service.metrics import Metrics

NOW = 1_700_000_000.0


def gauge(metrics: Metrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name}")


def test_the_rules_count_the_skipped_steps_and_metrics_show_them() -> None:
    nan_inf = NanInfDetector(NanInfConfig())
    loss_scale = LossScaleDetector(LossScaleConfig())
    grads = [1.0] * 8 + [math.inf] + [1.0] * 8 + [math.nan] + [1.0] * 8
    for step, grad in enumerate(grads, start=1):
        line = [Sample("loss", 1.5, step), Sample("grad_norm", grad, step)]
        assert nan_inf.observe_samples(line, "train.log", NOW) == []
    loss_scale.output_text(
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096, reducing to 2048",
        "train.log",
        NOW,
    )
    assert skipped_steps([nan_inf, loss_scale]) == 2  # the larger count: one job, one scaler
    assert skipped_steps([loss_scale]) == 1
    assert skipped_steps([]) == 0

    metrics = Metrics()
    assert b"sentinel_fp16_skipped_steps" not in metrics.exposition()  # nothing counted yet
    metrics.fp16_skipped_steps(0)
    assert gauge(metrics, "sentinel_fp16_skipped_steps") == 0
    metrics.fp16_skipped_steps(skipped_steps([nan_inf, loss_scale]))
    assert gauge(metrics, "sentinel_fp16_skipped_steps") == 2
