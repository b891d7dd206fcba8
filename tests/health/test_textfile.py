"""The node_exporter textfile: written whole (temp file, then rename), readable by
prometheus_client's parser, and a failure that is reported, never raised."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sentinel.service.metrics import Metrics


def test_write_textfile_is_whole_and_parses(tmp_path: Path) -> None:
    metrics = Metrics(job_name="run", host="h", mode="run")
    metrics.sample("loss", math.nan, step=3, now=50.0)
    path = tmp_path / "sentinel.prom"
    path.write_text("stale\n")
    assert metrics.write_textfile(str(path))
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert families["sentinel_training_step"].samples[0].value == 3
    nonfinite = families["sentinel_nonfinite_values"].samples
    assert any(s.labels == {"metric": "loss"} and s.value == 1 for s in nonfinite)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sentinel.prom"]  # no temp left


def test_write_textfile_failure_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    path = tmp_path / "missing" / "sentinel.prom"
    with caplog.at_level(logging.INFO, logger="sentinel.service.metrics"):
        assert not metrics.write_textfile(str(path))
        assert not metrics.write_textfile(str(path))
        path.parent.mkdir()
        assert metrics.write_textfile(str(path))
    messages = [record.getMessage() for record in caplog.records]
    assert sum("cannot write the metrics textfile" in m for m in messages) == 1
    assert any("written again" in m for m in messages)
    assert path.is_file()
