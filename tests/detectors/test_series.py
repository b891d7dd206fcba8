"""Rolling window: the kept sorted copy gives the same median as sorting the window."""

from __future__ import annotations

import random
import statistics

import pytest

from sentinel.detectors.series import Rolling


@pytest.mark.parametrize("size", [1, 2, 5, 10, 50], ids=lambda size: f"size-{size}")
def test_median_matches_statistics_over_a_sliding_window(size: int) -> None:
    rng = random.Random(size)
    window = Rolling(size)
    seen: list[float] = []
    for _ in range(300):
        value = rng.choice([rng.gauss(1.0, 0.5), 1.0, 2.0])  # repeats exercise removal
        window.add(value)
        seen.append(value)
        assert window.median() == statistics.median(seen[-size:])
    assert len(window) == size and window.full


def test_non_finite_values_are_ignored_and_clear_empties() -> None:
    window = Rolling(3)
    for value in (1.0, float("nan"), float("inf"), 3.0):
        window.add(value)
    assert (len(window), window.median()) == (2, 2.0)
    window.clear()
    window.add(5.0)
    assert (len(window), window.median()) == (1, 5.0)
