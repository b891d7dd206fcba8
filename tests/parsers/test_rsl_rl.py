"""RSL-RL's console blocks, from real runs (``tests/fixtures/make_rsl_rl_console.py``): each
line of a block read at the iteration its bold head names, under names that are no
training loss."""

from __future__ import annotations

import re
from pathlib import Path

from sentinel.model.records import Sample
from sentinel.parsing import LineParser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rsl_rl"
#: The test's own reading of a 5.x block: its head, and the lines it checks.
HEAD = re.compile(r"Learning iteration (\d+)/\d+")
CHECKED = {
    "Total steps": "total_steps",
    "Steps per second": "steps_per_second",
    "Mean value loss": "value_loss",
    "Mean surrogate loss": "surrogate_loss",
    "Mean entropy loss": "entropy_loss",
    "Mean reward": "reward",
    "Mean episode length": "episode_length",
    "Mean action std": "action_std",
}


def blocks(text: str) -> dict[int, dict[str, float]]:
    found: dict[int, dict[str, float]] = {}
    current: dict[str, float] | None = None
    for line in text.splitlines():
        head = HEAD.search(line)
        if head:
            current = found.setdefault(int(head.group(1)), {})
            continue
        name, _, value = line.strip().partition(": ")
        if current is not None and name in CHECKED:
            current[CHECKED[name]] = float(value)
    return found


def read(lines: list[str]) -> list[Sample]:
    parser = LineParser()
    return [sample for line in lines for sample in parser.parse(line)]


def test_every_block_is_read_at_its_iteration() -> None:
    text = (FIXTURES / "healthy" / "console.txt").read_text()
    expected = blocks(text)
    assert sorted(expected) == list(range(120))
    read_back: dict[int | None, dict[str, float]] = {}
    for sample in read(text.splitlines()):
        read_back.setdefault(sample.step, {})[sample.name] = sample.value
    assert sorted(read_back, key=lambda s: -1 if s is None else s) == sorted(expected)
    for iteration, values in expected.items():
        assert {k: v for k, v in read_back[iteration].items() if k in values} == values


def test_no_value_is_a_training_loss_and_the_model_print_is_no_metric() -> None:
    """The value loss of a healthy run jumps a thousandfold as resets bring new states: it
    is the value function's, never ``loss``; the model's printed layers are no metrics."""
    text = (FIXTURES / "healthy" / "console.txt").read_text()
    samples = read(text.splitlines())
    names = {s.name for s in samples}
    assert "loss" not in names
    assert not names & {"in_features", "out_features"}
    values = [s.value for s in samples if s.name == "value_loss"]
    assert max(values[60:]) > 1000 * min(values[60:]), "the healthy run's own jumps"


#: A block as rsl_rl 2.x's runner prints it (its format strings; legged_gym's 1.x prints
#: ``Value function loss`` and ``Surrogate loss``), with a NaN value loss.
OLDER = """\
################################################################################
\x1b[1m                       Learning iteration 7/1500                        \x1b[0m

                       Computation: 4466 steps/s (collection: 4.125s, learning 1.378s)
          Mean value_function loss: nan
               Mean surrogate loss: -0.0032
             Mean action noise std: 1.00
                       Mean reward: 0.08
               Mean episode length: 21.67
      Mean episode rew_action_rate: -0.0006
--------------------------------------------------------------------------------
                   Total timesteps: 196608
                    Iteration time: 5.50s
                        Total time: 44.00s
                               ETA: 8254.0s
"""


def test_an_older_releases_block_is_read_under_the_same_names() -> None:
    samples = read(OLDER.splitlines())
    assert {s.step for s in samples} == {7}
    values = {s.name: s.value for s in samples}
    assert values.keys() == {
        "steps_per_second",
        "value_loss",
        "surrogate_loss",
        "action_noise_std",
        "reward",
        "episode_length",
        "episode/rew_action_rate",
        "total_steps",
    }
    assert values["steps_per_second"] == 4466
    assert values["value_loss"] != values["value_loss"]  # nan, read as such


def test_lines_after_a_block_are_not_read_at_its_iteration() -> None:
    """The block ends at its ETA line: what the job prints next is not the block's."""
    parser = LineParser()
    for line in OLDER.splitlines():
        parser.parse(line)
    assert parser.parse("Mean reward: 3.5") == [Sample("reward", 3.5, None)]


def test_the_head_without_colours_is_read_too() -> None:
    parser = LineParser()
    assert parser.parse("Learning iteration 7/1500") == []
    assert parser.parse("Mean surrogate loss: 0.5") == [Sample("surrogate_loss", 0.5, 7)]


def test_an_excerpt_that_starts_inside_a_block_reads_its_losses_by_their_names() -> None:
    """The lines before the first head: no step yet, and never the training loss."""
    lines = (FIXTURES / "healthy" / "console.txt").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if "Learning iteration 5/" in line)
    cut = next(i for i in range(head, len(lines)) if "Mean value loss" in lines[i])
    parser = LineParser()
    before = [s for line in lines[cut : cut + 3] for s in parser.parse(line)]
    assert [(s.name, s.step) for s in before] == [
        ("value_loss", None),
        ("surrogate_loss", None),
        ("entropy_loss", None),
    ]
    assert LineParser().parse("Mean train loss: 0.4") == [Sample("loss", 0.4, None)]
