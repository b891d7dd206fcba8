"""nan_inf and loss_scale on real fp16 runs: torch's own GradScaler, on CPU
(``tests/fixtures/make_fp16_logs.py``): skipped steps are counted, not alarmed; a blow-up
whose grad-norm goes non-finite while the loss climbs is caught at its first step."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sentinel.config import Settings
from sentinel.engine.replay import replay
from sentinel.model.records import Severity

FP16 = Path(__file__).resolve().parent.parent / "fixtures" / "fp16"


def non_finite_grad_norms(folder: Path) -> list[int]:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [record["step"] for record in records if not math.isfinite(record["grad_norm"])]


def test_a_healthy_fp16_run_with_skipped_steps_raises_nothing() -> None:
    folder = FP16 / "healthy_skips"
    truth = json.loads((folder / "expected.json").read_text())
    assert non_finite_grad_norms(folder) == truth["skipped_steps"]  # 7 at the start, then lone
    result = replay([folder / "metrics.jsonl"], Settings())
    raised = [a for a in result.alerts if a.rule in ("nan_inf", "loss_scale")]
    assert raised == []
    assert result.worst() in (None, Severity.INFO, Severity.WARNING)


def test_a_blow_up_under_the_scaler_is_critical_at_its_first_non_finite_step() -> None:
    folder = FP16 / "lr_blowup"
    result = replay([folder / "metrics.jsonl"], Settings())
    nan = [a for a in result.alerts if a.rule == "nan_inf" and not a.resolves]
    assert nan, [a.message for a in result.alerts]
    first = nan[0]
    assert (first.severity, first.metric, first.step, first.onset_step) == (
        Severity.CRITICAL,
        "grad_norm",
        151,
        151,
    )
    assert "the loss climbed" in first.message
