"""Ultralytics' training console: each row at the step whose running means it shows."""

from __future__ import annotations

import math

import pytest

from sentinel.parsing.ultralytics import UltralyticsConsole

HEADER = "Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"


def _whole(step: int, box: float, cls: float, dfl: float) -> list[tuple[str, int, float]]:
    """A whole row's samples: the loss, the sum of its terms, then each term."""
    terms = [("box_loss", step, box), ("cls_loss", step, cls), ("dfl_loss", step, dfl)]
    return [("loss", step, box + cls + dfl), *terms]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(
            "2/3         0G      1.077     0.9391     0.6684         11         64: 25% "
            "━━━───────── 2/8 2.6it/s 0.4s<2.3s",
            _whole(11, 1.077, 0.9391, 0.6684),
            id="own-bar-at-the-next-batch",
        ),
        pytest.param(
            "1/3         0G      1.664      1.247     0.9981          7         64: 0% "
            "──────────── 0/8  0.2s",
            _whole(1, 1.664, 1.247, 0.9981),
            id="count-0-holds-the-first-batch",
        ),
        pytest.param(
            "2/3         0G        nan        nan        nan         12         64: 100% "
            "━━━━━━━━━━━━ 8/8 7.6it/s 1.1s",
            _whole(16, math.nan, math.nan, math.nan),
            id="the-epochs-last-redraw",
        ),
        pytest.param(
            "3/100      2.61G      1.202      1.612      1.238         42        640:  37%|███ "
            "      | 3/8 [00:01<00:01,  3.06it/s]",
            _whole(2 * 8 + 4, 1.202, 1.612, 1.238),
            id="tqdm-bar",
        ),
        pytest.param(
            "2/3         0G        nan     …: 37% ━━━━──────── 3/8 4.8it/s 0.6s<1.0s",
            [("box_loss", 12, math.nan)],
            id="cut-at-80-columns",
        ),
        pytest.param(
            "1/3         0G      1.664      1.247     0.…: 0% ──────────── 0/8  0.3s",
            [("box_loss", 1, 1.664), ("cls_loss", 1, 1.247)],
            id="cut-inside-a-term",
        ),
        pytest.param(
            "1/3         0G      1.331      1.082      0.845          9   …: 100% ━━━━━━━━━━━━ 8/8",
            _whole(8, 1.331, 1.082, 0.845),
            id="cut-after-the-terms",
        ),
        pytest.param("1/3    …: 12% ━─────────── 1/8 2.3it/s", [], id="cut-before-the-terms"),
        pytest.param(
            "Class     Images  Instances      Box(P          R      mAP50 …: 50% ━━━━━━────── 2/4",
            None,
            id="validation",
        ),
        pytest.param("all         32         74          0          0          0", None, id="map"),
    ],
)
def test_rows(line: str, expected: list[tuple[str, int, float]] | None) -> None:
    console = UltralyticsConsole()
    assert console.parse(HEADER) == []
    found = console.parse(line)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert [(s.name, s.step) for s in found] == [(name, step) for name, step, _ in expected]
    assert [s.value for s in found] == pytest.approx([v for *_, v in expected], nan_ok=True)
