"""YOLOv5's and YOLOv7's ``results.txt``: a row an epoch, fifteen cells, no header."""

from __future__ import annotations

import math

from sentinel.model.records import Sample
from sentinel.parsing import LineParser
from sentinel.parsing.yolo_results import parse_yolo_results

#: Rows of a real YOLOv7 run's results.txt (tests/corpus/failed/yolov7-results-txt-nan-at-epoch-6).
ROW = (
    "     1/149     13.5G   0.02125  0.003635   0.00429   0.02917        10       640    0.7036"
    "    0.5757    0.6115    0.3084   0.05692  0.007475   0.00954"
)
NAN_ROW = (
    "     6/149     13.5G       nan       nan       nan       nan         7       640         0"
    "         0         0         0       nan       nan       nan"
)


def test_a_row_is_read_at_its_epoch_with_its_losses_and_validation() -> None:
    samples = {s.name: s for s in parse_yolo_results(ROW) or []}
    assert {s.step for s in samples.values()} == {1}
    assert samples["loss"].value == 0.02917 and samples["box_loss"].value == 0.02125
    assert samples["map50_95"].value == 0.3084
    assert math.isclose(samples["eval_loss"].value, 0.05692 + 0.007475 + 0.00954)
    assert "labels" not in samples and "img_size" not in samples


def test_a_nan_row_is_a_nan_loss_and_other_lines_are_not_rows() -> None:
    samples = {s.name: s for s in parse_yolo_results(NAN_ROW) or []}
    assert math.isnan(samples["loss"].value) and samples["loss"].step == 6
    assert (
        parse_yolo_results("  3/100  2.61G  1.202  1.612  1.238  42  640:  38%|███▊  | 3/8") is None
    )
    assert parse_yolo_results("     1/149     13.5G   0.02125") is None
    assert LineParser().parse(ROW)[0] == Sample("box_loss", 0.02125, 1)
