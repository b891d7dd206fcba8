"""The bulk helpers the rules' block paths share give what one value at a time gives."""

from __future__ import annotations

import math
import random

import pytest

from sentinel.rules.series import Rolling, judged_mask, longest_run_at_least, rising_steps
from tests.detectors.blockcheck import snapshot

NAN, INF = math.nan, math.inf


def _peak_by_hand(window: Rolling, values: list[float], floor: float) -> float:
    """``max(floor, median)`` after each finite value joins a copy of ``window``, once full."""
    copy = Rolling(window.size)
    copy.extend(list(window.values))
    peak = floor
    for value in values:
        if not math.isfinite(value):
            continue
        copy.add(value)
        if copy.full:
            peak = max(peak, copy.median())
    return peak


def _shaped(shape: str, rng: random.Random, count: int) -> list[float]:
    if shape == "rising":  # the peak is beaten again and again: many windows sorted
        return [1.0 + 0.01 * i + rng.gauss(0, 0.05) for i in range(count)]
    if shape == "falling":
        return [100.0 - 0.01 * i + rng.gauss(0, 0.05) for i in range(count)]
    if shape == "bursts":  # rare high stretches among calm values
        return [rng.gauss(10.0, 1.0) if i % 400 < 15 else rng.gauss(1.0, 0.1) for i in range(count)]
    return [rng.choice([rng.gauss(1.0, 0.5), 2.0, 3.0, NAN, INF]) for _ in range(count)]  # noisy


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["rising", "falling", "bursts", "noisy"], ids=str)
@pytest.mark.parametrize("size", [1, 2, 5, 20], ids=lambda size: f"size-{size}")
@pytest.mark.parametrize("before", ["empty", "partial", "full"], ids=str)
def test_peak_median_is_the_highest_median_adds_reach(shape: str, size: int, before: str) -> None:
    rng = random.Random(f"{shape}{size}{before}")
    window = Rolling(size)
    window.extend(
        _shaped("noisy", rng, {"empty": 0, "partial": size // 2, "full": 3 * size}[before])
    )
    values = _shaped(shape, rng, rng.choice([0, 1, size, 3000]))
    state = snapshot(window)
    for floor in (-INF, 1.5, 1e9):
        assert window.peak_median(values, floor) == _peak_by_hand(window, values, floor)
    assert snapshot(window) == state  # pure: the window is left as it was


def _longest_run(positions: list[int]) -> int:
    longest = run = 0
    for index, position in enumerate(positions):
        run = run + 1 if index and position == positions[index - 1] + 1 else 1
        longest = max(longest, run)
    return longest


@pytest.mark.parametrize("length", [1, 2, 3, 5], ids=lambda length: f"length-{length}")
def test_longest_run_at_least_matches_a_scan(length: int) -> None:
    rng = random.Random(length)
    verdicts = set()
    for _ in range(300):
        odds = rng.choice([0.2, 0.6, 0.9])
        positions = [i for i in range(rng.randint(0, 30)) if rng.random() < odds]
        verdict = longest_run_at_least(positions, length)
        assert verdict is (_longest_run(positions) >= length)
        verdicts.add(verdict)
    assert verdicts == {True, False}


@pytest.mark.parametrize("warmup_steps", [0, 5, 100], ids=lambda steps: f"warmup-{steps}")
@pytest.mark.parametrize("odd_values", [False, True], ids=["finite", "non-finite"])
def test_judged_mask_keeps_what_one_line_at_a_time_judges(
    warmup_steps: int, odd_values: bool
) -> None:
    rng = random.Random(f"{warmup_steps}{odd_values}")
    outcomes = set()
    for _ in range(200):
        first = rng.randint(-20, 120)
        steps = list(range(first, first + rng.randint(0, 30)))
        choices = [1.0, -2.5, 0.0, NAN, INF, -INF] if odd_values else [1.0, -2.5, 0.0, 1e308]
        values = [rng.choice(choices) for _ in steps]
        judged = [
            (not warmup_steps or step >= warmup_steps) and math.isfinite(value)
            for step, value in zip(steps, values, strict=True)
        ]
        mask = judged_mask(values, steps, warmup_steps)
        # None only when every line is judged; a mask may also say so (an overflowing sum).
        assert mask == judged if mask is not None else all(judged)
        outcomes.add(mask is None)
    assert outcomes == {True, False}


def _rising_by_hand(steps: list[int], last_step: int | None) -> list[bool]:
    """Whether each line's step passes every step before it, one line at a time."""
    new = []
    highest = last_step
    for step in steps:
        new.append(highest is None or step > highest)
        highest = step if highest is None else max(highest, step)
    return new


def _steps(shape: str, rng: random.Random) -> list[int]:
    first, count = rng.randint(-5, 50), rng.randint(1, 40)
    if shape == "stride":  # the usual block: evenly spaced steps
        stride = rng.randint(1, 4)
        return list(range(first, first + count * stride, stride))
    if shape == "repeats":  # several lines per step
        return sorted(rng.randint(first, first + count) for _ in range(count))
    if shape == "resume":  # a restart from a checkpoint: steps go back, then rise again
        back = rng.randint(1, count)
        return [*range(first, first + count), *range(first + count - back, first + 2 * count)]
    return [rng.randint(first, first + 10) for _ in range(count)]  # noisy


@pytest.mark.parametrize("shape", ["stride", "repeats", "resume", "noisy"], ids=str)
@pytest.mark.parametrize("before", ["none", "below", "at", "above"], ids=str)
def test_rising_steps_marks_what_one_line_at_a_time_marks(shape: str, before: str) -> None:
    rng = random.Random(f"{shape}{before}")
    for _ in range(200):
        steps = _steps(shape, rng)
        offset = {"none": None, "below": -rng.randint(1, 5), "at": 0, "above": rng.randint(1, 5)}
        shift = offset[before]
        last_step = None if shift is None else steps[0] + shift
        expected = _rising_by_hand(steps, last_step)
        new = rising_steps(steps, last_step)
        # None exactly when every line brings a new step.
        assert new == (None if all(expected) else expected)
