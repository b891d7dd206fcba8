"""Stable-Baselines3's console tables, from real runs (``tests/fixtures/make_sb3_tables.py``):
each table read whole at its ``time/total_timesteps``, under SB3's own names."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from sentinel.model.records import Sample
from sentinel.parsing import LineParser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sb3"
#: ``|    key   | value   |``: a row as SB3's logger writes it (the test's own reading).
ROW = re.compile(r"^\|( *)(\S+) *\| (\S*) *\|$")


def tables(text: str) -> list[dict[str, str]]:
    """Each table of the console, as {section/key: value}, read here independently."""
    found: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    section = ""
    for line in text.splitlines():
        if line and set(line) == {"-"}:
            if current:
                found.append(current)
                current = None
            else:
                current = {}
            continue
        row = ROW.match(line)
        if row is None or current is None:
            continue
        indent, key, value = row.groups()
        if not value:
            section = key
        else:
            current[(section if indent else "") + key] = value
    return found


def read(lines: list[str]) -> list[Sample]:
    parser = LineParser()
    return [sample for line in lines for sample in parser.parse(line)]


@pytest.mark.parametrize("run", ["ppo_healthy", "a2c_healthy", "dqn_nan"])
def test_every_table_is_read_whole_at_its_total_timesteps(run: str) -> None:
    text = (FIXTURES / run / "console.txt").read_text()
    expected = tables(text)
    assert len(expected) >= 10
    samples = read(text.splitlines())

    by_step: dict[int | None, dict[str, float]] = {}
    for sample in samples:
        by_step.setdefault(sample.step, {})[sample.name] = sample.value
    steps = [int(table["time/total_timesteps"]) for table in expected]
    assert sorted(by_step, key=lambda s: s or 0) == steps
    for table in expected:
        read_back = by_step[int(table["time/total_timesteps"])]
        for key, value in table.items():
            if key == "time/total_timesteps":
                continue
            name = "lr" if key == "train/learning_rate" else key
            if key == "train/explained_variance" and value == "nan":
                assert name not in read_back  # NaN by design: see the next test
                continue
            assert read_back[name] == pytest.approx(float(value), nan_ok=True), (key, table)


def test_a_nan_explained_variance_is_left_out() -> None:
    """SB3's explained_variance is NaN where a rollout's returns are all alike: a healthy
    A2C run logs it ten times."""
    text = (FIXTURES / "a2c_healthy" / "console.txt").read_text()
    nan_tables = [t for t in tables(text) if t.get("train/explained_variance") == "nan"]
    assert len(nan_tables) >= 5
    samples = read(text.splitlines())
    assert all(math.isfinite(s.value) for s in samples)
    assert sum(s.name == "train/explained_variance" for s in samples) == len(tables(text)) - len(
        nan_tables
    )


def test_the_loss_keeps_sb3s_name_and_a_nan_one_is_read() -> None:
    text = (FIXTURES / "dqn_nan" / "console.txt").read_text()
    truth = json.loads((FIXTURES / "dqn_nan" / "expected.json").read_text())
    losses = [s for s in read(text.splitlines()) if s.name == "train/loss"]
    first_nan = next(s for s in losses if math.isnan(s.value))
    assert first_nan.step == truth["first_nan_table_step"]
    assert all(s.name != "loss" for s in read(text.splitlines()))


def test_a_table_cut_at_its_start_gives_the_rows_it_holds() -> None:
    """An excerpt that begins inside a table: the rows after the cut at the step it names;
    those under a section row it cut off under ``sb3/``, never as the training loss."""
    lines = (FIXTURES / "ppo_healthy" / "console.txt").read_text().splitlines()
    dashes = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    first, last = dashes[4], dashes[5]  # the third table
    cut = next(i for i in range(first, last) if "fps" in lines[i])  # under time/, cut off
    (table,) = tables("\n".join(lines[first : last + 1]))
    samples = read(lines[cut : last + 1])
    assert {s.step for s in samples} == {int(table["time/total_timesteps"])}
    shown = {key: value for key, value in table.items() if key.startswith("train/")}
    # The rows of time/ after the cut (fps on): their section row was cut off.
    cut_off = {
        "sb3/" + key.removeprefix("time/"): value
        for key, value in table.items()
        if key.startswith("time/") and key != "time/total_timesteps"
    }
    assert {s.name: s.value for s in samples} == {
        **{("lr" if key == "train/learning_rate" else key): float(v) for key, v in shown.items()},
        **{key: float(v) for key, v in cut_off.items()},
    }


def test_a_nan_loss_in_a_cut_table_is_read_under_sb3() -> None:
    """The excerpt starts after the ``| train/ |`` row of the table whose loss is NaN."""
    parser = LineParser()
    read_back = [
        sample
        for line in [
            "|    loss                 | nan         |",
            "|    total_timesteps | 2048 |",
            "-" * 41,
        ]
        for sample in parser.parse(line)
    ]
    assert [(s.name, s.step, math.isnan(s.value)) for s in read_back] == [("sb3/loss", 2048, True)]


def test_rows_with_no_closing_dashes_are_bounded() -> None:
    """A log of other two-column tables (no dashes under them) never grows the gathered rows
    without bound, and gives no samples."""
    parser = LineParser()
    found = [parser.parse(f"| item_{i} | {i}.5 |") for i in range(2000)]
    assert all(samples == [] for samples in found)
    tail = parser.parse("-" * 30)
    assert 0 < len(tail) <= 256
    assert tail[-1] == Sample("item_1999", 1999.5, None)
