"""Rolling window: the kept sorted copy gives the same median as sorting the window; the
bulk variants replay uses for blocks leave exactly what one call a value leaves."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from sentinel.model.records import Sample
from sentinel.rules.series import (
    LazyRolling,
    Rolling,
    Warmup,
    finite_values,
    finite_with_steps,
    majority_in_every_window,
    never_above,
)
from tests.detectors.blockcheck import snapshot

NAN, INF = math.nan, math.inf


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


# --- bulk variants: a block's column in one call, exactly what one call a value leaves -------

#: Values that try the bulk paths: repeats, both zeros (equal but not the same bits),
#: non-finite values to skip, and a wide spread.
_AWKWARD = [1.0, 2.0, 0.0, -0.0, 2.0, NAN, INF, -INF, 1e300, -3.5, 0.5]


def _series(seed: int, count: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice([*_AWKWARD, rng.gauss(1.0, 0.5)]) for _ in range(count)]


def _chunks(values: list[float], seed: int) -> list[list[float]]:
    """``values`` cut at random places, empty chunks included."""
    rng = random.Random(seed)
    chunks, start = [], 0
    while start < len(values):
        size = rng.choice([0, 1, 3, 16, 40, 200])
        chunks.append(values[start : start + size])
        start += size
    return chunks


@pytest.mark.parametrize("size", [1, 3, 10, 50, 300], ids=lambda size: f"size-{size}")
def test_rolling_extend_leaves_what_adds_leave(size: int) -> None:
    one_by_one, bulk = Rolling(size), Rolling(size)
    values = _series(size, 1500)
    for chunk in _chunks(values, size):
        for value in chunk:
            one_by_one.add(value)
        bulk.extend(chunk)
        assert snapshot(bulk) == snapshot(one_by_one)
        assert bulk.least() == (min(one_by_one.values) if len(one_by_one) else INF)


@pytest.mark.parametrize("size", [1, 4, 30], ids=lambda size: f"size-{size}")
def test_lazy_rolling_extend_leaves_what_adds_leave(size: int) -> None:
    one_by_one, bulk = LazyRolling(size), LazyRolling(size)
    for chunk in _chunks(_series(size + 7, 600), size):
        for value in chunk:
            one_by_one.add(value)
        bulk.extend(chunk)
        assert snapshot(bulk) == snapshot(one_by_one)
        if len(one_by_one):
            assert bulk.median() == one_by_one.median()


def _learning_rates(shape: str) -> list[float]:
    rng = random.Random(shape)
    if shape == "warmup-then-decay":
        return [1e-5 * step for step in range(1, 80)] + [8e-4 * 0.99**step for step in range(80)]
    if shape == "constant":
        return [1e-4] * 50
    if shape == "rising-forever":
        return [1e-6 * step for step in range(1, 120)]
    if shape == "non-finite-in-warmup":
        return [1e-5 * step if step % 7 else rng.choice([NAN, INF]) for step in range(1, 60)]
    return [rng.choice([1e-4, 2e-4, NAN, 3e-4]) for _ in range(100)]  # noisy


@pytest.mark.parametrize(
    "shape",
    ["warmup-then-decay", "constant", "rising-forever", "non-finite-in-warmup", "noisy"],
    ids=str,
)
@pytest.mark.parametrize("seed", [1, 2, 3], ids=lambda seed: f"cuts{seed}")
def test_warmup_extend_leaves_what_observe_leaves(shape: str, seed: int) -> None:
    one_by_one, bulk = Warmup(0), Warmup(0)
    for chunk in _chunks(_learning_rates(shape), seed):
        for rate in chunk:
            one_by_one.observe(Sample("lr", rate, 1))
        bulk.extend(chunk)
        assert snapshot(bulk) == snapshot(one_by_one)


def _actives(warmup: Warmup, steps: list[int], rates: list[float] | None) -> set[bool]:
    """Line by line, whether a metric on each line is in warmup, seen before or after the
    line's learning rate (a block's lines hold both, in either order)."""
    seen: set[bool] = set()
    for index, step in enumerate(steps):
        seen.add(warmup.active(step))
        if rates is not None:
            warmup.observe(Sample("lr", rates[index], step))
        seen.add(warmup.active(step))
    return seen


def _primed(rates: list[float], warmup_steps: int) -> Warmup:
    warmup = Warmup(warmup_steps)
    warmup.extend(rates)
    return warmup


@pytest.mark.parametrize(
    ("before", "warmup_steps", "steps", "rates", "expected"),
    [
        ([1e-4, 5e-5], 0, list(range(100, 140)), [5e-5] * 40, False),
        ([1e-4, 5e-5], 120, list(range(100, 140)), None, None),
        ([1e-4, 5e-5], 140, list(range(100, 140)), None, True),
        ([1e-4, 5e-5], 139, list(range(100, 140)), None, None),
        ([1e-5, 2e-5], 0, list(range(3, 43)), [3e-5 + 1e-6 * i for i in range(40)], True),
        ([1e-5, 2e-5], 0, list(range(3, 43)), [3e-5 + 1e-6 * i for i in range(39)] + [2e-5], None),
        ([1e-5, 2e-5], 0, list(range(3, 43)), [2e-5] + [3e-5 + 1e-6 * i for i in range(39)], None),
        ([1e-5, 2e-5], 0, list(range(3, 43)), None, True),
        ([], 0, list(range(1, 41)), [1e-4] * 40, None),
        ([], 0, list(range(1, 41)), None, False),
        ([], 50, list(range(1, 41)), [1e-4] * 40, True),
        ([1e-5, 2e-5], 0, list(range(3, 43)), [3e-5] * 20 + [NAN] + [3e-5] * 19, None),
    ],
    ids=[
        "decaying-lr-past-warmup-steps",
        "warmup-steps-end-inside",
        "all-before-warmup-steps",
        "last-line-at-warmup-steps",
        "lr-still-rising-throughout",
        "lr-falls-on-the-last-line",
        "lr-falls-on-the-first-line",
        "lr-rising-and-no-lr-column",
        "lr-not-yet-learned",
        "no-lr-at-all",
        "lr-not-learned-but-all-before-warmup-steps",
        "nan-lr-in-a-rising-warmup",
    ],
)
def test_block_phase_is_what_line_by_line_finds(
    before: list[float],
    warmup_steps: int,
    steps: list[int],
    rates: list[float] | None,
    expected: bool | None,
) -> None:
    warmup = _primed(before, warmup_steps)
    state = snapshot(warmup)
    phase = warmup.block_phase((min(steps), max(steps)), rates)
    assert phase is expected
    assert snapshot(warmup) == state  # pure
    if phase is not None:
        assert _actives(warmup, steps, rates) == {phase}


def _twice(baseline: float) -> float:
    """A bar that rises with the baseline: twice it."""
    return 2.0 * baseline


def _never_above_by_hand(values: list[float], factor: float, prior: float, start: int) -> bool:
    return all(
        values[index] <= factor * min([prior, *values[:index]])
        for index in range(start, len(values))
    )


@pytest.mark.parametrize("seed", range(6), ids=lambda seed: f"seed{seed}")
def test_never_above_is_sound(seed: int) -> None:
    rng = random.Random(seed)
    accepted = 0
    for _ in range(300):
        values = [rng.choice([1.0, 2.0, 0.5, 1.5, -1.0, 0.0]) * rng.uniform(0.9, 1.1)]
        values += [values[-1] * rng.uniform(0.6, 1.6) for _ in range(rng.randint(0, 30))]
        prior, start = rng.choice([INF, 1.0, 0.8, -2.0]), rng.randint(0, 5)
        if never_above(values, _twice, prior, start):
            accepted += 1
            assert _never_above_by_hand(values, 2.0, prior, start)
    assert accepted > 50  # the proof is not vacuous


@pytest.mark.parametrize(
    ("values", "prior", "start", "expected"),
    [
        ([3.0, 2.0, 4.0], 2.5, 0, True),
        ([3.0, 2.0, math.nextafter(4.0, INF)], 2.5, 0, False),
        ([9.0, 2.0, 4.0], INF, 1, True),
        ([9.0, 2.0, 4.0], 2.0, 0, False),
        ([8.0, 6.0, 5.0, 3.0], 4.0, 0, True),
        ([1.0, 2.0], -1e301, 0, False),
    ],
    ids=[
        "exactly-factor-times-the-least",
        "just-above",
        "unjudged-head-is-free",
        "judged-head-against-the-prior-window",
        "falling-series-judged-against-its-own-past",
        "huge-negative-refused",
    ],
)
def test_never_above_at_its_edges(
    values: list[float], prior: float, start: int, expected: bool
) -> None:
    assert never_above(values, _twice, prior, start) is expected


def _majority_by_hand(flags: list[bool], size: int, start: int) -> bool:
    for end in range(start, len(flags)):
        run = flags[max(0, end + 1 - size) : end + 1]
        enough = len(run) if len(run) < size else size // 2 + 1
        if sum(run) < enough:
            return False
    return True


@pytest.mark.parametrize("size", [1, 2, 5, 10], ids=lambda size: f"size-{size}")
def test_majority_in_every_window_is_exact(size: int) -> None:
    rng = random.Random(size)
    verdicts = set()
    for _ in range(400):
        odds = rng.choice([0.3, 0.7, 0.9, 1.0])
        flags = [rng.random() < odds for _ in range(rng.randint(0, 40))]
        start = rng.randint(0, 12)
        verdict = majority_in_every_window(flags, size, start)
        assert verdict is _majority_by_hand(flags, size, start)
        verdicts.add(verdict)
    assert verdicts == {True, False}


def test_finite_values_keeps_the_list_when_all_are_finite() -> None:
    calm = [1.0, 2.0]
    assert finite_values(calm) is calm
    huge = [1.0, 1e308, 1e308]  # the sum overflows: filtered, every value kept
    assert finite_values(huge) == huge
    assert finite_with_steps([1.0, NAN, 3.0, -INF], [5, 6, 7, 8]) == ([1.0, 3.0], [5, 7])
