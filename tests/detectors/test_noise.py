"""The run's own noise: ``wobble`` (around a straight trend) and ``bend`` (around one that
bends smoothly), each a robust standard deviation."""

from __future__ import annotations

import random

import pytest

from sentinel.rules.noise import bend, wobble


@pytest.mark.parametrize("count", [5, 6, 8])
def test_a_descent_ever_slower_is_less_noise_to_its_bend_than_to_its_wobble(count: int) -> None:
    """Its steps shrink as it goes: around a straight trend they scatter, around a bending
    one much less (a real Whisper run's first five values: 0.09 against 0.76)."""
    falling = [6.0 * 0.6**index + 1.0 for index in range(count)]
    assert bend(falling) < 0.3 * wobble(falling)
    whisper = [7.672, 3.784, 2.304, 1.624, 1.6]
    assert bend(whisper) < 0.15 * wobble(whisper)


@pytest.mark.parametrize("seed", range(5))
def test_both_take_independent_noise_for_what_it_is(seed: int) -> None:
    rng = random.Random(seed)
    values = [2.0 + 0.1 * rng.gauss(0, 1) for _ in range(400)]
    assert 0.08 < wobble(values) < 0.12
    assert 0.08 < bend(values) < 0.12


def test_bend_needs_five_values() -> None:
    assert bend([3.0, 1.0, 2.0, 5.0]) == 0.0
    assert bend([3.0, 1.0, 2.0, 5.0, 1.0]) > 0.0
